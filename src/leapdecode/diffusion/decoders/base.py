"""One interface for every parallel-decoding policy: given the step's view, choose positions to commit."""

from __future__ import annotations

import torch

from ..loop import Commit, StepView


class Decoder:
    """Subclasses implement `select`; `reset` clears per-row state at the start of each decode."""

    name = "decoder"

    def reset(self, batch: int, length: int) -> None:
        """Called once per decode with the full batch size and canvas length."""

    def select(self, view: StepView) -> Commit:
        raise NotImplementedError

    def describe(self) -> str:
        return self.name


def top_k_mask(score: torch.Tensor, eligible: torch.BoolTensor, k: torch.LongTensor) -> torch.BoolTensor:
    """Per row, the k[row] eligible positions with the highest score."""
    score = torch.where(eligible, score, torch.full_like(score, float("-inf")))
    order = score.argsort(dim=1, descending=True)
    ranks = torch.empty_like(order)
    ranks.scatter_(1, order, torch.arange(score.shape[1]).expand_as(order))
    return eligible & (ranks < k.unsqueeze(1))
