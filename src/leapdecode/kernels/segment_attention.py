"""Attention of every sequence of a flat batch in one native call per layer (csrc/segment_attention.c).

Why: the engine's step attends each sequence's rows over its own KV buffers. In torch that is one SDPA call (and two
KV writes) per sequence per layer, and with many short sequences those calls' overheads, not their arithmetic, are
most of the attention time. The C kernel writes the new keys/values of all sequences into their buffers and attends
all their rows in one call, parallel over (sequence, key/value head) on torch's own OpenMP threads; a task's (row,
query head) pairs walk the keys together, a block at a time, so each key and value is read once per task.

A row is computed from its own keys alone, in the same order whatever else shares the call, so a drafted row that is
verified gets the bits it would get in a one-row step. The kernel takes the fp32 rows of segments of up to MAX_ROWS new
rows: decode, verification and prompt chunks (a single request's prompt too); longer runs keep torch's tiled SDPA. Keys and values kept in other
layouts (a KV press's HF cache) are stored by their owner and attended by the kernel all the same, so a single
request computes the same attention with a press as without.

The library is compiled once per host (kernels.native). Without a compiler, or if the build fails, attention stays in
torch with a one-line notice; `configure(attention="sdpa")` forces that.
"""

from __future__ import annotations

import ctypes

import torch

from .native import NativeLibrary, march_flags
from .settings import _settings

MAX_ROWS = 512  # segments with more new rows attend through SDPA: its tiles win on long runs (from ~1k rows here)


def _enabled() -> bool:
    return _settings["attention"] == "native"


_i64, _ptr = ctypes.c_int64, ctypes.c_void_p
_library = NativeLibrary(
    "segment_attention",
    {"segment_attention": (None, [_i64, _ptr] + [_ptr, _i64, _i64] * 3 + [_ptr, _i64, _i64, _i64, ctypes.c_float])},
    _enabled,
    "native segment attention",
    "attention runs in torch",
)


def takes_head_dim(head_dim: int) -> bool:
    """The kernel works in 16-float lanes and holds a query row in registers: head sizes 16, 32, .. 256."""
    return head_dim % 16 == 0 and 0 < head_dim <= 256


def library() -> ctypes.CDLL | None:
    """The compiled kernel, built on first use; None (after a one-line notice) where it cannot be built or loaded,
    or where `configure(attention="sdpa")` keeps attention in torch."""
    return _library.get()


def why_not() -> str | None:
    """Why the native kernel is not in use (None when it is)."""
    return _library.why_not()


def describe() -> str:
    """One line for reports: how a flat batch's decode and verification rows attend here."""
    if library() is not None:
        flags = " ".join(march_flags()) or "no ISA flags"
        return f"native segment kernel ({flags}) for up to {MAX_ROWS} new rows a sequence, torch SDPA beyond"
    why = _library.why_not() if _enabled() else None
    return "torch SDPA, one call per sequence" + (f" (native kernel unavailable: {why})" if why else "")


def forget() -> None:
    """Check and load the library again on next use (tests)."""
    _library.forget()


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
