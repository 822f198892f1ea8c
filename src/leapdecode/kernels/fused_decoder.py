"""A decoder forward for Llama and Qwen2 models that runs the model's own modules in one flat loop.

Why: on a small model a CPU decode step spends a large share of its time outside the matrix products, in the
framework's per-module plumbing (decorators, keyword routing, mask building, output recording) and in seven separate
projections per layer. This forward calls the layers' own norms, rotary embedding, activation and output projections
directly, and reads each layer's q/k/v and gate/up projections as one product each. The fused weights are concatenated
once and the model's own parameters become views of them (same values, no memory added), so HF's forward on the same
model is unchanged.

Attention is a callback, `attend(layer, query, key, value, scaling) -> [1, H, n, d]`, so the Runner (its KV cache) and
the Engine (a flat batch of sequences) share this forward. The operations are HF's, in HF's order; only the fused
products can round differently from separate ones, as two GEMM shapes may. Models of other architectures, or whose
modules this does not recognise, keep HF's forward (`fused_decoder` returns None).
"""

from __future__ import annotations

import weakref
from typing import Callable

import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from ..models.weight_only import Q4Linear
from . import decoder_ops
from .decoder_step import NativeStep
from .install import install_packed_linear
from .packed import _eligible, _settings

ARCHITECTURES = ("llama", "qwen2")  # same layer structure and rotary helper; no q/k norms, no sliding window here
Attend = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor]
_decoders: "weakref.WeakKeyDictionary[torch.nn.Module, FusedDecoder | None]" = weakref.WeakKeyDictionary()


def fused_decoder(model: torch.nn.Module) -> FusedDecoder | None:
    """The model's FusedDecoder (built once), or None when the model is not supported or the setting is "hf"."""
    if _settings["decoder"] != "fused":
        return None
    decoder = _decoders.get(model)
    if model not in _decoders or (decoder is not None and not decoder.current()):
        _decoders[model] = FusedDecoder(model) if supported(model) else None
    return _decoders[model]


def existing_decoder(model: torch.nn.Module) -> FusedDecoder | None:
    """The model's FusedDecoder if one was built (for reports), without building one."""
    return _decoders.get(model)


def supported(model: torch.nn.Module) -> bool:
    config, inner = model.config, getattr(model, "model", None)
    if config.model_type not in ARCHITECTURES or inner is None or model.get_output_embeddings() is None:
        return False
    if getattr(config, "use_sliding_window", False) or any(
        t != "full_attention" for t in (getattr(config, "layer_types", None) or [])
    ):
        return False
    if not all(hasattr(inner, name) for name in ("embed_tokens", "rotary_emb", "layers", "norm")):
        return False
    return all(_layer_supported(layer) for layer in inner.layers)


def _layer_supported(layer) -> bool:
    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    if attn is None or mlp is None or not hasattr(layer, "input_layernorm") or not hasattr(attn, "scaling"):
        return False
    projections = [getattr(attn, n, None) for n in ("q_proj", "k_proj", "v_proj", "o_proj")]
    projections += [getattr(mlp, n, None) for n in ("gate_proj", "up_proj", "down_proj")]
    plain = all(type(p) is torch.nn.Linear and _eligible(p.weight) for p in projections)
    return (
        hasattr(mlp, "act_fn")
        and (
            (plain and len({p.weight.dtype for p in projections}) == 1) or all(type(p) is Q4Linear for p in projections)
        )
        and _bias_alike(projections[:3])
        and _bias_alike(projections[4:6])
    )


def _bias_alike(linears) -> bool:
    return len({lin.bias is None for lin in linears}) == 1


