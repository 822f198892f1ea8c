"""A decoder layer's elementwise steps as one native call each (csrc/decoder_ops.c): the residual sum with RMSNorm,
the rotary embedding of queries and keys, and SiLU(gate) * up.

Why: in torch each is five to ten small operations, and on the few rows of a decode step their dispatch costs more
than their arithmetic (a step runs about thirty of them per layer). The fused decoder calls these instead where the
model's layers are the ones they implement (fp32 Llama/Qwen2 RMSNorm, SiLU, HF's rotary embedding). They compute
HF's formulas in fp32 with their own rounding (sums in a fixed order, an exp of their own), so a row's bits do not
depend on the other rows of the step. `configure(elementwise="torch")` keeps torch's operations; so does a host where
the library cannot be built (one-line notice).
"""

from __future__ import annotations

import ctypes

import torch

from .native import NativeLibrary
from .settings import _settings

_i64, _ptr, _f32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float
MAX_HEAD_DIM = 512  # the rotary kernel keeps one head's values on its stack


def _enabled() -> bool:
    return _settings["elementwise"] == "native"


_library = NativeLibrary(
    "decoder_ops",
    {
        "add_rms_norm": (None, [_i64, _i64, _ptr, _ptr, _ptr, _f32, _ptr, _ptr, _i64]),
        "rotary": (None, [_i64, _i64, _i64, _ptr, _i64, _ptr, _ptr, _i64]),
        "silu_mul": (None, [_i64, _i64, _ptr, _ptr, _i64]),
    },
    _enabled,
    "native decoder operations",
    "they run in torch",
)


def library() -> ctypes.CDLL | None:
    return _library.get()


def forget() -> None:
    _library.forget()


def describe() -> str:
    """One line for reports."""
    if library() is not None:
        return "native RMSNorm, rotary embedding and SiLU (fp32 Llama/Qwen2 layers)"
    why = _library.why_not() if _enabled() else "configure(elementwise='torch')"
    return f"torch's operations ({why})"


def supports(model: torch.nn.Module) -> bool:
    """Whether the model's layers are what these kernels compute: RMSNorms with an fp32 weight and an epsilon, a SiLU
    activation, an even head size the rotary kernel holds."""
    for layer in model.model.layers:
        norms = (layer.input_layernorm, layer.post_attention_layernorm)
        if not all(
            type(n).__name__.endswith("RMSNorm") and hasattr(n, "variance_epsilon") and n.weight.dtype == torch.float32
            for n in norms
        ):
            return False
        if type(layer.mlp.act_fn).__name__ not in ("SiLU", "SiLUActivation"):
            return False
        head_dim = layer.self_attn.head_dim
        if head_dim % 2 or head_dim > MAX_HEAD_DIM:
            return False
    return True


def add_rms_norm(lib, x: torch.Tensor, delta: torch.Tensor | None, norm) -> tuple[torch.Tensor, torch.Tensor]:
    """(x + delta, RMSNorm of it) for x, delta [1, n, C] contiguous fp32 (x itself and its norm without delta)."""
    total = x if delta is None else torch.empty_like(x)
    out = torch.empty_like(x)
    lib.add_rms_norm(
        x.shape[1],
        x.shape[2],
        x.data_ptr(),
        None if delta is None else delta.data_ptr(),
        norm.weight.data_ptr(),
        norm.variance_epsilon,
        None if delta is None else total.data_ptr(),
        out.data_ptr(),
        torch.get_num_threads(),
    )
    return total, out


def rotary(lib, qkv: torch.Tensor, heads: int, kv_heads: int, head_dim: int, cos, sin) -> None:
    """Rotate the query and key heads of qkv [1, n, (heads + 2 kv_heads) head_dim] in place (cos, sin [1, n, d])."""
    rows, width, threads = qkv.shape[1], qkv.shape[2], torch.get_num_threads()
    cos, sin = cos.contiguous(), sin.contiguous()
    lib.rotary(rows, heads, head_dim, qkv.data_ptr(), width, cos.data_ptr(), sin.data_ptr(), threads)
    keys = qkv.data_ptr() + heads * head_dim * qkv.element_size()
    lib.rotary(rows, kv_heads, head_dim, keys, width, cos.data_ptr(), sin.data_ptr(), threads)


def silu_mul(lib, gate_up: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) * up for gate_up [1, n, 2 I] (gate first) -> [1, n, I]."""
    rows, width = gate_up.shape[1], gate_up.shape[2] // 2
    out = gate_up.new_empty(1, rows, width)
    lib.silu_mul(rows, width, gate_up.data_ptr(), out.data_ptr(), torch.get_num_threads())
    return out
