"""What a model's linear layers run on: one row per layer shape (its fused decoder's included), for reports."""

from __future__ import annotations

from collections import defaultdict

import torch

from .calibrate import BUCKETS
from .fused_decoder import existing_decoder  # its fused projections run in place of the model's own
from .native_linear import Q4K, Q6M
from .packed import _settings, coded_bits, installed

CODES = {4: "Q4_1 codes", Q4K: "Q4_K codes", 8: "8-bit codes", 6: "Q6_K codes", Q6M: "Q4_K and Q6_K codes"}


def kernel_table(model: torch.nn.Module) -> list[dict]:
    """What each of the model's linear layer shapes (its fused decoder's included, in place of the parts it fused) runs
    on: one dict per shape, dtype and form of exact codes (`codes`, or None), with the layer count, the chosen path
    per row range (`linear`; `argmax` for the output head in greedy decoding) and the measured ms."""
    decoder = existing_decoder(model)
    groups: dict[tuple, list] = defaultdict(list)
    for m in installed(model) + (installed(decoder) if decoder is not None else []):
        if decoder is not None and getattr(m, "_leapdecode_fused_part", False):
            continue
        dtype = str(m.weight.dtype).removeprefix("torch.")
        groups[
            (m.out_features, m.in_features, dtype, coded_bits(m), bool(getattr(m, "_leapdecode_argmax", False)))
        ].append(m)
    mode, rows = _settings["linear"], []
    for (out, inp, dtype, bits, head), mods in groups.items():
        plan = getattr(mods[0], "_leapdecode_plan", None)
        forced = [(1, BUCKETS[-1], "hf" if mode == "auto" else mode)]
        row = {
            "shape": f"{out}x{inp}",
            "dtype": dtype,
            "codes": CODES.get(bits),
            "layers": len(mods),
            "output_head": head,
            "mode": mode,
            "linear": plan.ranges() if mode == "auto" and plan else forced,
        }
        if head and plan is not None and plan.has_argmax and _settings["argmax_head"] != "off":
            row["argmax"] = (
                plan.ranges("argmax")
                if _settings["argmax_head"] == "auto"
                else [(1, BUCKETS[-1], "argmax-bf16 (forced on)")]
            )
        if plan is not None:
            row["cached"] = plan.quiet  # False: measured on a busy machine, for this process only
            row["ms"] = {"buckets": list(plan.buckets), **plan.ms}
        rows.append(row)
    return rows


def describe_kernels(model: torch.nn.Module) -> list[str]:
    """kernel_table as short lines, e.g. '576x576 float32 x60: packed-pad 1-3, packed 4-256'."""

    def spans(ranges, open_ended: bool = True):
        return ", ".join(
            f"{p} {a}" + (f"-{b}" if b > a else "") + ("+" if open_ended and b == BUCKETS[-1] else "")
            for a, b, p in ranges
        )

    lines = []
    for row in kernel_table(model):
        codes = f" ({row['codes']})" if row.get("codes") else ""
        line = f"{row['shape']} {row['dtype']}{codes} x{row['layers']}: {spans(row['linear'])}"
        if "argmax" in row:
            line += f"; greedy head: {spans(row['argmax'])}"
        if not row.get("cached", True):
            line += " (measured on a busy machine: not cached)"
        lines.append(line)
    checked = getattr(model, "_leapdecode_whole_step", None)  # kernels.whole_step's outcome, where it ran
    if checked is not None:
        native = [(a, b, "every layer on the panel kernel") for a, b, on in checked[1].ranges() if on]
        # past the largest bucket the choices above run (whole_step.NativeRows): those spans end there
        lines.append(
            f"whole steps (timed): {spans(native, False) if native else 'the choices above at every row count'}"
        )
    return lines
