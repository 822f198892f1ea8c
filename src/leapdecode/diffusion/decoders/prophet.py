"""Prophet (early answer convergence): decode like the baseline, but once the top-2 logit gap of every remaining
masked position in the block is large, commit all of them in this forward ("go all in")."""

from __future__ import annotations

import torch

from ...errors import require
from ..loop import Commit, StepView
from .base import Decoder, top_k_mask


class ProphetDecoder(Decoder):
    name = "prophet"

    def __init__(
        self, gaps: tuple[float, float, float] = (7.5, 5.0, 2.5), scale: float = 1.0, tokens_per_step: int = 1
    ) -> None:
        require(scale > 0, f"prophet gap scale must be positive, got {scale}")
        require(tokens_per_step > 0, f"tokens per step must be positive, got {tokens_per_step}")
        self.gaps, self.scale, self.tokens_per_step = gaps, scale, tokens_per_step

    def select(self, view: StepView) -> Commit:
        top2 = view.logits.topk(2, dim=-1).values
        gap = torch.where(view.eligible, top2[..., 0] - top2[..., 1], torch.full_like(top2[..., 0], float("inf")))
        done = 1 - view.masked.sum(1).float() / view.gen_len  # answer progress decides how bold to be
        need = torch.tensor(self.gaps)[torch.bucketize(done, torch.tensor([1 / 3, 2 / 3]))] * self.scale
        all_in = gap.min(1).values >= need
        k = torch.full_like(view.block_masked, self.tokens_per_step)
        step = top_k_mask(view.confidence, view.eligible, k)
        return Commit(torch.where(all_in.unsqueeze(1), view.eligible, step))

    def describe(self) -> str:
        return f"prophet(x{self.scale:g})"
