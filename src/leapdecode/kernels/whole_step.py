"""Kernel choice checked on whole steps: per row count, whether a model's forward runs faster with every linear layer
on the panel kernel (from a weight's exact codes where it has them, else from fp32 panels; the output head too, no
bf16 argmax variant) than with each layer on the path calibration found fastest for its shape alone.

Why: calibration times one layer shape at a time, and a whole step differs from that in two ways it cannot see.
Where every layer of a step is on the panel kernel, the step runs in one native call (kernels.decoder_step: no
Python, ctypes or thread start-up between operations); and in a step every layer's weights stream from memory beside
every other's, so a path that reads more bytes (fp32 panels where codes exist, a bf16 copy of the output head) pays
more there than alone. So the choice is made once more on the forward itself, at every row count calibration
measures, and kept in the calibration cache beside the per-layer timings. The panel kernel gives a row the same bits
whatever the row count, so where it is chosen a verified draft row also gets exactly the bits of a one-row step.
"""

from __future__ import annotations

import hashlib
import time
from typing import Callable

import torch

from . import calibrate
from .calibrate import BUCKETS, MARGIN, _nearest, host_key
from .packed import (
    _settings,
    chosen_path,
    coded_bits,
    configured,
    drop_derived,
    forget_routes,
    installed,
    prepare_routes,
)

ROUNDS = 2  # interleaved rounds of each way per row count, two timed forwards each (the best counts)
BUDGET_S = 8.0  # a model's whole check; past it, larger row counts keep the per-layer plan unmeasured
SLOW_S = 1.0  # a forward slower than this is not timed again at larger row counts


class NativeRows:
    """Per row count (calibration's buckets, the nearest one), whether every layer runs on the panel kernel. Past the
    largest bucket nothing was timed (a long prompt read in one forward runs layer by layer, bound by arithmetic, where
    the per-layer choices were measured to win), so there it is never."""

    def __init__(self, native: list[bool]):
        self.native = tuple(native)
        self._at = _nearest(BUCKETS)

    def __call__(self, rows: int) -> bool:
        return rows < len(self._at) and self.native[self._at[rows]]

    def ranges(self) -> list[tuple[int, int, bool]]:
        """[(first rows, last rows, native)] over the buckets, for reports."""
        out: list[tuple[int, int, bool]] = []
        for rows in range(1, len(self._at)):
            native = self(rows)
            if out and out[-1][2] == native:
                out[-1] = (out[-1][0], rows, native)
            else:
                out.append((rows, rows, native))
        return out


def check(
    model: torch.nn.Module, layers: list[torch.nn.Linear], forward: Callable[[], Callable[[int], None]]
) -> NativeRows:
    """Time `forward()(rows)` (one greedy forward of `rows` new rows over a past, made by the caller only when
    something is to be timed) both ways at every bucket, or read the outcome from the cache; give every layer in
    `layers` the outcome (packed.chosen_path reads it)."""
    key = f"{host_key()}|whole-step|{signature(model, layers)}"
    if getattr(model, "_leapdecode_whole_step", (None,))[0] == key:  # checked already (a forward per request)
        return model._leapdecode_whole_step[1]
    calibrate._load()
    entry = calibrate._memory.get(key)
    if entry is None:
        entry = calibrate._memory[key] = measure(layers, forward())
        if entry["quiet"]:
            calibrate._save()
    table = NativeRows(entry["native"])
    for layer in layers:
        layer._leapdecode_native_rows = table
        plan = getattr(layer, "_leapdecode_plan", None)
        if plan is not None:  # free what the plan would have run where the panel kernel runs instead
            taken = [i for i, native in enumerate(table.native) if not native] + [len(BUCKETS) - 1]  # and past it
            kept = {p for i in taken for p in (plan._linear[i], plan._argmax[i], *plan._variant[i : i + 1])}
            drop_derived(layer, kept | {"native"} if coded_bits(layer) is None else kept)
    forget_routes()
    for layer in layers:  # built now, not by the first call at each row count
        prepare_routes(layer, (*BUCKETS, BUCKETS[-1] + 1))
    model._leapdecode_whole_step = (key, table)
    return table


def measure(layers: list[torch.nn.Linear], forward: Callable[[int], None]) -> dict:
    """Best-of-rounds ms of a forward at each bucket, per-layer plan ("plan") and panel kernel everywhere ("native"),
    the two interleaved; native where it is not slower than the plan by more than calibration's margin (it runs in
    one call and gives every row count the same bits), and untimed where the plan puts every layer on it already."""
    ms: dict[str, list] = {"plan": [], "native": []}
    ways = {"plan": {}, "native": {"linear": "native-q", "argmax_head": "off"}}
    start, slow = time.perf_counter(), False
    for rows in BUCKETS:
        if all(_on_panels(m, rows) for m in layers):
            ms["plan"].append(0.0)
            ms["native"].append(0.0)
            continue
        if slow or time.perf_counter() - start > BUDGET_S:
            ms["plan"].append(None)
            ms["native"].append(None)
            continue
        best = dict.fromkeys(ways, float("inf"))
        for r in range(ROUNDS):
            for name in list(ways)[r % 2 :] + list(ways)[: r % 2]:
                with configured(**ways[name]):  # a switch of settings makes routes and native tables anew: untimed
                    forward(rows)
                    for _ in range(2):
                        t = time.perf_counter()
                        forward(rows)
                        best[name] = min(best[name], time.perf_counter() - t)
        for name in ways:
            ms[name].append(best[name])
        slow = max(best.values()) > SLOW_S
    native = [n is not None and n * (1 - MARGIN) <= p for p, n in zip(ms["plan"], ms["native"])]
    rounded = {name: [None if v is None else round(1000 * v, 3) for v in values] for name, values in ms.items()}
    return {"buckets": list(BUCKETS), "native": native, "ms": rounded, "quiet": calibrate._quiet()}


def _on_panels(layer: torch.nn.Linear, rows: int) -> bool:
    """Whether the per-layer plan already runs `layer` on the panel kernel at `rows` rows in a greedy step, from its
    codes where it has them (then both ways are the same)."""
    path = chosen_path(layer, rows, True, argmax_only=True)
    return path == "native-q" or (path == "native" and coded_bits(layer) is None)


def signature(model: torch.nn.Module, layers: list[torch.nn.Linear]) -> str:
    """What decides the outcome: the model's class and size, every layer's shape and codes, and the kernel settings a
    step depends on."""
    config = model.config
    parts = [type(model).__name__, str(config.num_hidden_layers), str(config.hidden_size)]
    parts += [f"{m.out_features}x{m.in_features}:{coded_bits(m)}" for m in layers]
    parts += [f"{k}={_settings[k]}" for k in ("attention", "elementwise", "step", "native_weights", "argmax_head")]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def layers_of(model: torch.nn.Module, decoder) -> list[torch.nn.Linear]:
    """The linear layers a forward of the model runs: its fused decoder's and its own installed ones, but for the
    parts the fused layers run in their place."""
    return installed(decoder) + [m for m in installed(model) if not getattr(m, "_leapdecode_fused_part", False)]
