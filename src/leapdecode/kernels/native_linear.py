"""The "native" linear path: an fp32 weight packed once into column panels and multiplied by a small C kernel
(csrc/panel_linear.c).

Why: a decode step's linear layers read every weight for one row, or for a few (verification, a batch of sequences).
oneDNN's pre-packed kernels stream those weights well below the memory's speed on few rows; the panel kernel reads
each weight once, in order, and applies it to all the rows it holds in registers. Calibration (kernels.calibrate)
times it beside the other paths per layer shape and row count, so it runs only where it is faster on this host.

Each output element is summed in the same order whatever the number of rows, so a row's bits do not depend on what
else shares the call: a verified draft row gets the bits of a one-row step, and one sequence's rows the bits they
get alone. The library is built once per host (kernels.native); where it cannot be, the path is not offered.

A weight that is exactly a quantized weight widened to fp32 is kept as its codes instead (CodedPanels): every group
of 32 inputs of an output row is d q + m with q in 0..15 (a GGUF Q4_1 weight as the packaged models' loader
dequantizes it, or Q4_K's with fp32 d and m) or d q with q in -128..127 (Q8_0's; per 16 inputs with fp32 d, Q6_K's). The kernel rebuilds each fp32 value in registers and gives the
very bits of the fp32 product, reading about a sixth (4-bit) or a third (8-bit) of the bytes. Only an encoding that
gives every value back bit for bit is used; any other weight stays fp32.
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
        "coded_panel_linear": (None, [_i64, _i64, _i64, _i64, _ptr, _i64, _ptr, _ptr, _ptr, _ptr, _i64, _i64]),
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


GROUP = 32  # inputs per group of 4- and 8-bit codes (csrc/panel_linear.c)
Q6_GROUP = 16  # inputs per group of the 6-bit form's codes
Q4K = 44  # the form of 4-bit codes with fp32 d and m (q4k_form; `bits` 44 in csrc/panel_linear.c)
Q4K_BITS = 17  # significant bits of a Q4_K group's d and m: an fp16 value (11) times a 6-bit sub-scale
Q6M = 66  # the form of 8-bit codes with fp32 d and m per Q6_GROUP inputs (q6m_form; `bits` 66 in the kernel)


def coded_form(weight: torch.Tensor) -> CodedPanels | None:
    """The weight's exact codes packed for the kernel (4-bit with fp16 or else fp32 scales where it has that form,
    else 8-bit, else 8-bit codes with fp32 scales per 16 inputs, without or else with an offset), or None."""
    for bits, form_of in ((4, q4_form), (Q4K, q4k_form), (8, q8_form), (6, q6_form), (Q6M, q6m_form)):
        form = form_of(weight)
        if form is not None:
            return CodedPanels(bits, *form)
    return None


def _fp16_near(value: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The fp16 value nearest each value and its two fp16 neighbours, as fp32: the scales a group's codes may have."""
    nearest = value.half()
    up, down = nearest.new_full((), float("inf")), nearest.new_full((), -float("inf"))
    return tuple(c.float() for c in (nearest, nearest.nextafter(up), nearest.nextafter(down)))


def _codes_for(groups: torch.Tensor, candidates, top: int):
    """Per group the first candidate whose codes give every w back bit for bit as d q + m; (codes, d, m) or None where
    some group has none. A candidate is a scale d (m = 0, codes q = round(w / d) in -top - 1..top) or a pair (d, m)
    (codes round((w - m) / d) in 0..top), a value per group; each after the first is tried only on the groups still
    without codes. A -0 weight counts as given back by +0 (GGUF's Q4_0 and Q5_0 store d with the sign of the group's
    extreme, so a zero code times a negative d is -0): every sum of the kernels starts from +0, and adding a product
    with a zero weight, of either sign, to it leaves the same bits."""
    flat = groups.reshape(-1, groups.shape[-1])
    codes = torch.empty(flat.shape, dtype=torch.int16)
    scale, shift = torch.empty(flat.shape[0]), torch.zeros(flat.shape[0])
    todo = None  # every group
    for candidate in candidates:
        unsigned = isinstance(candidate, tuple)
        d, o = candidate if unsigned else (candidate, torch.zeros_like(candidate))
        d, o = (d.reshape(-1), o.reshape(-1)) if todo is None else (d.reshape(-1)[todo], o.reshape(-1)[todo])
        w = flat if todo is None else flat[todo]
        q = torch.round((w - o[:, None]) / torch.where(d > 0, d, 1.0)[:, None])
        q = q.clamp_(0 if unsigned else -top - 1, top).add_(0.0)  # no -0: the kernel's codes are integers
        back = d[:, None] * q + o[:, None]
        same = (back.view(torch.int32) == w.view(torch.int32)) | ((back == 0) & (w == 0))
        same = same.all(-1) & torch.isfinite(d) & torch.isfinite(o)
        hit = same.nonzero().squeeze(1) if todo is None else todo[same]
        codes[hit], scale[hit], shift[hit] = q[same].to(torch.int16), d[same], o[same]
        todo = (~same).nonzero().squeeze(1) if todo is None else todo[~same]
        if todo.numel() == 0:
            return codes.reshape(groups.shape), scale.reshape(groups.shape[:-1]), shift.reshape(groups.shape[:-1])
    return None


