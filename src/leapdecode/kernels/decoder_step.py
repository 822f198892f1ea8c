"""A fused decoder's whole step (decode, verification, prompt chunks) through every layer in one native call
(csrc/decoder_step.c).

Why: with the linear layers, norms, rotary embedding and attention each in C, what is left of a decode step's cost
beyond reading the weights is the plumbing between them: a Python call, a ctypes call and a few tensor allocations for
each of about ten operations per layer. The native step runs the same C functions in the same order from one call, so
each row gets the bits the layer-by-layer forward gives it (tested): it is an execution of the same forward, not a
second one.

It runs where every piece the layer-by-layer forward would take is native at that row count: every linear layer's
calibrated path is the panel kernel, the elementwise kernels apply to the model, and every sequence of the step
attends through the native attention kernel into its own KV buffers (up to segment_attention.MAX_ROWS new rows a
sequence). Anything else (longer prompt runs, a KV press's cache, q4 weights), or `configure(step="layers")`, runs
layer by layer.
"""

from __future__ import annotations

import ctypes
import operator
from array import array

import torch

from . import packed, segment_attention
from .native import NativeLibrary
from .settings import _settings

_i64, _ptr, _f32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float


def _enabled() -> bool:
    return _settings["step"] == "native" and _settings["attention"] == "native" and _settings["elementwise"] == "native"


_library = NativeLibrary(
    "decoder_step",
    {"decoder_step": (None, [_i64] * 7 + [_f32, _f32] + [_ptr] * 4 + [_i64, _ptr, _ptr, _i64])},
    _enabled,
    "the native decoder step",
    "decode steps run layer by layer",
)


library = _library.get  # the compiled step, built on first use; None (after a one-line notice) where it cannot be
forget = _library.forget  # check and load again on next use (tests)


def describe() -> str:
    """One line for reports."""
    if library() is not None:
        return "one native call per decode/verification step where every layer's kernels are native"
    why = _library.why_not() if _enabled() else "off by the settings"
    return f"layer by layer ({why})"


class NativeStep:
    """The addresses the native step reads, per row count, for one FusedDecoder; dropped and rebuilt when the
    kernel settings or any weight change (so that replaced weights are not kept alive)."""

    def __init__(self, decoder):
        self.decoder = decoder
        model = decoder.model
        layers = model.model.layers
        attn = layers[0].self_attn
        self.head_dim = attn.head_dim
        q_width, kv_width = decoder.splits[0]
        self.heads, self.kv_heads = q_width // self.head_dim, kv_width // self.head_dim
        self.hidden = model.config.hidden_size
        self.inter = decoder.gate_up[0].out_features // 2
        self.modules = [
            (decoder.qkv[i], layer.self_attn.o_proj, decoder.gate_up[i], layer.mlp.down_proj)
            for i, layer in enumerate(layers)
        ]
        self.norms = [(layer.input_layernorm, layer.post_attention_layernorm) for layer in layers]
        eps = {n.variance_epsilon for pair in self.norms for n in pair}
        scales = {layer.self_attn.scaling for layer in layers}
        self.eps, self.scale = next(iter(eps)), next(iter(scales))
        self.uniform = (
            decoder.native_elementwise
            and len(eps) == 1
            and len(scales) == 1
            and len(set(decoder.splits)) == 1
            and segment_attention.takes_head_dim(self.head_dim)
        )
        self._tables: dict = {}  # rows -> (addresses, what they point into) or None, for self._key
        self._key = None
        self._parameters = [m._parameters for group in self.modules + self.norms for m in group]
        self._weights: list = []  # the weights the tables were built for, and those of them with a version counter
        self._versioned: list = []

    def table(self, rows: int):
        """The per-layer addresses (ctypes array) for a step of `rows` rows, or None where some linear layer does not
        take the panel kernel at that row count. Dropped when the settings change or a weight is replaced or changed
        in place (packed._weight_key's test, checked every step: so by identity and version counter, ~0.02 ms for
        180 weights, not by data pointer)."""
        mode = packed._mode.get()
        weights = [p["weight"] for p in self._parameters]
        if len(weights) != len(self._weights) or any(map(operator.is_not, weights, self._weights)):
            self._weights, self._versioned, self._key = weights, [w for w in weights if not w.is_inference()], None
        key = (packed._epoch[0], mode, tuple(w._version for w in self._versioned))
        if key != self._key:
            self._tables, self._key = {}, key
        if rows not in self._tables:
            self._tables[rows] = self._build(rows, mode)
        return self._tables[rows]

    def _build(self, rows: int, mode):
        if not mode:
            return None
        addresses, alive = [], []
        for (qkv, out, gate_up, down), (norm_in, norm_post) in zip(self.modules, self.norms):
            parts = []
            for module in (qkv, out, gate_up, down):
                path, state = packed._route(module, rows, mode, False)
                bias = module._parameters["bias"]
                if (
                    path not in packed.NATIVE_PATHS
                    or state is None
                    or (bias is not None and bias.dtype != torch.float32)
                ):
                    return None
                bias = None if bias is None else bias.contiguous()
                coded = getattr(state, "bits", 0)  # a CodedPanels' (fp32 Panels have no codes)
                alive += [state, bias]
                parts += [
                    state.data.data_ptr(),
                    coded,
                    state.scales.data_ptr() if coded else 0,
                    0 if bias is None else bias.data_ptr(),
                ]
            norms = [n.weight.contiguous() for n in (norm_in, norm_post)]
            alive += norms
            addresses += [norms[0].data_ptr(), *parts[:8], norms[1].data_ptr(), *parts[8:]]
        return (ctypes.c_int64 * len(addresses))(*addresses), alive

    def __call__(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout) -> torch.Tensor | None:
        """x [1, n, C] (embeddings) -> the last layer's output [1, n, C], or None where the step must run layer by
        layer (nothing has been written then)."""
        if not self.uniform or x.dtype != torch.float32:
            return None
        lib = library()
        if lib is None:
            return None
        entry = self.table(x.shape[1])
        if entry is None:
            return None
        step = layout.native_step_buffers(x.new_empty(self.kv_heads, 0, self.head_dim))
        if step is None:
            return None
        segments, buffers = array("q", step[0]), array("q", step[1])
        x = x.contiguous()  # the embeddings: a tensor of this forward's own, overwritten in place
        cos, sin = cos.contiguous(), sin.contiguous()
        lib.decoder_step(
            len(self.modules),
            x.shape[1],
            self.hidden,
            self.heads,
            self.kv_heads,
            self.head_dim,
            self.inter,
            self.eps,
            self.scale,
            x.data_ptr(),
            cos.data_ptr(),
            sin.data_ptr(),
            entry[0],
            len(segments) // 3,
            segments.buffer_info()[0],
            buffers.buffer_info()[0],
            torch.get_num_threads(),
        )
        return x
