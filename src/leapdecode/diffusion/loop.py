"""The one diffusion decode loop: canvas, semi-autoregressive blocks, decoder.select, NFE counting, EoTP.

```
prompt + [MASK]*n --> lm.logits(canvas) --> decoder.select(view) --> commit positions --> ... until no mask is left
```

Invariants the loop enforces (whatever the decoder returns): only masked positions of the current block are
committed, each exactly once; the prompt is never touched; every forward commits at least one position (the most
confident one if the decoder chose none), so decoding always ends within `gen_len` forwards. The <mask> token can
never be committed. NFE is counted per sequence: one per forward in which that sequence still had masks.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from ..errors import require
from .eotp import fill_after_eos
from .interface import DiffusionLM


@dataclass
class StepView:
    """What a decoder sees at one step, for the rows still decoding (all tensors have those rows first)."""

    canvas: torch.LongTensor  # [B, L] current canvas
    logits: torch.Tensor  # [B, L, V] (the <mask> token's logit is -inf)
    probs: torch.Tensor  # [B, L, V] softmax(logits)
    eligible: torch.BoolTensor  # [B, L] masked positions of the current block
    masked: torch.BoolTensor  # [B, L] all still-masked positions
    rows: torch.LongTensor  # [B] index of each row in the full batch (for per-row decoder state)
    step: torch.LongTensor  # [B] forwards already spent on this row
    block_step: torch.LongTensor  # [B] forwards already spent on the row's current block
    block_masked: torch.LongTensor  # [B] masked positions in the current block
    stable: torch.LongTensor  # [B, L] consecutive forwards the argmax at this position has not changed
    gen_start: int
    gen_len: int
    block_len: int
    reference: torch.LongTensor | None = None  # [B, L] final tokens of a reference decode (oracle decoders only)

    @property
    def confidence(self) -> torch.Tensor:
        return self.probs.max(-1).values

    @property
    def argmax(self) -> torch.LongTensor:
        return self.probs.argmax(-1)


@dataclass
class Commit:
    positions: torch.BoolTensor  # [B, L] positions to commit now
    tokens: torch.LongTensor | None = None  # [B, L] tokens to write there (default: argmax)


@dataclass
class DecodeResult:
    canvas: torch.LongTensor  # [B, L] final canvas
    nfe: torch.LongTensor  # [B] forward passes per sequence
    committed_step: torch.LongTensor  # [B, L] forward index at which each position was committed (-1: prompt)
    cut_by_eotp: torch.BoolTensor  # [B, L] positions filled with <pad> by EoTP rather than decoded
    seconds: float
    gen_start: int
    trace: list[dict] = field(default_factory=list)  # per step, if requested: features for filter training


@torch.no_grad()
def diffusion_decode(
    lm: DiffusionLM,
    prompts: torch.LongTensor,
    gen_len: int,
    decoder,
    block_len: int | None = None,
    eotp: bool = False,
    reference: torch.LongTensor | None = None,
    record_trace: bool = False,
    feature_fn=None,
) -> DecodeResult:
    """Decode `gen_len` tokens after each (left-padded) prompt row with `decoder`; see the module docstring."""
    require(gen_len > 0, f"gen length must be positive, got {gen_len}")
    block_len = block_len or gen_len
    require(block_len > 0, f"block length must be positive, got {block_len}")
    batch, prompt_len = prompts.shape
    length = prompt_len + gen_len
    require(
        length <= lm.max_length,
        f"prompt ({prompt_len} tokens) + gen length ({gen_len}) exceeds the model's canvas of {lm.max_length}",
    )
    mask_id = lm.mask_token_id
    canvas = torch.cat([prompts, torch.full((batch, gen_len), mask_id, dtype=torch.long)], dim=1)
    nfe = torch.zeros(batch, dtype=torch.long)
    block_step = torch.zeros(batch, dtype=torch.long)
    current_block = torch.zeros(batch, dtype=torch.long)
    committed_step = torch.full((batch, length), -1, dtype=torch.long)
    cut_by_eotp = torch.zeros((batch, length), dtype=torch.bool)
    prev_argmax = torch.full((batch, length), -1, dtype=torch.long)
    stable = torch.zeros((batch, length), dtype=torch.long)
    pos = torch.arange(length)
    block_of = torch.where(pos >= prompt_len, (pos - prompt_len) // block_len, torch.full_like(pos, -1))
    decoder.reset(batch, length)
    trace: list[dict] = []
    start = time.perf_counter()
    while True:
        masked_all = canvas == mask_id
        active = masked_all.any(1)
        if not active.any():
            break
        rows = active.nonzero().squeeze(1)
        sub, masked = canvas[rows], masked_all[rows]
        first_masked = torch.where(masked, pos, torch.full_like(pos, length)).min(1).values
        blk = block_of[first_masked]
        moved = blk != current_block[rows]
        block_step[rows[moved]] = 0
        current_block[rows] = blk
        if hasattr(lm, "prefill") and moved.any():
            lm.prefill(sub, int(prompt_len + blk.min().item() * block_len))
        logits = lm.logits(sub)
        logits[..., mask_id] = float("-inf")
        probs = torch.softmax(logits, -1)
        argmax = probs.argmax(-1)
        same = argmax == prev_argmax[rows]
        stable[rows] = torch.where(same, stable[rows] + 1, torch.zeros_like(stable[rows]))
        prev_argmax[rows] = argmax
        eligible = masked & (block_of.unsqueeze(0) == blk.unsqueeze(1))
        view = StepView(
            sub,
            logits,
            probs,
            eligible,
            masked,
            rows,
            nfe[rows].clone(),
            block_step[rows].clone(),
            eligible.sum(1),
            stable[rows],
            prompt_len,
            gen_len,
            block_len,
            None if reference is None else reference[rows],
        )
        nfe[rows] += 1
        block_step[rows] += 1
        commit = decoder.select(view)
        chosen = commit.positions & eligible
        tokens = argmax if commit.tokens is None else commit.tokens
        none = ~chosen.any(1)
        if none.any():  # progress guarantee: the most confident eligible position
            conf = torch.where(eligible, view.confidence, torch.full_like(view.confidence, -1.0))
            chosen[none, conf[none].argmax(1)] = True
        if record_trace:
            trace.append(
                {
                    "rows": rows,
                    "eligible": eligible,
                    "argmax": argmax,
                    "chosen": chosen,
                    "features": feature_fn(view) if feature_fn else None,
                }
            )
        sub = torch.where(chosen, tokens, sub)
        step_idx = nfe[rows].unsqueeze(1) - 1
        committed_step[rows] = torch.where(chosen, step_idx.expand_as(chosen), committed_step[rows])
        if eotp:
            cut = fill_after_eos(sub, (sub != mask_id) & (pos >= prompt_len), mask_id, lm.eos_token_id, lm.pad_token_id)
            cut_by_eotp[rows] |= cut
            committed_step[rows] = torch.where(cut, step_idx.expand_as(cut), committed_step[rows])
        canvas[rows] = sub
    return DecodeResult(canvas, nfe, committed_step, cut_by_eotp, time.perf_counter() - start, prompt_len, trace)
