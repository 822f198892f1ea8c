"""EoTP (End-of-Text Prediction, from Learn2PD): once <eos> is committed, every still-masked position after it is
end-of-text padding, so it is filled with <pad> at once instead of being decoded one forward at a time."""

from __future__ import annotations

import torch


def fill_after_eos(
    canvas: torch.LongTensor, committed: torch.BoolTensor, mask_id: int, eos_id: int, pad_id: int
) -> torch.BoolTensor:
    """In place: masked positions after the first committed <eos> become <pad>. Returns the positions filled."""
    is_eos = committed & (canvas == eos_id)
    cut = torch.zeros_like(committed)
    if not is_eos.any():
        return cut
    length = canvas.shape[1]
    idx = torch.arange(length).expand_as(canvas)
    first_eos = torch.where(is_eos, idx, torch.full_like(idx, length)).min(1, keepdim=True).values
    cut = (canvas == mask_id) & (idx > first_eos)
    canvas[cut] = pad_id
    return cut


def eotp_would_cut(final: torch.LongTensor, gen_start: int, eos_id: int, pad_id: int) -> torch.BoolTensor:
    """Per row of finished canvases: does anything other than <pad> follow the first <eos>? (EoTP would change it.)"""
    gen = final[:, gen_start:]
    idx = torch.arange(gen.shape[1]).expand_as(gen)
    first = torch.where(gen == eos_id, idx, torch.full_like(idx, gen.shape[1])).min(1, keepdim=True).values
    return ((idx > first) & (gen != pad_id)).any(1)
