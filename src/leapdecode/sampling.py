"""Sampling settings and the target distribution they induce (temperature, top-k, top-p, min-p), as HF applies them.

Whatever samples a token (plain sampling, or speculative sampling's target distribution) draws from `probabilities`,
so a filter here is exact under speculation too: the distribution sampled is the filtered one."""

from __future__ import annotations

import secrets
from dataclasses import dataclass

import torch

from .errors import require


@dataclass(frozen=True)
class SamplingConfig:
    """temperature 0 means greedy decoding; otherwise sample from softmax(logits / T) restricted by top-k, top-p and
    min-p (tokens less likely than min_p times the most likely one are dropped)."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    min_p: float = 0.0

    def __post_init__(self) -> None:
        require(self.temperature >= 0, f"temperature must be >= 0, got {self.temperature}")
        require(0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}")
        require(self.top_k >= 0, f"top_k must be >= 0, got {self.top_k}")
        require(0 <= self.min_p <= 1, f"min_p must be in [0, 1], got {self.min_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def request_seed(self) -> int:
        """The seed of one request: `seed`, or a fresh random one."""
        return self.seed if self.seed is not None else secrets.randbits(62)


def generator_at(seed: int, position: int, stream: int = 0) -> torch.Generator:
    """The randomness of output position `position` of a request (`stream` 1 is the drafter's). Keyed by position,
    not drawn in sequence, so the draws that decide a token do not depend on how many tokens were drafted before."""
    return torch.Generator().manual_seed(hash((seed, position, stream)) & (2**63 - 1))


def probabilities(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """Rows of `logits` [n, V] → the distribution sampling draws from (fp32), after temperature, top-k, top-p, min-p
    (HF's order of its warpers)."""
    logits = logits.float() / cfg.temperature
    if cfg.top_k and cfg.top_k < logits.shape[-1]:
        kth = torch.topk(logits, cfg.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if cfg.top_p < 1:
        # HF's TopPLogitsWarper step for step (ascending sort, drop while the cumulative mass <= 1 - top_p, keep the
        # most likely token): among tokens tied at the boundary, the same ones survive as in HF `generate`
        sorted_logits, order = torch.sort(logits, dim=-1, descending=False)
        drop_sorted = sorted_logits.softmax(-1).cumsum(-1) <= (1 - cfg.top_p)
        drop_sorted[..., -1:] = False
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    if cfg.min_p > 0:
        # HF's MinPLogitsWarper: drop tokens whose probability is below min_p times the top one's (the top one stays)
        probs = logits.softmax(-1)
        logits = logits.masked_fill(probs < cfg.min_p * probs.amax(-1, keepdim=True), float("-inf"))
    return logits.softmax(-1)
