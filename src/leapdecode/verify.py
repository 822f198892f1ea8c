"""Verification rules: which drafted tokens the target accepts, plus the one token the target adds itself.

Both return the list of new tokens for this step: the accepted draft prefix followed by one target token.
"""
from __future__ import annotations

import torch


def greedy_accept(draft: torch.Tensor, target_logits: torch.Tensor) -> list[int]:
    """Longest draft prefix equal to the target's argmax, then the target's argmax after it.

    draft: [k] token ids; target_logits: [k+1, V] logits at the positions that predict draft[0..k-1] and the next one.
    The result is exactly what k+1 steps of plain greedy decoding would emit.
    """
    target = target_logits.argmax(-1)
    k = draft.shape[0]
    n = int((draft == target[:k]).cumprod(0).sum()) if k else 0
    return target[: n + 1].tolist()


def speculative_accept(
    draft: torch.Tensor,
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    generator: torch.Generator,
) -> list[int]:
    """Speculative sampling (Leviathan et al. 2023; Chen et al. 2023): the output follows the target distribution exactly.

    Accept draft[i] with probability min(1, p_i(x)/q_i(x)); at the first rejection draw from the normalised residual
    max(p_i - q_i, 0); if all k are accepted draw one more token from p_k. draft_probs=None means a deterministic
    drafter (q is one-hot on the drafted token), for which the rule reduces to accepting x with probability p_i(x).
    """
    k = draft.shape[0]
    rows = torch.arange(k)
    p_x = target_probs[rows, draft]
    q_x = draft_probs[rows, draft] if draft_probs is not None else torch.ones(k)
    u = torch.rand(k, generator=generator)
    accepted = (u * q_x < p_x).int().cumprod(0)
    n = int(accepted.sum())
    if n == k:
        return draft.tolist() + [_sample(target_probs[k], generator)]
    if draft_probs is not None:
        residual = (target_probs[n] - draft_probs[n]).clamp_min(0)
    else:
        residual = target_probs[n].clone()
        residual[draft[n]] = 0
    if residual.sum() <= 0:  # p == q up to rounding: rejection had probability ~0, fall back to p
        residual = target_probs[n]
    return draft[:n].tolist() + [_sample(residual, generator)]


def _sample(weights: torch.Tensor, generator: torch.Generator) -> int:
    return int(torch.multinomial(weights / weights.sum(), 1, generator=generator))