def _exact_form(weight: torch.Tensor, group: int, candidates, top: int, dtype: torch.dtype):
    """(codes [out, in] of `dtype`, d and m [out, in / group] fp32) with weight == d q + m bit for bit in every group of
    `group` inputs, the candidates (_codes_for's) made by `candidates(groups [out, in / group, group])`, or None. The
    first row is tried alone first: most weights without the form fail there."""
    if weight.dtype != torch.float32 or weight.dim() != 2 or weight.shape[1] % group or weight.numel() == 0:
        return None
    if weight.shape[0] > 1 and _exact_form(weight[:1], group, candidates, top, dtype) is None:
        return None
    groups = weight.detach().reshape(weight.shape[0], -1, group)
    with torch.no_grad():
        found = _codes_for(groups, candidates(groups), top)
    return None if found is None else (found[0].to(dtype).reshape(weight.shape), found[1], found[2])


def q8_form(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(codes [out, in] int8, d [out, in / GROUP] fp32) with weight == d q bit for bit in every group of GROUP inputs,
    d an fp16 value, or None. That is the form of GGUF's Q8_0 (d = max |w| / 127), and of its Q5_0 and Q4_0 too (d q
    with q in -16..15 or -8..7, d = the group's extreme / -16 or / -8), read as 8-bit codes: d is tried at the fp16
    values nearest max |w| / 127, / 128, / 16 and / 8, per group."""
    form = _exact_form(weight, GROUP, _q8_candidates, 127, torch.int8)
    return None if form is None else form[:2]


def q6_form(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(codes [out, in] int8, d [out, in / Q6_GROUP] fp32) with weight == d q bit for bit in every group of Q6_GROUP
    inputs, or None: the form of GGUF's Q6_K (q in -32..31), whose d per 16 inputs is an fp16 value times an 8-bit
    sub-scale (so d q is exact in fp32, but d is no fp16 value). d is tried at max |w| / n for n = 32 down to 1 (the
    largest code of a group is often under 32 in Q6_K, whose scale search trades it for a smaller error)."""
    form = _exact_form(weight, Q6_GROUP, _q6_candidates, 127, torch.int8)
    return None if form is None else form[:2]


def _q8_candidates(groups: torch.Tensor):
    top = groups.abs().amax(-1)
    return (d for n in (127, 128, 16, 8) for d in _fp16_near(top / n))


def _q6_candidates(groups: torch.Tensor):
    top = groups.abs().amax(-1)
    return (top / n for n in range(32, 0, -1))


def q4_form(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """(codes [out, in] uint8, d and m [out, in / GROUP] fp32) with weight == d q + m bit for bit in every group of
    GROUP inputs, d and m fp16 values (so d q is exact in fp32, a fused multiply-add rounds as a product and a sum do,
    and both are stored in fp16), or None where the weight has no such form. m is the group's minimum (an fp16 value in
    a GGUF Q4_1 weight); d is tried at the fp16 values nearest (max - min) / 15, per group (GGUF Q4_1)."""

    def candidates(groups: torch.Tensor):
        low = groups.amin(-1)
        if torch.equal(low.half().float(), low):
            yield from ((d, low) for d in _fp16_near((groups.amax(-1) - low) / 15))

    return _exact_form(weight, GROUP, candidates, 15, torch.uint8)


def _round_to_bits(x: torch.Tensor, bits: int) -> torch.Tensor:
    """x rounded to `bits` significant bits (to nearest, ties away from zero), on its fp32 bits."""
    drop = 24 - bits
    return ((x.view(torch.int32) + (1 << (drop - 1))) & -(1 << drop)).view(torch.float32)


def q4k_form(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """(codes [out, in] uint8, d and m [out, in / GROUP] fp32) with weight == d q + m bit for bit in every group of
    GROUP inputs, q in 0..15, d and m of at most Q4K_BITS significant bits (so d q is exact in fp32, and a fused
    multiply-add rounds as a product and a sum do), or None. That is the form of GGUF's Q4_K: d is an fp16 super-scale
    times a 6-bit sub-scale and m minus an fp16 super-minimum times a 6-bit sub-minimum, so neither is an fp16 value
    (q4_form's), and a group's codes need not span 0..15 nor start at 0 (its minimum need not be m). Tried per group:
    d = (max - min) / s rounded to Q4K_BITS bits for spans s = 15 down to 1, each with m = min - d q0 rounded alike
    for a smallest code q0 = 0 up to 15 - s."""
    return _exact_form(weight, GROUP, _q4k_candidates, 15, torch.uint8)


def _q4k_candidates(groups: torch.Tensor):
    """q4k_form's candidate pairs (d, m) per group of `groups` [..., n]."""
    low = groups.amin(-1)
    span = groups.amax(-1) - low
    for s in range(15, 0, -1):
        d = _round_to_bits(span / s, Q4K_BITS)
        for q0 in range(16 - s):
            yield d, _round_to_bits(low - d * q0, Q4K_BITS)


def q6m_form(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """(codes [out, in] int8, d and m [out, in / Q6_GROUP] fp32) with weight == d q + m bit for bit in every group of
    Q6_GROUP inputs, or None: a form that holds both Q4_K's groups (q4k_form's d and m, per 32 inputs) and Q6_K's
    (q6_form's d, m = 0), at 1.5 bytes a weight, for a fused weight whose parts have those two forms (Qwen2.5-Coder-
    1.5B's q/k/v projections). Tried: q4k_form's candidates per 32 inputs, then q6_form's per 16."""

    def candidates(groups: torch.Tensor):
        wide = _q4k_candidates(groups.reshape(groups.shape[0], -1, GROUP))
        yield from ((d.repeat_interleave(2, -1), m.repeat_interleave(2, -1)) for d, m in wide)  # each half of 32
        yield from _q6_candidates(groups)

    return (
        None
        if weight.dim() != 2 or weight.shape[1] % GROUP
        else _exact_form(weight, Q6_GROUP, candidates, 127, torch.int8)
    )


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
        return _product(library().panel_linear, (), self.out_features, (self.data.data_ptr(),), flat, bias)


class CodedPanels:
    """A weight as its exact codes (q4_form: bits 4; q4k_form: bits Q4K; q8_form: bits 8, m None; q6_form: bits 6,
    m None; q6m_form: bits Q6M), packed for coded_panel_linear: per panel of `width` output columns, the codes of each input (4-bit: width
    / 2 bytes, byte j holding column j in the low nibble and column width / 2 + j in the high one; 8- and 6-bit: width
    signed bytes) and per group of GROUP inputs the columns' d (then, 4-bit, their m) in fp16, which holds them exactly
    (q4_form, q8_form), or in fp32 (q4k_form), or per group of Q6_GROUP inputs their d (then, Q6M, their m) in fp32
    (q6_form, q6m_form). Zero-padded columns are 0 q + 0."""

    scales: torch.Tensor

    def __init__(self, bits: int, codes: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None = None):
        lib = library()
        if lib is None:
            raise RuntimeError("the native linear kernel is not built here")
        self.bits = bits
        self.out_features, self.in_features = codes.shape
        width = lib.panel_width()
        count, half = -(-self.out_features // width), width // 2

        def by_panel(t: torch.Tensor) -> torch.Tensor:  # [out, n] -> [count, n, width], zero-padded columns
            padded = t.new_zeros(count * width, t.shape[1])
            padded[: self.out_features] = t
            return padded.view(count, width, t.shape[1]).transpose(1, 2)

        columns = by_panel(codes)
        # 4-bit: two columns a byte; 8- and 6-bit: a signed byte a column
        self.data = (columns[..., :half] | (columns[..., half:] << 4)) if bits in (4, Q4K) else columns
        self.data = self.data.contiguous()
        # with m: [count, in / group, 2, width], else [count, in / group, width]; fp16 where it holds them exactly
        # (q4_form, q8_form), fp32 otherwise (the kernel reads fp32 scales of Q4K as 16-bit words)
        scales = by_panel(d) if m is None else torch.stack([by_panel(d), by_panel(m)], dim=2)
        self.scales = scales.to(torch.float16 if bits in (4, 8) else torch.float32).contiguous()

    def __call__(self, flat: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """flat [rows, in] (fp32) @ weight^T (+ bias) -> [rows, out], the bits Panels gives for the fp32 weight."""
        weights = (self.data.data_ptr(), self.scales.data_ptr())
        return _product(library().coded_panel_linear, (self.bits,), self.out_features, weights, flat, bias)


def _product(kernel, leading: tuple, out_features: int, weights: tuple, flat: torch.Tensor, bias) -> torch.Tensor:
    """flat [rows, in] through a panel kernel taking (*leading, rows, out, in, x, ldx, *weights, bias, y, ldy,
    threads)."""
    if flat.stride(-1) != 1 or flat.dtype != torch.float32:
        flat = flat.float().contiguous()
    if bias is not None:
        bias = bias.float().contiguous()
    rows, inputs = flat.shape
    out = torch.empty(rows, out_features)
    kernel(
        *leading,
        rows,
        out_features,
        inputs,
        flat.data_ptr(),
        flat.stride(0),
        *weights,
        None if bias is None else bias.data_ptr(),
        out.data_ptr(),
        out_features,
        torch.get_num_threads(),
    )
    return out
