"""Attention of every sequence of a flat batch in one native call per layer (csrc/segment_attention.c).

Why: the engine's step attends each sequence's rows over its own KV buffers. In torch that is one SDPA call (and two
KV writes) per sequence per layer, and with many short sequences those calls' overheads, not their arithmetic, are
most of the attention time. The C kernel writes the new keys/values of all sequences into their buffers and attends
all their rows in one call, parallel over (sequence, query head) on torch's own OpenMP threads.

A row is computed from its own keys alone, in the same order whatever else shares the call, so a drafted row that is
verified gets the bits it would get in a one-row step. The kernel takes fp32 rows of segments with few new rows (decode
and verification); prompt chunks keep torch's SDPA, which is faster on many rows. Keys and values kept in other
layouts (a KV press's HF cache) are stored by their owner and attended by the kernel all the same, so a single
request computes the same attention with a press as without.

The library is compiled once per host with the system's C compiler (a second or so) and cached under the user cache
dir, keyed by the source, the compiler, the CPU and the instruction set torch dispatches to (so a cap such as
ATEN_CPU_CAPABILITY=avx2 builds for AVX2). Without a compiler, or if the build fails, attention stays in torch with a
one-line notice; `configure(attention="sdpa")` forces that.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import pathlib
import platform
import shutil
import subprocess
import tempfile

import torch

from .ops import notice

SOURCE = pathlib.Path(__file__).with_name("csrc") / "segment_attention.c"
MAX_ROWS = 32  # segments with more new rows than this (prompt chunks) attend through SDPA, faster on many rows
_state: dict = {"lib": None, "why_not": None, "checked": False}


def march_flags() -> list[str]:
    """Compiler flags for the instruction set torch dispatches to here (honouring ATEN_CPU_CAPABILITY)."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return []
    isa = torch.backends.cpu.get_cpu_capability()
    if isa.startswith("AVX512"):
        return ["-march=native"]
    if isa == "AVX2":
        return ["-mavx2", "-mfma", "-mf16c"]
    return []


def takes_head_dim(head_dim: int) -> bool:
    """The kernel works in 16-float lanes and holds a query row in registers: head sizes 16, 32, .. 256."""
    return head_dim % 16 == 0 and 0 < head_dim <= 256


def _compiler() -> str | None:
    return os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")


def _library_path(compiler: str, flags: list[str]) -> pathlib.Path:
    from .calibrate import _cpu, cache_file

    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
    key = "|".join([SOURCE.read_text(), compiler, version, " ".join(flags), _cpu(), torch.__version__])
    name = f"segment_attention-{hashlib.sha256(key.encode()).hexdigest()[:16]}.so"
    return cache_file().parent / "native" / name


def _build(compiler: str, path: pathlib.Path, flags: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        out = pathlib.Path(tmp) / path.name
        # OpenMP from the runtime torch already loaded (same soname), so the kernel shares torch's threads; a
        # compiler without OpenMP builds it single-threaded
        for threads in (["-fopenmp"], []):
            command = [compiler, "-O3", *threads, "-shared", "-fPIC", *flags, str(SOURCE), "-o", str(out)]
            done = subprocess.run(command, capture_output=True, text=True, timeout=120)
            if done.returncode == 0:
                break
        else:
            raise RuntimeError((done.stderr.strip().splitlines() or ["compiler failed"])[-1][:160])
        os.replace(out, path)  # atomic: another process building the same library at once is harmless


def _load() -> ctypes.CDLL:
    compiler = _compiler()
    if compiler is None:
        raise RuntimeError("no C compiler found (set CC)")
    flags = march_flags()
    path = _library_path(compiler, flags)
    if not path.exists():
        _build(compiler, path, flags)
    lib = ctypes.CDLL(str(path))
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    lib.segment_attention.restype = None
    lib.segment_attention.argtypes = [i64, ptr] + [ptr, i64, i64] * 3 + [ptr, i64, i64, i64, ctypes.c_float]
    return lib


def library() -> ctypes.CDLL | None:
    """The compiled kernel, built on first use; None (after a one-line notice) where it cannot be built or loaded,
    or where `configure(attention="sdpa")` keeps attention in torch."""
    from .packed import _settings

    if _settings["attention"] != "native":
        return None
    if not _state["checked"]:
        _state["checked"] = True
        try:
            _state["lib"] = _load()
        except Exception as error:  # noqa: BLE001 - any failure means: attention stays in torch
            _state["why_not"] = f"{type(error).__name__}: {error}"
            notice(f"native segment attention unavailable ({_state['why_not']}); attention runs in torch")
    return _state["lib"]


def why_not() -> str | None:
    """Why the native kernel is not in use (None when it is)."""
    library()
    return _state["why_not"] if _state["lib"] is None else None


def describe() -> str:
    """One line for reports: how a flat batch's decode and verification rows attend here."""
    if library() is not None:
        flags = " ".join(march_flags()) or "no ISA flags"
        return f"native segment kernel ({flags}) for up to {MAX_ROWS} new rows a sequence, torch SDPA beyond"
    why = _state["why_not"]
    return "torch SDPA, one call per sequence" + (f" (native kernel unavailable: {why})" if why else "")


def forget() -> None:
    """Check and load the library again on next use (tests)."""
    _state.update(lib=None, why_not=None, checked=False)


FIELDS = 7  # int64 fields per segment: key buffer, value buffer, distance between heads, first row, rows, past, write


def fields(segments) -> ctypes.Array:
    """The kernel's per-segment fields for segments (first_row, n, past, write), buffer addresses left to fill in per
    layer: `write` says whether the kernel copies the segment's new keys/values into its buffers first."""
    values = []
    for first, n, past, write in segments:
        values += [0, 0, 0, first, n, past, int(write)]
    return (ctypes.c_int64 * len(values))(*values)


def attend_segments(lib, count: int, meta, query, key, value, scaling: float, out: torch.Tensor) -> None:
    """Put the rows' attention of `count` segments into out [1, R, H, d]. meta: `fields(...)` with each segment's
    fp32 key and value buffers filled in (address of [kv_heads, >= past + n, d] with rows d apart, and the distance
    between heads in floats). query [1, H, R, d], key/value [1, KVH, R, d], each with a contiguous last dimension."""
    lib.segment_attention(
        count,
        meta,
        query.data_ptr(),
        query.stride(1),
        query.stride(2),
        key.data_ptr(),
        key.stride(1),
        key.stride(2),
        value.data_ptr(),
        value.stride(1),
        value.stride(2),
        out.data_ptr(),
        query.shape[1],
        key.shape[1],
        query.shape[3],
        scaling,
    )
