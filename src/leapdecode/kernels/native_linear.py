"""The "native" linear path: an fp32 weight packed once into column panels and multiplied by a small C kernel
(csrc/panel_linear.c).

Why: a decode step's linear layers read every weight for one row, or for a few (verification, a batch of sequences).
oneDNN's pre-packed kernels stream those weights well below the memory's speed on few rows; the panel kernel reads
each weight once, in order, and applies it to all the rows it holds in registers. Calibration (kernels.calibrate)
times it beside the other paths per layer shape and row count, so it runs only where it is faster on this host.

Each output element is summed in the same order whatever the number of rows, so a row's bits do not depend on what
else shares the call: a verified draft row gets the bits of a one-row step, and one sequence's rows the bits they
get alone. The library is built once per host (kernels.native); where it cannot be, the path is not offered.

A weight that is exactly a 4-bit weight widened to fp32 (every group of 32 inputs of an output row is d q + m with q
in 0..15: a GGUF Q4_1 weight as the packaged models' loader dequantizes it) is kept in that form instead (Q4Panels):
the kernel rebuilds each fp32 value in registers and gives the very bits of the fp32 product, reading about a sixth
of the bytes. Only an encoding that gives every value back bit for bit is used; any other weight stays fp32.
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
        "q4_panel_linear": (None, [_i64, _i64, _i64, _ptr, _i64, _ptr, _ptr, _ptr, _ptr, _i64, _i64]),
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


GROUP = 32  # inputs per 4-bit group (csrc/panel_linear.c)


def q4_form(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """(codes [out, in] uint8, d and m [out, in / GROUP] fp32) with weight == d q + m bit for bit in every group of
    GROUP inputs, d an fp16 value (so d q is exact in fp32, and a fused multiply-add rounds as a product and a sum
    do), or None where the weight has no such form. m is the group's minimum; d is tried at the fp16 value nearest
    (max - min) / 15 and its two fp16 neighbours, per group."""
    if weight.dtype != torch.float32 or weight.dim() != 2 or weight.shape[1] % GROUP or weight.numel() == 0:
        return None
    out, inp = weight.shape
    if out > 1 and q4_form(weight[:1]) is None:  # most weights that have no such form fail on their first row
        return None
    with torch.no_grad():
        groups = weight.detach().reshape(out, inp // GROUP, GROUP)
        low = groups.amin(-1)
        nearest = ((groups.amax(-1) - low) / 15).half()
        codes = torch.zeros(groups.shape, dtype=torch.uint8)
        scale = torch.zeros(low.shape)
        found = torch.zeros(low.shape, dtype=torch.bool)
        for candidate in (
            nearest,
            nearest.nextafter(nearest.new_full((), float("inf"))),
            nearest.nextafter(nearest.new_full((), -float("inf"))),
        ):
            d = candidate.float()
            if found.all():
                break
            q = torch.round((groups - low[..., None]) / torch.where(d > 0, d, 1.0)[..., None]).clamp(0, 15)
            same = ((d[..., None] * q + low[..., None]).view(torch.int32) == groups.view(torch.int32)).all(-1)
            same &= torch.isfinite(d) & ~found
            codes[same], scale[same] = q[same].to(torch.uint8), d[same]
            found |= same
        if not found.all():
            return None
    return codes.reshape(out, inp), scale, low


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


class Q4Panels:
    """A weight in its exact 4-bit form (q4_form), packed for q4_panel_linear: per panel of `width` output columns,
    codes [in, width / 2] bytes (byte j: column j in the low nibble, column width / 2 + j in the high one) and per
    group of GROUP inputs the columns' d then their m (fp32). Zero-padded columns are 0 q + 0."""

    scales: torch.Tensor

    def __init__(self, codes: torch.Tensor, d: torch.Tensor, m: torch.Tensor):
        lib = library()
        if lib is None:
            raise RuntimeError("the native linear kernel is not built here")
        self.out_features, self.in_features = codes.shape
        width = lib.panel_width()
        count, half = -(-self.out_features // width), width // 2

        def by_panel(t: torch.Tensor) -> torch.Tensor:  # [out, n] -> [count, n, width], zero-padded columns
            padded = t.new_zeros(count * width, t.shape[1])
            padded[: self.out_features] = t
            return padded.view(count, width, t.shape[1]).transpose(1, 2)

        columns = by_panel(codes)
        self.data = (columns[..., :half] | (columns[..., half:] << 4)).contiguous()
        self.scales = torch.stack([by_panel(d), by_panel(m)], dim=2).contiguous()  # [count, in / GROUP, 2, width]

    def __call__(self, flat: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """flat [rows, in] (fp32) @ weight^T (+ bias) -> [rows, out], the bits Panels gives for the fp32 weight."""
        if flat.stride(-1) != 1 or flat.dtype != torch.float32:
            flat = flat.float().contiguous()
        if bias is not None:
            bias = bias.float().contiguous()
        rows = flat.shape[0]
        out = torch.empty(rows, self.out_features)
        library().q4_panel_linear(
            rows,
            self.out_features,
            self.in_features,
            flat.data_ptr(),
            flat.stride(0),
            self.data.data_ptr(),
            self.scales.data_ptr(),
            None if bias is None else bias.data_ptr(),
            out.data_ptr(),
            self.out_features,
            torch.get_num_threads(),
        )
        return out
