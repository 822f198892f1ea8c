"""LLaDA baseline: a fixed number of steps per block; each step commits the k most confident masked positions
(low-confidence remasking), k = remaining masks / remaining steps. steps = gen length is one token per forward."""

from __future__ import annotations

from ...errors import require
from ..loop import Commit, StepView
from .base import Decoder, top_k_mask


class FixedStepsDecoder(Decoder):
    name = "fixed_steps"

    def __init__(self, steps: int | None = None, tokens_per_step: int | None = None) -> None:
        require(steps is None or steps > 0, f"steps must be positive, got {steps}")
        require(
            tokens_per_step is None or tokens_per_step > 0, f"tokens per step must be positive, got {tokens_per_step}"
        )
        self.steps, self.tokens_per_step = steps, tokens_per_step

    def _steps_per_block(self, view: StepView) -> int:
        n_blocks = -(-view.gen_len // view.block_len)
        if self.steps is not None:
            return max(1, -(-self.steps // n_blocks))
        return max(1, -(-view.block_len // (self.tokens_per_step or 1)))

    def select(self, view: StepView) -> Commit:
        left = (self._steps_per_block(view) - view.block_step).clamp(min=1)
        k = -(-view.block_masked // left)  # ceil: finish the block within its step budget
        return Commit(top_k_mask(view.confidence, view.eligible, k))

    def describe(self) -> str:
        return f"fixed_steps(steps={self.steps})" if self.steps else f"fixed_steps(k={self.tokens_per_step or 1})"
