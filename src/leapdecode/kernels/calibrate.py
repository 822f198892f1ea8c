"""Kernels chosen by measurement, per host: for each linear layer shape and dtype of a model, time every available path
(kernels.packed) at the row counts decoding sends, and route each call to the fastest path at the nearest measured row
count. Which path wins differs between CPUs: pre-packed oneDNN weights beat `F.linear` on AVX-512 hosts, yet were
slower for one row on an AVX2-only one; a bf16 output head can pay even without native bf16 (it halves the bytes read).

Measurements are cheap and bounded in time: each pass cycles through enough of the model's own layers of a shape to
read past the CPU caches, as a real forward does; paths are interleaved, best of a few rounds; a call too slow to
repeat is timed on a slice of the weight's rows. They are cached on disk under the user cache dir, keyed by the CPU's
model name and flags, torch version, thread count, shape, dtype and this file's version; timings taken while other
processes compete for the cores rank paths by how they share CPUs, so they serve the current process only and are
not cached. `F.linear` is kept unless another path is clearly faster, so "auto" is never slower than HF beyond
measurement noise; `configure(linear=...)` forces a path where that noise matters.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import pathlib
import tempfile
import time
from collections import defaultdict

import torch

from ..host import other_load, oversubscribed
from .ops import PAD_ROWS
from .packed import (
    ARGMAX_PATHS,
    LINEAR_PATHS,
    apply,
    available,
    coded_bits,
    drop_derived,
    forget_routes,
    prepare,
)
from .settings import cache_dir, host_cpu

VERSION = 14  # bump when what is measured changes: older cache entries are then ignored
# 1 + draft length for single requests (up to 17), and the flat batches of a batched engine
BUCKETS = (1, 2, 3, 4, 5, 8, 9, 16, 17, 32, 64, 128, 256)
# the output head is one huge layer per model: its bf16 argmax variants are timed at fewer row counts
ARGMAX_BUCKETS = (1, 3, 5, 9, 17, 64)
# a path listed later (hf, native, packed, packed-pad, argmax variants) must be this much faster to be chosen
MARGIN = 0.03
PASS_S = 3e-3  # one timed pass cycles through layers of a shape for about this long (past the caches)
ROUNDS, MAX_ROUNDS = 3, 8  # interleaved rounds per row count (more while the best times still drop)
BUDGET_S = 2.0  # per shape: past half of it no extra rounds, past all of it a single round per row count
MAX_CLONES, CLONE_BYTES = 16, 256 << 20  # copies of a shape's weights a timed pass may add (_past_the_caches)
BIG_S = 8e-3  # a call slower than this is timed on a slice of the weight's rows (still past the caches)
FP32_PATHS = tuple(p for p in LINEAR_PATHS if p != "native-q")  # for weights without exact codes
_memory: dict[str, dict] = {}
_disk: dict | None = None


class Plan:
    """The fastest path per row count for one layer shape: `linear(rows)`; for an output head also `argmax(rows)`
    (fp32 paths and ArgmaxOutputHead's bf16 variants) and `argmax_variant(rows)` (the faster bf16 variant)."""

    def __init__(self, linear: dict, argmax: dict | None = None):
        self.sources = (linear, argmax)  # the measurements it was made from (the very objects: see assign_plans)
        self.buckets = tuple(linear["buckets"])
        if argmax and tuple(argmax["buckets"]) != self.buckets:  # timings at the nearest of its row counts
            at = _nearest(tuple(argmax["buckets"]))
            argmax = {
                **argmax,
                "ms": {p: [v[at[min(b, len(at) - 1)]] for b in self.buckets] for p, v in argmax["ms"].items()},
            }
        self.ms = {**linear["ms"], **(argmax["ms"] if argmax else {})}
        self.quiet = linear.get("quiet", True) and (argmax or {}).get("quiet", True)
        self.has_argmax = bool(argmax and any(_finite(v) for v in argmax["ms"].values()))
        self._linear = [_pick(linear["ms"], i) for i in range(len(self.buckets))]
        self._argmax = [_pick(self.ms, i) for i in range(len(self.buckets))] if self.has_argmax else self._linear
        self._variant = (
            [_pick(argmax["ms"], i, margin=0.0) for i in range(len(self.buckets))] if self.has_argmax else []
        )
        self._at = _nearest(self.buckets)

    def _index(self, rows: int) -> int:
        return self._at[min(rows, len(self._at) - 1)]

    def linear(self, rows: int) -> str:
        return self._linear[self._index(rows)]

    def argmax(self, rows: int) -> str:
        return self._argmax[self._index(rows)]

    def argmax_variant(self, rows: int) -> str:
        return self._variant[self._index(rows)]

    def paths(self) -> set[str]:
        return set(self._linear) | set(self._argmax) | set(self._variant)

    def ranges(self, table: str = "linear") -> list[tuple[int, int, str]]:
        """[(first rows, last rows, path)] over the measured buckets."""
        chosen = {"linear": self._linear, "argmax": self._argmax}[table]
        out: list[tuple[int, int, str]] = []
        for rows in range(1, len(self._at)):
            path = chosen[self._at[rows]]
            if out and out[-1][2] == path:
                out[-1] = (out[-1][0], rows, path)
            else:
                out.append((rows, rows, path))
        return out


@functools.cache
def _nearest(buckets: tuple[int, ...]) -> list[int]:
    """rows -> index of the nearest bucket (the larger one on a tie), for rows up to the largest bucket."""
    return [min(range(len(buckets)), key=lambda i: (abs(buckets[i] - r), -i)) for r in range(buckets[-1] + 1)]


def assign_plans(modules: list[torch.nn.Linear]) -> None:
    """Give every installed linear layer the plan measured for its shape and dtype (the output head marked by
    install_argmax_head also gets the argmax variants); measures what neither memory nor disk cache holds."""
    groups: dict[tuple, list] = defaultdict(list)
    for m in modules:  # weights with exact codes are timed apart: their "native-q" path reads fewer bytes
        groups[(m.out_features, m.in_features, m.weight.dtype, coded_bits(m))].append(m)
    fresh, plans = False, {}
    for (out, inp, dtype, bits), mods in groups.items():
        paths = LINEAR_PATHS if bits else FP32_PATHS
        family = f"linear-q{bits}" if bits else "linear"
        linear, new = _entry(family, out, inp, dtype, lambda: [m.weight.detach() for m in mods], paths)  # noqa: B023 - called at once, in this iteration
        fresh |= new
        for m in mods:
            argmax = None
            if getattr(m, "_leapdecode_argmax", False):
                argmax, new = _entry(
                    "argmax",
                    out,
                    inp,
                    dtype,
                    lambda: [m.weight.detach()],  # noqa: B023 - called at once, in this iteration
                    ARGMAX_PATHS,
                    ARGMAX_BUCKETS,
                )
                fresh |= new
            current = getattr(m, "_leapdecode_plan", None)
            if current is not None and current.sources[0] is linear and current.sources[1] is argmax:
                continue  # installed again (a drafter per request): same plan, routes and native tables kept
            key = (id(linear), id(argmax))
            if key not in plans:
                plans[key] = Plan(linear, argmax)
            m._leapdecode_plan = plans[key]
            drop_derived(m, plans[key].paths())
            forget_routes()
    if fresh:
        _save()


def bf16_pays() -> bool:
    """Whether a memory-bound product (one row through weights far larger than the caches) is faster in bf16 than in
    fp32 on this host, each on its fastest path; measured once per host and cached."""
    key = f"{host_key()}|bf16-probe"
    if key not in _memory:
        _load()
    if key not in _memory:
        gen = torch.Generator().manual_seed(0)
        weights = [torch.randn(4096, 1024, generator=gen) for _ in range(6)]
        fp32 = _measure(weights, torch.float32, FP32_PATHS, (1,))
        bf16 = _measure([w.bfloat16() for w in weights], torch.bfloat16, FP32_PATHS, (1,))
        _memory[key] = {"float32": fp32, "bfloat16": bf16, "quiet": _quiet()}
        _save()
    best = {
        k: min((v[0] for v in _memory[key][k].values() if v[0] is not None), default=math.inf)
        for k in ("float32", "bfloat16")
    }
    return best["bfloat16"] < (1 - MARGIN) * best["float32"]


# environment variables that cap the instruction set torch, oneDNN and MKL use: the same CPU under a lower cap is,
# for kernel choice, a different host
ISA_LIMITS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")


def host_key() -> str:
    """CPU model and flags, the instruction set torch dispatches to and any cap set on it, torch version and thread
    count: what decides which kernel is fastest."""
    limits = ",".join(f"{name}={os.environ[name]}" for name in ISA_LIMITS if name in os.environ)
    isa = torch.backends.cpu.get_cpu_capability()
    raw = f"{VERSION}|{host_cpu()}|{isa}|{limits}|{torch.__version__}|{torch.get_num_threads()}"
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def cache_file() -> pathlib.Path:
    return cache_dir() / "kernel-calibration.json"


def forget() -> None:
    """Drop the in-memory measurements (the disk cache is read again on next use)."""
    global _disk
    _memory.clear()
    _disk = None


def _entry(family: str, out: int, inp: int, dtype: torch.dtype, weights, paths, buckets=BUCKETS) -> tuple[dict, bool]:
    key = f"{host_key()}|{family}|{out}x{inp}|{dtype}"
    if key not in _memory:
        _load()
    if key in _memory and set(_memory[key]["ms"]) <= set(paths):  # else measured with paths of another version
        return _memory[key], False
    usable = [p for p in paths if available(p, dtype)]
    quiet = _quiet()
    _memory[key] = {"buckets": list(buckets), "ms": _measure(weights(), dtype, usable, buckets), "quiet": quiet}
    return _memory[key], quiet


def _measure(weights: list[torch.Tensor], dtype: torch.dtype, paths, buckets) -> dict[str, list[float | None]]:
    """Best-of-rounds ms per call of each path at each row count (None where a path failed)."""
    out_features, inp = weights[0].shape
    gen = torch.Generator().manual_seed(0)
    ms: dict[str, list] = {p: [] for p in paths}
    with torch.inference_mode():
        one = torch.randn(1, inp, generator=gen).to(dtype)
        t1 = min(_timed(lambda: torch.nn.functional.linear(one, weights[0])) for _ in range(3))
        weights = _past_the_caches(weights, max(1, math.ceil(PASS_S / max(t1, 1e-7))))
        states = {p: _prepared(p, weights) for p in paths}
        start, last = time.perf_counter(), (1, t1)
        for rows in buckets:
            spent = time.perf_counter() - start
            rounds = (ROUNDS, MAX_ROUNDS) if spent < BUDGET_S / 2 else (ROUNDS, ROUNDS) if spent < BUDGET_S else (1, 1)
            x = torch.randn(rows, inp, generator=gen).to(dtype)
            use, scale = states, 1.0
            predicted = last[1] * rows / last[0]  # from the previous row count: skip full calls that would be slow
            call = _warm(use, x) if predicted <= 2 * BIG_S else predicted
            if call > BIG_S:  # compute-bound: a slice of the weight's rows ranks the paths the same, in less time
                keep = min(out_features, max(256, int(out_features * BIG_S / call)))
                part = [weights[0][:keep].contiguous()]
                use, scale = {p: _prepared(p, part) if s else [] for p, s in states.items()}, out_features / keep
                call = _warm(use, x) * scale
            last = (rows, max(call, 1e-7))
            n = min(len(next((s for s in use.values() if s), [0])), max(1, math.ceil(PASS_S * scale / last[1])))
            best = {p: math.inf for p in paths}
            here = [p for p in paths if use[p] and (p != "packed-pad" or rows < PAD_ROWS)]  # else the same as packed
            for r in range(rounds[1]):
                before = dict(best)
                for p in here[r % len(here) :] + here[: r % len(here)]:
                    best[p] = min(best[p], _timed(lambda: _run(p, use[p][:n], x)) / n)  # noqa: B023 - called at once, in this iteration
                if r + 1 >= rounds[0] and all(best[p] > (1 - MARGIN) * before[p] for p in here):
                    break  # no path got clearly faster in this round: the minimums have settled
            for p in paths:
                ms[p].append(round(1000 * best[p] * scale, 4) if math.isfinite(best[p]) else None)
    return ms


def _past_the_caches(weights: list[torch.Tensor], count: int) -> list[torch.Tensor]:
    """`count` weights of the shape to cycle through in a timed pass: the model's own, then copies of them where it
    has fewer (a draft head has one layer of a shape). Each call then reads its weight from memory, as in a forward,
    where cycling through one small weight would time it from the cache and favour the paths that read more bytes.
    At most MAX_CLONES copies, and under CLONE_BYTES."""
    if len(weights) >= count:
        return weights[:count]
    size = weights[0].numel() * weights[0].element_size()
    extra = min(count - len(weights), MAX_CLONES, CLONE_BYTES // max(size, 1))
    return weights + [weights[i % len(weights)].clone() for i in range(extra)]


def _quiet() -> bool:
    """Whether other processes leave this one's torch threads their cores: timings taken on a busy machine rank the
    paths by how they share CPUs, so they serve this process only and are not written to the disk cache."""
    return not oversubscribed(other_load(), torch.get_num_threads())


def _warm(states: dict, x: torch.Tensor) -> float:
    """One call of every path on its first layer (the first call of a shape picks kernels); the slowest's time."""
    return max((_timed(lambda: _run(p, s[:1], x)) for p, s in states.items() if s), default=0.0)  # noqa: B023 - called at once, in this iteration


def _prepared(path: str, weights: list[torch.Tensor]) -> list:
    try:
        states = [prepare(path, w) for w in weights]
        apply(path, states[0], torch.zeros(2, weights[0].shape[1], dtype=weights[0].dtype), None)
        return states
    except Exception:  # noqa: BLE001 - a path that fails here is simply not a candidate
        return []


def _run(path: str, states: list, x: torch.Tensor) -> None:
    for s in states:
        apply(path, s, x, None)


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _pick(ms: dict, i: int, margin: float = MARGIN) -> str:
    """The first path (in the order measured: simplest first) within `margin` of the fastest at bucket i."""
    times = {p: v[i] for p, v in ms.items() if v[i] is not None}
    if not times:
        return "hf"
    fastest = min(times.values())
    return next(p for p, t in times.items() if t * (1 - margin) <= fastest)


def _finite(values) -> bool:
    return any(v is not None for v in values)


def _load() -> None:
    global _disk
    if _disk is None:
        try:
            _disk = json.loads(cache_file().read_text())
        except (OSError, ValueError):
            _disk = {}
        for key, value in _disk.items():
            _memory.setdefault(key, value)


def _save() -> None:
    """Merge this process's measurements into the cache file (atomically; a read-only cache dir is not an error)."""
    path = cache_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            merged = json.loads(path.read_text())
        except (OSError, ValueError):
            merged = {}
        merged.update((k, v) for k, v in _memory.items() if v.get("quiet", True))
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".kernel-calibration-")
        with os.fdopen(fd, "w") as f:
            json.dump(merged, f)
        os.replace(tmp, path)
    except OSError:
        pass
