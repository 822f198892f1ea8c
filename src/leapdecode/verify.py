"""Verification rules: which drafted tokens the target accepts, plus the one token the target adds itself.

Both return the list of new tokens for this step: the accepted draft prefix followed by one target token.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch


def greedy_accept(draft: torch.Tensor, target_logits: torch.Tensor) -> list[int]:
    """Longest draft prefix equal to the target's argmax, then the target's argmax after it.

    draft: [k] token ids; target_logits: [k+1, V] logits at the positions that predict draft[0..k-1] and the next one.
    The result is exactly what k+1 steps of plain greedy decoding would emit.
    """
    return greedy_accept_ids(draft.tolist(), argmax_rows(target_logits))


def argmax_rows(logits: torch.Tensor) -> list[int]:
    """The argmax of each row of [rows, V] logits, the first index on a tie (as torch's). fp32 rows on the CPU go
    through NumPy's vectorised scan: torch's CPU argmax reads a large vocabulary's row far slower, a visible share of
    a small model's decode step (docs/benchmarks.md)."""
    if logits.dtype == torch.float32 and logits.device.type == "cpu":
        return np.argmax(logits.detach().numpy(), axis=-1).tolist()
    return logits.argmax(-1).tolist()


def greedy_accept_ids(draft: list[int], target: list[int]) -> list[int]:
    """greedy_accept on the target's argmax ids (target[i]: the argmax of row i), for callers that take the argmax of
    many sequences' rows in one call (the engine's step)."""
    n = 0
    while n < len(draft) and draft[n] == target[n]:
        n += 1
    return target[: n + 1]


def speculative_accept(
    draft: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    generators: Sequence[torch.Generator],
) -> list[int]:
    """Speculative sampling (Leviathan et al. 2023; Chen et al. 2023): the output follows the target distribution exactly.

    Accept draft[i] with probability min(1, p_i(x)/q_i(x)); at the first rejection draw from the normalised residual
    max(p_i - q_i, 0); if all k are accepted draw one more token from p_k. Row i draws only from generators[i]
    (one per output position, see `sampling.generator_at`).

    draft_probs=None means a deterministic drafter (q is one-hot on the drafted token): then the rule is to accept x
    with probability p_i(x), else draw from p_i without x. It is realised as "draw y_i from p_i; accept while
    y_i == draft[i]; emit the first differing y_i" — the same law, and each emitted token is exactly the one plain
    sampling draws at that position, so seeded output does not depend on the draft length.
    """
    k = draft.shape[0]
    tokens = draft.tolist()
    for i in range(k):
        if draft_probs is None:
            y = _sample(target_probs[i], generators[i])
            if y != tokens[i]:
                return tokens[:i] + [y]
            continue
        p_x, q_x = target_probs[i, tokens[i]], draft_probs[i, tokens[i]]
        if torch.rand((), generator=generators[i]) * q_x < p_x:
            continue
        residual = (target_probs[i] - draft_probs[i]).clamp_min(0)
        if residual.sum() <= 0:  # p == q up to rounding: rejection had probability ~0, fall back to p
            residual = target_probs[i]
        return tokens[:i] + [_sample(residual, generators[i])]
    return tokens + [_sample(target_probs[k], generators[k])]


def _sample(weights: torch.Tensor, generator: torch.Generator) -> int:
    """One draw from the (unnormalised) weights by the inverse of their cumulative sum: the first token whose running
    total (float64) exceeds u times the whole, u ~ U[0, 1) from `generator`. One uniform a draw, where the Gumbel-max
    trick draws noise and takes logarithms for the whole vocabulary, a visible share of a small model's step. A token
    of weight 0 adds nothing to the running total, so it is never drawn."""
    cumulative = weights.detach().double().cumsum(0)
    u = torch.rand((), generator=generator, dtype=torch.float64)
    index = int(torch.searchsorted(cumulative, u * cumulative[-1], right=True))
    if index >= len(cumulative):  # u * total rounded up to the total: the last token of positive weight
        index = int(torch.nonzero(weights > 0)[-1])
    return index
