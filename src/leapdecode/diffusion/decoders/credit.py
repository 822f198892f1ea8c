"""CreditDecoding (trace credit): each position accumulates decayed credit for the token it keeps predicting across
steps; the credit is fused into the current logits, so a token that has been stable for a while reaches the commit
threshold earlier than its current confidence alone would allow."""

from __future__ import annotations

import torch

from ...errors import require
from ..loop import Commit, StepView
from .base import Decoder
from .threshold import check_threshold


class CreditDecoder(Decoder):
    name = "credit"

    def __init__(self, threshold: float = 0.9, decay: float = 0.7, strength: float = 1.0) -> None:
        self.threshold = check_threshold(threshold)
        require(0 <= decay < 1, f"credit decay must be in [0, 1), got {decay}")
        require(strength >= 0, f"credit strength must be >= 0, got {strength}")
        self.decay, self.strength = decay, strength
        self.credit: torch.Tensor | None = None

    def reset(self, batch: int, length: int) -> None:
        self.batch, self.credit = batch, None  # allocated on the first step, once the vocabulary size is known

    def select(self, view: StepView) -> Commit:
        b, length, vocab = view.probs.shape
        if self.credit is None:
            self.credit = torch.zeros(self.batch, length, vocab)
        credit = self.credit[view.rows] * self.decay
        top = view.probs.max(-1, keepdim=True)
        credit.scatter_add_(2, top.indices, top.values)  # credit goes to the current top token
        self.credit[view.rows] = credit
        fused = torch.softmax(view.logits + self.strength * torch.log1p(credit), -1)
        conf, tokens = fused.max(-1)
        return Commit(view.eligible & (conf >= self.threshold), tokens)

    def describe(self) -> str:
        return f"credit({self.threshold:g})"
