"""CPU kernels the Runner uses inside its own forwards: linear layers on pre-packed weights, and for greedy decoding an
output head that reads half the bytes yet returns logits with the exact argmax.

`install_packed_linear` gives a model's fp32/bf16 `nn.Linear` layers a copy of their weight packed once into oneDNN's
blocked layout. `F.linear` hands the GEMM a plain row-major weight that is re-laid-out on every call; packed once, a
decode step reads the weights as they are, and verifying a few draft tokens costs about as much as decoding one
(measured on AVX-512: README, "Kernels"). Only calls under `packed_kernels(True)` use them: HF `generate` and the
bench's baselines keep `F.linear`. bf16 results equal `F.linear`'s bit for bit; fp32 ones differ in rounding (~1e-6
relative), like any other GEMM.
"""
from __future__ import annotations

import contextlib
import contextvars
import types
import weakref

import torch

_packed = contextvars.ContextVar("leapdecode_packed_linear", default=False)
_argmax_only = contextvars.ContextVar("leapdecode_argmax_only", default=False)
# module -> {kind: ((weight pointer, version), derived weight)}; outside the module so that copies of a model don't
# carry it, and rebuilt when the weight is replaced or changed in place
_derived: "weakref.WeakKeyDictionary[torch.nn.Linear, dict]" = weakref.WeakKeyDictionary()
# oneDNN reads a packed weight faster with 4 input rows than with 1-3 (its few-row kernels stream memory worse), so
# fewer rows are zero-padded to four. Measured on AVX-512, 1 thread, whole fp32 forwards over a warm cache: Qwen2.5
# 1.5B 1 token 508 -> 425 ms, 2 tokens 639 -> 477 ms; SmolLM2-135M 1 token 58.9 -> 53.0 ms, 2 tokens 76.4 -> 60.7 ms
PAD_ROWS = 4
# bf16 keeps 8 significant bits: its unit roundoff is 2^-8. The bound below charges 2^-7 per rounding step, which also
# covers fp32 accumulation over up to 65,536 products (d * 2^-24 <= 2^-8)
BF16_ROUNDING = 2.0 ** -7


def install_packed_linear(model: torch.nn.Module) -> None:
    """Route the model's CPU fp32/bf16 nn.Linear layers through packed weights while `packed_kernels(True)` is on."""
    for module in model.modules():
        if type(module) is torch.nn.Linear and not hasattr(module, "_leapdecode_linear") and _packable(module.weight):
            module._leapdecode_linear = module.forward
            module.forward = types.MethodType(_packed_forward, module)


def install_argmax_head(model: torch.nn.Module) -> bool:
    """Let the model's fp32 output head (without bias) run as an ArgmaxOutputHead under `argmax_logits(True)`, where
    bf16 kernels are fast; returns whether it does."""
    head = model.get_output_embeddings()
    if not (hasattr(head, "_leapdecode_linear") and head.weight.dtype == torch.float32 and head.bias is None
            and fast_bf16()):
        return False
    head._leapdecode_argmax = True
    return True


class ArgmaxOutputHead:
    """Greedy decoding reads only the argmax of each row of logits. A bf16 copy of the output head (for a 49k-token
    vocabulary a fifth of a small model's weights) reads half the bytes; a proven bound on its error then marks every
    token whose bf16 logit could still be the row's fp32 maximum, and only those are recomputed in fp32.

    Bound: |h.w_i - l_i| <= |h| s + 2^-7 |l_i| for the bf16 logit l_i, with s = max_i |w_i - bf16(w_i)| + 2^-7 |w_i|
    (weight rounding, input rounding and accumulation; then output rounding). So the top bf16 logit's exact value is
    at least top - |h| s - 2^-7 |top|, and a token can only beat it if l_i + 2^-7 |l_i| >= top - 2 |h| s - 2^-7 |top|.
    The returned logits are exact (fp32) on those tokens and the bf16 values elsewhere, all below the largest exact
    one: every row's argmax is that of the fp32 head. Other entries are not the model's logits."""

    def __init__(self, weight: torch.Tensor):
        low = weight.bfloat16()
        self.weight = weight
        self.packed = torch.ops.mkldnn._reorder_linear_weight(low, None)
        self.slack = float(((weight - low.float()).norm(dim=-1) + BF16_ROUNDING * weight.norm(dim=-1)).max())

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        logits = _packed_matmul(flat.bfloat16(), self.packed, None).float()
        top = logits.amax(-1, keepdim=True)
        reach = top - 2 * self.slack * flat.norm(dim=-1, keepdim=True) - BF16_ROUNDING * top.abs()
        floor = torch.where(reach >= 0, reach / (1 + BF16_ROUNDING), reach / (1 - BF16_ROUNDING))  # l + c|l| = reach
        rows, tokens = (logits >= floor).nonzero(as_tuple=True)
        logits[rows, tokens] = (flat[rows] * self.weight[tokens]).sum(-1)
        return logits.reshape(*x.shape[:-1], -1)


def fast_bf16() -> bool:
    """Whether this CPU runs oneDNN's bf16 kernels (AVX-512 and newer); elsewhere bf16 matmuls are slower than fp32."""
    return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def _packable(weight: torch.Tensor) -> bool:
    if weight.device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    if weight.dtype == torch.bfloat16:
        return fast_bf16()
    return weight.dtype == torch.float32


def _weight_derived(module: torch.nn.Linear, kind, build):
    key = (module.weight.data_ptr(), module.weight._version)
    entries = _derived.setdefault(module, {})
    if kind not in entries or entries[kind][0] != key:
        entries[kind] = (key, build(module.weight.detach()))
    return entries[kind][1]


def _packed_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    if not _packed.get():
        return self._leapdecode_linear(x)
    if _argmax_only.get() and getattr(self, "_leapdecode_argmax", False):
        return _weight_derived(self, ArgmaxOutputHead, ArgmaxOutputHead)(x)
    packed = _weight_derived(self, "packed", lambda weight: torch.ops.mkldnn._reorder_linear_weight(weight, None))
    flat = _packed_matmul(x.reshape(-1, x.shape[-1]), packed, self.bias)
    return flat.reshape(*x.shape[:-1], flat.shape[-1])


def _packed_matmul(flat: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """flat [rows, in] @ packed weight (+ bias), fewer than PAD_ROWS rows zero-padded."""
    rows = flat.shape[0]
    if rows < PAD_ROWS:
        flat = torch.cat([flat, flat.new_zeros(PAD_ROWS - rows, flat.shape[1])])
    return torch.ops.mkldnn._linear_pointwise(flat, packed, bias, "none", [], "")[:rows]


def packed_kernels(on: bool):
    """While on, nn.Linear layers given install_packed_linear run on their packed weights."""
    return _switched(_packed, on)


def argmax_logits(on: bool):
    """While on, an output head given install_argmax_head returns logits faithful only in their argmax."""
    return _switched(_argmax_only, on)


@contextlib.contextmanager
def _switched(switch: contextvars.ContextVar, on: bool):
    token = switch.set(on)
    try:
        yield
    finally:
        switch.reset(token)
