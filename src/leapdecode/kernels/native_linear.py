"""The "native" linear path: an fp32 weight packed once into column panels and multiplied by a small C kernel
(csrc/panel_linear.c).

Why: a decode step's linear layers read every weight for one row, or for a few (verification, a batch of sequences).
oneDNN's pre-packed kernels stream those weights well below the memory's speed on few rows; the panel kernel reads
each weight once, in order, and applies it to all the rows it holds in registers. Calibration (kernels.calibrate)
times it beside the other paths per layer shape and row count, so it runs only where it is faster on this host.

Each output element is summed in the same order whatever the number of rows, so a row's bits do not depend on what
else shares the call: a verified draft row gets the bits of a one-row step, and one sequence's rows the bits they
get alone. The library is built once per host (kernels.native); where it cannot be, the path is not offered.
"""

from __future__ import annotations

import ctypes

import torch

from .native import NativeLibrary, march_flags

_i64, _ptr = ctypes.c_int64, ctypes.c_void_p
_library = NativeLibrary(
    "panel_linear",
    {
        "panel_width": (_i64, []),
        "panel_linear": (None, [_i64, _i64, _i64, _ptr, _i64, _ptr, _ptr, _ptr, _i64, _i64]),
    },
    lambda: True,
    "the native linear kernel",
    "linear layers use oneDNN or F.linear",
)


def library() -> ctypes.CDLL | None:
    return _library.get()


def why_not() -> str | None:
    return _library.why_not()


def forget() -> None:
    _library.forget()


def describe() -> str:
    """One line for reports."""
    if library() is None:
        return f"native panel kernel unavailable ({why_not()})"
    flags = " ".join(march_flags()) or "no ISA flags"
    return f"native panel kernel ({flags}) where calibration finds it fastest (see the kernel table)"


class Panels:
    """An fp32 weight [out, in] packed as [ceil(out / width), in, width] (zero-padded), for panel_linear."""

    def __init__(self, weight: torch.Tensor):
        lib = library()
        if lib is None or weight.dtype != torch.float32:
            raise RuntimeError("the native linear kernel takes fp32 weights where it is built")
        self.out_features, self.in_features = weight.shape[0], weight.shape[1]  # no library handle: models deep-copy
        width = lib.panel_width()
        count = -(-self.out_features // width)
        padded = weight.new_zeros(count * width, self.in_features)
        padded[: self.out_features] = weight
        self.data = padded.view(count, width, self.in_features).transpose(1, 2).contiguous()

    def __call__(self, flat: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """flat [rows, in] (fp32) @ weight^T (+ bias) -> [rows, out]."""
        if flat.stride(-1) != 1 or flat.dtype != torch.float32:
            flat = flat.float().contiguous()
        if bias is not None:
            bias = bias.float().contiguous()
        rows = flat.shape[0]
        out = torch.empty(rows, self.out_features)
        library().panel_linear(
            rows,
            self.out_features,
            self.in_features,
            flat.data_ptr(),
            flat.stride(0),
            self.data.data_ptr(),
            None if bias is None else bias.data_ptr(),
            out.data_ptr(),
            self.out_features,
            torch.get_num_threads(),
        )
        return out
