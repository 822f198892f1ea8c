"""A small language model drafts k tokens autoregressively with its own KV cache (Leviathan et al. 2023).

Drafting stops early when the draft model's most likely token falls under a confidence threshold (in the spirit of
PEARL/DEL's adaptive draft length): an unsure drafter wastes verification positions. The decision uses only the
draft distribution, before sampling, so speculative sampling stays exact."""

from __future__ import annotations

import torch

from ..errors import require
from ..runner import Runner
from ..sampling import SamplingConfig, generator_at, probabilities
from .base import Draft, Drafter


class DraftModelDrafter(Drafter):
    name = "draft-model"

    def __init__(self, model: torch.nn.Module, confidence: float = 0.3):
        require(0 <= confidence < 1, f"draft confidence threshold must be in [0, 1), got {confidence}")
        self.runner = Runner(model)
        self.confidence = confidence
        self.fed: list[int] = []  # tokens whose keys/values sit in the draft model's cache
        self.sampling = SamplingConfig()
        self.generator: torch.Generator | None = None

    def start(self, prompt_ids: list[int], sampling: SamplingConfig) -> None:
        """Prefill the prompt here, so that the time of each draft (which the controller weighs) is drafting only."""
        self.sampling = sampling
        self.generator = None if sampling.greedy else generator_at(sampling.seed, 0, stream=1)
        self.runner.prefill(prompt_ids)
        self.fed = list(prompt_ids)

    @torch.inference_mode()
    def propose(self, context: list[int], k: int) -> Draft:
        tokens: list[int] = []
        dists: list[torch.Tensor] = []
        logits = self._catch_up(context) if k > 0 else None
        for i in range(k):
            q = logits.float().softmax(-1) if self.sampling.greedy else probabilities(logits[None], self.sampling)[0]
            if q.max() < self.confidence:
                break
            token = int(q.argmax()) if self.sampling.greedy else int(torch.multinomial(q, 1, generator=self.generator))
            tokens.append(token)
            dists.append(q)
            if i + 1 < k:
                logits = self.runner.forward([token], last_only=True)[-1]
                self.fed.append(token)
        probs = torch.stack(dists) if dists and not self.sampling.greedy else None
        return Draft(tokens, probs)

    def _catch_up(self, context: list[int]) -> torch.Tensor:
        """Bring the draft cache to `context` (drop its rejected guesses, feed what it missed); return next logits."""
        common = 0
        for a, b in zip(self.fed, context):
            if a != b:
                break
            common += 1
        if common == 0:
            self.fed = list(context)
            return self.runner.prefill(context)
        common = min(common, len(context) - 1)  # at least one token must be fed to get logits
        self.runner.rollback(len(self.fed) - common)
        logits = self.runner.forward(context[common:], last_only=True)[-1]
        self.fed = list(context)
        return logits
