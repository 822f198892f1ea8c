"""A small language model drafts k tokens autoregressively with its own KV cache (Leviathan et al. 2023).

Drafting stops early when the draft model's most likely token falls under a confidence threshold (in the spirit of
PEARL/DEL's adaptive draft length): an unsure drafter wastes verification positions. The decision uses only the
draft distribution, before sampling, so speculative sampling stays exact.

`lookup` adds prompt lookup (the last 2 or 3 tokens found earlier in the request; what followed them is copied):
"first" starts the draft with a copy and lets the draft model, fed it, continue to k (a copy costs nothing, every
token the draft model writes costs a forward of it); "after" lets the draft model write first and fills the rest of
k with a copy where it stops unsure (the copy never displaces a token the draft model was sure of). Copied tokens are
deterministic proposals (q one-hot), which speculative sampling verifies exactly like sampled ones. The default,
"after", was chosen on the dev split (docs/benchmarks.md)."""

from __future__ import annotations

import torch
from torch.nn.functional import one_hot

from ..errors import require
from ..runner import Runner
from ..sampling import SamplingConfig, generator_at, probabilities
from .base import Draft, Drafter
from .prompt_lookup import PromptLookupDrafter

LOOKUP = ("off", "first", "after")


class DraftModelDrafter(Drafter):
    name = "draft-model"

    def __init__(self, model: torch.nn.Module, confidence: float = 0.3, lookup: str = "after"):
        require(0 <= confidence < 1, f"draft confidence threshold must be in [0, 1), got {confidence}")
        require(lookup in LOOKUP, f"draft-model lookup must be one of {', '.join(LOOKUP)}, got {lookup!r}")
        self.runner = Runner(model)
        self.confidence = confidence
        self.lookup = lookup
        self.copier = PromptLookupDrafter(max_ngram=3, min_ngram=2)
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
        if k == 0:
            return Draft([])
        tokens = list(self.copier.propose(context, k).tokens) if self.lookup == "first" else []  # EMPTY is shared
        if len(tokens) == k:
            return Draft(tokens)
        dists: list[torch.Tensor | None] = [None] * len(tokens)  # None: a copied token (q one-hot)
        logits = self._catch_up(context + tokens)
        for i in range(len(tokens), k):
            q = logits.float().softmax(-1) if self.sampling.greedy else probabilities(logits[None], self.sampling)[0]
            if q.max() < self.confidence:
                break
            token = int(q.argmax()) if self.sampling.greedy else int(torch.multinomial(q, 1, generator=self.generator))
            tokens.append(token)
            dists.append(q)
            if i + 1 < k:
                logits = self.runner.forward([token], last_only=True)[-1]
                self.fed.append(token)
        if self.lookup == "after" and len(tokens) < k:
            copied = self.copier.propose(context + tokens, k - len(tokens)).tokens
            tokens += copied
            dists += [None] * len(copied)
        sampled = [q for q in dists if q is not None]
        if self.sampling.greedy or not sampled:
            return Draft(tokens)
        vocab = sampled[0].shape[-1]
        rows = [q if q is not None else one_hot(torch.tensor(t), vocab).float() for t, q in zip(tokens, dists)]
        return Draft(tokens, torch.stack(rows))

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