def _fuse(linears: list[torch.nn.Linear]) -> torch.nn.Module:
    """One nn.Linear whose output is the linears' outputs side by side; each linear's weight (and bias) becomes a view
    of the fused one, so memory is not doubled and the layers' own forwards compute what they did. Q4Linear parts
    fuse into one Q4Linear (a copy: 4-bit codes are small)."""
    if type(linears[0]) is Q4Linear:
        return Q4Linear.cat(linears)
    fused = torch.nn.Linear(linears[0].in_features, sum(lin.out_features for lin in linears), device="meta")
    with torch.inference_mode(False), torch.no_grad():  # plain tensors even when built under inference mode
        fused.weight = torch.nn.Parameter(torch.cat([lin.weight for lin in linears]), requires_grad=False)
        fused.bias = None
        if linears[0].bias is not None:
            fused.bias = torch.nn.Parameter(torch.cat([lin.bias for lin in linears]), requires_grad=False)
        start = 0
        for lin in linears:
            end = start + lin.out_features
            lin.weight.data = fused.weight.data[start:end]
            if lin.bias is not None:
                lin.bias.data = fused.bias.data[start:end]
            start = end
    return fused


class FusedDecoder(torch.nn.Module):
    """The flat forward over one model. Holds the fused q/k/v and gate/up projections (as plain nn.Linear, so they get
    calibrated kernels like every other layer); the model itself is not a submodule, and its state dict is untouched."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self._model = [model]  # not registered: this module must not own the model's parameters
        layers = model.model.layers
        self.qkv = torch.nn.ModuleList(
            _fuse([layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj]) for layer in layers
        )
        self.gate_up = torch.nn.ModuleList(_fuse([layer.mlp.gate_proj, layer.mlp.up_proj]) for layer in layers)
        self.splits = [(layer.self_attn.q_proj.out_features, layer.self_attn.k_proj.out_features) for layer in layers]
        self._parts = self._projections()  # what was fused: a model whose layers are replaced since needs a new one
        for part in self._parts:
            part._leapdecode_fused_part = True  # its weight is a slice of a fused one (packed.coded_bits)
        # q4 models keep torch's operations: their bf16 products turn HF's last-bit differences into near-ties
        self.native_elementwise = type(self.qkv[0]) is not Q4Linear and decoder_ops.supports(model)
        install_packed_linear(self)
        self.native_step = NativeStep(self)
        self._rope_table: tuple[torch.Tensor, torch.Tensor] | None = None  # cos, sin [1, positions, d] (rotary)

    @property
    def model(self) -> torch.nn.Module:
        return self._model[0]

    def _projections(self) -> list[torch.nn.Module]:
        return [
            p
            for layer in self.model.model.layers
            for p in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj)
            + (layer.mlp.gate_proj, layer.mlp.up_proj)
        ]

    def current(self) -> bool:
        """Whether the model's projections are the layers fused (not replaced since) and, for plain ones, still views
        of the fused weights."""
        if any(a is not b for a, b in zip(self._projections(), self._parts)):
            return False
        for layer, qkv, gate_up in zip(self.model.model.layers, self.qkv, self.gate_up):
            attn, mlp = layer.self_attn, layer.mlp
            for fused, parts in (
                (qkv, (attn.q_proj, attn.k_proj, attn.v_proj)),
                (gate_up, (mlp.gate_proj, mlp.up_proj)),
            ):
                if type(fused) is Q4Linear:
                    continue
                start = fused.weight.data_ptr()
                for part in parts:
                    if part.weight.data_ptr() != start:
                        return False
                    start += part.weight.numel() * part.weight.element_size()
        return True

    def forward(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, layout, keep: slice | torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """input_ids, position_ids [n] -> (logits of the `keep` rows [m, V], their final-norm hidden states [m, C]).
        layout: the step's kv.slots.FlatBatch (its `attend` is each layer's attention)."""
        x, cos, sin = self.embed(input_ids, position_ids)
        stepped = self.native_step(x, cos, sin, layout)  # all layers in one native call, where it applies
        if stepped is not None:
            x = stepped
        else:
            for i in range(len(self.splits)):
                x = self.layer(i, x, cos, sin, layout.attend)
        hidden = self.model.model.norm(x)[0, keep]
        return self.model.get_output_embeddings()(hidden), hidden

    def embed(self, input_ids: torch.Tensor, position_ids: torch.Tensor):
        """input_ids, position_ids [n] -> (embeddings [1, n, C], rotary cos and sin for those positions)."""
        x = self.model.model.embed_tokens(input_ids[None])
        return (x, *self.rotary(x, position_ids))

    def rotary(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The model's own rotary cos and sin [1, n, d] for the positions. Where its frequencies are fixed they are
        rows of a table that the model's rotary embedding filled once for many positions (its forward per step is a
        dozen small operations: a tenth of a millisecond, a few percent of a one-token step); each value is an
        elementwise function of one position, so a table row has the bits a call for that position alone gives.
        Rotaries that rescale with the sequence length ("dynamic", "longrope") are called every step."""
        rope = self.model.model.rotary_emb
        kind = str(getattr(rope, "rope_type", "default"))
        if "dynamic" in kind or kind == "longrope":
            return rope(x, position_ids[None])
        table = self._rope_table
        top = int(position_ids.max()) + 1 if position_ids.numel() else 0
        if table is None or table[0].shape[1] < top or table[0].dtype != x.dtype:
            size = max(top, 2 * table[0].shape[1] if table is not None else 1024)
            table = self._rope_table = rope(x[:, :1], torch.arange(size)[None])
        return table[0][:, position_ids], table[1][:, position_ids]

    def layer(self, i: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend: Attend) -> torch.Tensor:
        """Decoder layer i over x [1, n, C] (a KV press runs the layers one by one, on fewer tokens past a point)."""
        q, k, v = self.attention_inputs(i, x, cos, sin)
        return self.after_attention(i, x, attend(i, q, k, v, self.model.model.layers[i].self_attn.scaling))

    def attention_inputs(self, i: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """Layer i up to attention: x [1, n, C] -> query [1, H, n, d], key and value [1, KVH, n, d]."""
        layer, (q_width, kv_width) = self.model.model.layers[i], self.splits[i]
        head_dim = layer.self_attn.head_dim
        shape = (1, x.shape[1], -1, head_dim)
        lib = self._native(x)
        if lib is None:
            q, k, v = self.qkv[i](layer.input_layernorm(x)).split([q_width, kv_width, kv_width], dim=-1)
            q, k = apply_rotary_pos_emb(q.view(shape).transpose(1, 2), k.view(shape).transpose(1, 2), cos, sin)
            return q, k, v.view(shape).transpose(1, 2)
        qkv = self.qkv[i](decoder_ops.add_rms_norm(lib, x, None, layer.input_layernorm)[1]).contiguous()
        decoder_ops.rotary(lib, qkv, q_width // head_dim, kv_width // head_dim, head_dim, cos, sin)
        q, k, v = qkv.split([q_width, kv_width, kv_width], dim=-1)
        return q.view(shape).transpose(1, 2), k.view(shape).transpose(1, 2), v.view(shape).transpose(1, 2)

    def after_attention(self, i: int, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """Layer i from attention's output [1, H, n, d] on: output projection, MLP, both residuals."""
        layer = self.model.model.layers[i]
        attended = layer.self_attn.o_proj(out.transpose(1, 2).reshape(1, x.shape[1], -1))
        mlp, lib = layer.mlp, self._native(x)
        if lib is None:
            x = x + attended
            gate, up = self.gate_up[i](layer.post_attention_layernorm(x)).chunk(2, dim=-1)  # Llama's are equal
            return x + mlp.down_proj(mlp.act_fn(gate) * up)
        x, normed = decoder_ops.add_rms_norm(lib, x, attended.contiguous(), layer.post_attention_layernorm)
        return x + mlp.down_proj(decoder_ops.silu_mul(lib, self.gate_up[i](normed).contiguous()))

    def _native(self, x: torch.Tensor):
        """The native elementwise library where this forward may use it on x (contiguous fp32 rows), else None."""
        if not self.native_elementwise or x.dtype != torch.float32 or not x.is_contiguous():
            return None
        return decoder_ops.library()
