"""A q8 draft head's whole step (next feature and its scores over the vocabulary slice) in one native call
(csrc/head_step.c).

Why: a head step is about a dozen small operations on one row (or on the few rows of the engine's batched drafting).
In torch each is a Python call, a dispatch and an allocation, and at one stream that plumbing cost about as much as
the products themselves; a speculative step takes one to four head steps. The native step runs the head's formula on
the kernels the decoder step uses, from the same 8-bit codes the q8 head's products read. Its RMSNorm and SiLU round
their own way, so its drafts can differ from the torch route's in a near tie: a draft's precision changes what is
proposed, never the output (the target verifies every token). Each row is computed from its own values alone, so
batched drafting still gives each sequence the draft it gets alone.

It applies where the head's products all have exact 8-bit codes (heads.precision.q8_head) and the target's embedding
is fp32; anything else, a host where the library cannot be built, or `configure(elementwise="torch")`, keeps the
torch route.
"""

from __future__ import annotations

import ctypes

import torch

from .native import NativeLibrary
from .native_linear import CodedPanels, q8_form
from .settings import _settings

_i64, _ptr, _f32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float

_library = NativeLibrary(
    "head_step",
    {"head_step": (None, [_i64] * 4 + [_f32, _f32] + [_ptr] * 5 + [_i64])},
    lambda: _settings["elementwise"] == "native",
    "the native draft-head step",
    "the head steps in torch",
)
forget = _library.forget


class NativeHeadStep:
    """`head.step` then `head.logits` for a q8 head, as one call. Built by `for_head` only where it applies."""

    def __init__(self, head, products: list[CodedPanels]):
        self.embed = head.embed_weight
        self.norms = [norm.weight.detach().float().contiguous() for norm in (head.embed_norm, head.mlp_norm)]
        self.eps = (head.embed_norm.eps, head.mlp_norm.eps)
        self.products = products  # fuse, gate/up, down, output slice (kept alive: the table holds their addresses)
        self.hidden, self.inter, self.vocab = head.config.hidden_size, products[2].in_features, products[3].out_features
        addresses = [self.embed.data_ptr(), *(norm.data_ptr() for norm in self.norms)]
        for panels in products:
            addresses += [panels.data.data_ptr(), panels.scales.data_ptr()]
        self.table = (ctypes.c_int64 * len(addresses))(*addresses)

    @classmethod
    def for_head(cls, head) -> NativeHeadStep | None:
        """The native step of an attached head whose products are exactly 8-bit codes, or None where it does not
        apply (or the library is not built here: one-line notice)."""
        embed = head.embed_weight
        if embed is None or embed.dtype != torch.float32 or not embed.is_contiguous() or embed.device.type != "cpu":
            return None
        if any(norm.eps is None for norm in (head.embed_norm, head.mlp_norm)) or head.out_linear is None:
            return None
        weights = [head.fuse.weight, torch.cat([head.gate.weight, head.up.weight]), head.down.weight]
        forms = [q8_form(w.detach()) for w in [*weights, head.out_linear.weight]]
        if any(form is None for form in forms) or _library.get() is None:
            return None
        return cls(head, [CodedPanels(8, *form) for form in forms])

    def __call__(self, feature: torch.Tensor, token: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(next features [rows, d], their scores over the slice [rows, vocab]) for features [rows, d] and the tokens
        [rows] each steps past."""
        feature = feature.float().contiguous()
        token = token.to(torch.int64).contiguous()
        rows = feature.shape[0]
        out, scores = torch.empty(rows, self.hidden), torch.empty(rows, self.vocab)
        _library.get().head_step(
            rows,
            self.hidden,
            self.inter,
            self.vocab,
            self.eps[0],
            self.eps[1],
            feature.data_ptr(),
            token.data_ptr(),
            self.table,
            out.data_ptr(),
            scores.data_ptr(),
            torch.get_num_threads(),
        )
        return out, scores
