"""For greedy decoding: an output head that reads half the bytes (bf16) yet returns logits with the exact fp32 argmax.

The bf16 product runs either on a pre-packed oneDNN weight (fast where the CPU has native bf16) or through plain
`F.linear` on a bf16 weight (bf16 only halves the bytes read there, which still pays for a memory-bound head);
calibration picks whichever path is fastest on this host, including plain fp32. The exact step (widen, bound,
recompute the candidates) runs in C (csrc/argmax_head.c) where the native library builds, else in torch.
"""

from __future__ import annotations

import ctypes

import torch
import torch.nn.functional as F

from .native import NativeLibrary
from .ops import packed_matmul, reorder

_i64, _ptr, _f32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float
_library = NativeLibrary(
    "argmax_head",
    {"argmax_head": (None, [_i64, _i64, _i64, _ptr, _ptr, _i64, _ptr, _f32, _f32, _ptr, _i64])},
    lambda: True,
    "the argmax head's native exact step",
    "its exact step runs in torch",
)

# bf16 keeps 8 significant bits: its unit roundoff is 2^-8. The bound below charges 2^-7 per rounding step, which also
# covers fp32 accumulation over up to 65,536 products (d * 2^-24 <= 2^-8)
BF16_ROUNDING = 2.0**-7


class ArgmaxOutputHead:
    """Greedy decoding reads only the argmax of each row of logits. A bf16 copy of the output head (for a 49k-token
    vocabulary a fifth of a small model's weights) reads half the bytes; a proven bound on its error then marks every
    token whose bf16 logit could still be the row's fp32 maximum, and only those are recomputed in fp32.

    Bound: |h.w_i - l_i| <= |h| s + 2^-7 |l_i| for the bf16 logit l_i, with s = max_i |w_i - bf16(w_i)| + 2^-7 |w_i|
    (weight rounding, input rounding and accumulation; then output rounding). So the top bf16 logit's exact value is
    at least top - |h| s - 2^-7 |top|, and a token can only beat it if l_i + 2^-7 |l_i| >= top - 2 |h| s - 2^-7 |top|.
    The returned logits are exact (fp32) on those tokens and the bf16 values elsewhere, all below the largest exact
    one: every row's argmax is that of the fp32 head. Other entries are not the model's logits.

    `packed`: the bf16 product on a oneDNN-packed weight (True) or through F.linear (False); both accumulate in fp32.
    """

    def __init__(self, weight: torch.Tensor, packed: bool = True):
        low = weight.bfloat16()
        self.weight = weight
        self.exact = weight.contiguous()  # what the native exact step reads rows of
        self.low = low
        self.packed = reorder(low) if packed else None
        self.slack = float(((weight - low.float()).norm(dim=-1) + BF16_ROUNDING * weight.norm(dim=-1)).max())

    def bf16_logits(self, flat: torch.Tensor) -> torch.Tensor:
        if self.packed is not None:
            return packed_matmul(flat.bfloat16(), self.packed, None)
        return F.linear(flat.bfloat16(), self.low)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        low = self.bf16_logits(flat)
        lib = _library.get() if low.dtype == torch.bfloat16 and flat.dtype == torch.float32 else None
        if lib is not None:
            flat, low = flat.contiguous(), low.contiguous()
            logits = torch.empty(low.shape, dtype=torch.float32)
            rows, vocab = low.shape
            lib.argmax_head(
                rows, vocab, flat.shape[1], low.data_ptr(), flat.data_ptr(), flat.stride(0), self.exact.data_ptr(),
                self.slack, BF16_ROUNDING, logits.data_ptr(), torch.get_num_threads(),
            )  # fmt: skip
            return logits.reshape(*x.shape[:-1], self.weight.shape[0])
        logits = low.float()
        top = logits.amax(-1, keepdim=True)
        reach = top - 2 * self.slack * flat.norm(dim=-1, keepdim=True) - BF16_ROUNDING * top.abs()
        floor = torch.where(reach >= 0, reach / (1 + BF16_ROUNDING), reach / (1 - BF16_ROUNDING))  # l + c|l| = reach
        rows, tokens = (logits >= floor).nonzero(as_tuple=True)
        logits[rows, tokens] = (flat[rows] * self.weight[tokens]).sum(-1)
        return logits.reshape(*x.shape[:-1], self.weight.shape[0])  # named: a step may keep no rows


def fast_bf16() -> bool:
    """Whether oneDNN has native bf16 kernels on this CPU (AVX-512 and newer). It does not say whether bf16 pays: a
    memory-bound product can be faster in bf16 without them (half the bytes); calibrate.bf16_pays measures that."""
    try:
        return torch.backends.mkldnn.is_available() and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except Exception:  # noqa: BLE001 - a torch build without the op
        return False
