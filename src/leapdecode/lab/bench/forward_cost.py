"""The cost profile behind the speed-ups: the time of one target forward of n tokens over a warm KV cache, relative to
one token, with HF's `F.linear` and with the Runner's kernels (chosen per host by calibration). Speculative decoding
pays only where verifying a draft of k tokens costs little more than decoding one token."""

from __future__ import annotations

import statistics
import time

import torch

from ...runner import Runner

SIZES = (1, 2, 3, 5, 9, 17)


@torch.inference_mode()
def forward_costs(model: torch.nn.Module, context_ids: list[int], sizes=SIZES, repeats: int = 5) -> dict:
    """{"hf"|"packed": {"ms": {n: median ms}, "relative": {n: ms / ms of one token}, "fused": bool}} over
    `context_ids` ("fused": whether the forward ran through kernels.fused_decoder)."""
    feed = (context_ids * (max(sizes) // max(1, len(context_ids)) + 1))[: max(sizes)]
    out = {}
    for kernels, packed in (("hf", False), ("packed", True)):
        runner = Runner(model, packed_weights=packed)
        runner.prefill(context_ids)
        ms = {}
        for n in sizes:
            times = []
            for _ in range(repeats + 1):  # the first call of a size is a warm-up
                start = time.perf_counter()
                runner.forward(feed[:n], last_only=n == 1)
                times.append(time.perf_counter() - start)
                runner.rollback(n)
            ms[n] = round(1000 * statistics.median(times[1:]), 2)
        relative = {n: round(ms[n] / ms[sizes[0]], 2) for n in sizes}
        out[kernels] = {"ms": ms, "relative": relative, "fused": runner.decoder is not None}
    return out


def cost_table(costs: dict, context: int) -> list[str]:
    sizes = list(next(iter(costs.values()))["ms"])
    lines = [
        f"## Forward cost (target, warm KV cache of {context} tokens, median of the repeats)",
        "",
        "Time of one forward of n tokens relative to one token (which is in ms): a draft of k tokens is "
        "verified in one forward of k + 1 tokens.",
        "",
        "| linear kernels | " + " | ".join(f"n={n}" for n in sizes) + " |",
        "|---|" + "---:|" * len(sizes),
    ]
    for kernels, row in costs.items():
        cells = [f"{row['ms'][sizes[0]]:.1f} ms"] + [f"{row['relative'][n]:.2f}×" for n in sizes[1:]]
        name = "F.linear (HF)"
        if kernels == "packed":
            name = "leapdecode (calibrated" + (", fused decoder)" if row.get("fused") else ")")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines + [""]
