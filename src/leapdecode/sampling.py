"""Sampling settings and the target distribution they induce (temperature, top-k, top-p, min-p), as HF applies them.

Whatever samples a token (plain sampling, or speculative sampling's target distribution) draws from `probabilities`,
so a filter here is exact under speculation too: the distribution sampled is the filtered one."""

from __future__ import annotations

import secrets
from dataclasses import dataclass

import numpy as np
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
        logits = logits.masked_fill(top_p_drop(logits, cfg.top_p), float("-inf"))
    if cfg.min_p > 0:
        # HF's MinPLogitsWarper: drop tokens whose probability is below min_p times the top one's (the top one stays)
        probs = logits.softmax(-1)
        logits = logits.masked_fill(probs < cfg.min_p * probs.amax(-1, keepdim=True), float("-inf"))
    return logits.softmax(-1)


# top-p's fast route: candidates are the tokens above the k-th largest logit, k from FIRST_CANDIDATES up by 4x while
# at most a quarter of the vocabulary; a cut within BOUNDARY_MARGIN of 1 - top_p goes the sorted route
FIRST_CANDIDATES = 64
BOUNDARY_MARGIN = 1e-5


def top_p_drop(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """The tokens HF's TopPLogitsWarper drops from rows of `logits` [n, V] (already divided by the temperature): in
    ascending order, every token while the cumulative probability is <= 1 - top_p; the most likely one always stays.

    A CPU sorts a whole vocabulary slowly, and the nucleus is usually a few hundred tokens: so each row first tries
    `_top_p_drop_fast`, which sorts only the tokens above a cut that holds less than 1 - top_p of the mass (all
    dropped whatever their order). It gives the set of the full sort or declines (a boundary inside a group of tied
    logits, whose members the full sort orders arbitrarily, or one within rounding of 1 - top_p); the row then goes
    through the full sort, as HF does it. Rows on an accelerator take the full sort, which is fast there."""
    if logits.device.type != "cpu":
        return _top_p_drop_sorted(logits, top_p)
    probs = logits.softmax(-1)
    totals = probs.sum(-1, dtype=torch.float64).tolist()
    rows = []
    for row in range(logits.shape[0]):
        fast = _top_p_drop_fast(logits[row], probs[row], totals[row], 1 - top_p)
        rows.append(fast if fast is not None else _top_p_drop_sorted(logits[row : row + 1], top_p)[0])
    return torch.stack(rows)


def _top_p_drop_sorted(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    # HF's TopPLogitsWarper step for step: among tokens tied at the boundary, the same ones survive as in HF `generate`
    sorted_logits, order = torch.sort(logits, dim=-1, descending=False)
    drop_sorted = sorted_logits.softmax(-1).cumsum(-1) <= (1 - top_p)
    drop_sorted[..., -1:] = False
    return drop_sorted.scatter(-1, order, drop_sorted)


def _top_p_drop_fast(row: torch.Tensor, probs: torch.Tensor, total: float, budget: float) -> torch.Tensor | None:
    """One row's dropped tokens from its candidates alone (see top_p_drop), or None where only the full sort can say.
    `total`: the row's probabilities summed. The candidates' arithmetic runs in NumPy: a few hundred numbers, where
    torch's per-call overhead would be most of the time."""
    vocab = row.shape[0]
    k = FIRST_CANDIDATES
    while True:
        if k > vocab // 4:
            return None
        values, index = (t.numpy() for t in torch.topk(row, k))  # descending
        above = int((values > values[-1]).sum())  # the candidates: every token above the k-th largest logit
        candidate_probs = probs.numpy()[index[:above]].astype(np.float64)
        below_mass = total - float(candidate_probs.sum())
        if below_mass < budget - BOUNDARY_MARGIN:  # every token at or under the cut is dropped, whatever their order
            break
        k *= 4
    values, index = values[:above][::-1], index[:above][::-1]  # ascending
    cumulative = below_mass + np.cumsum(candidate_probs[::-1])
    dropped = min(int(np.count_nonzero(cumulative <= budget)), above - 1)  # cumulative rises: the dropped: a prefix
    if dropped and abs(cumulative[dropped - 1] - budget) < BOUNDARY_MARGIN:
        return None
    if abs(cumulative[dropped] - budget) < BOUNDARY_MARGIN:
        return None
    if dropped and values[dropped - 1] == values[dropped]:  # a tie across the boundary: the full sort's order decides
        return None
    drop = torch.ones(vocab, dtype=torch.bool)
    drop[torch.from_numpy(index[dropped:].copy())] = False
    return drop
