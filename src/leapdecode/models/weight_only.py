"""Weight-only int4 linear layers ("q4"): weights in groups of 32 along the input, each group a scale and a minimum
with 4-bit codes (GGUF Q4_1's layout), products by torch's int4 CPU kernel on bf16 activations.

Why: a one-stream CPU decode step is bound by reading the weights; 4-bit codes read about a seventh of fp32's bytes.
The packaged models are Q4_1 GGUF files: requantizing their fp32-dequantized weights in groups of 32 (minimum and
range per group) gives back the stored codes, so "q4" runs those weights much as stored; only the group scales and
minimums are rounded to bf16, the kernel's format. The output head (which GGUF files keep at 8 bits, Q8_0) becomes
int8 per output row (Int8Linear), also on bf16 activations.

A q4 model is a model of its own: every nn.Linear is replaced by a Q4Linear, so HF's forward on it (HF `generate`,
the reference of the equality tests) computes the same products as leapdecode's forwards. The kernel computes each
output row from that row's input alone (the same bits whatever the row count, checked in the tests), and a fused
product equals its parts side by side, so verifying k drafted rows gives the same logits as k single-row steps.
"""

from __future__ import annotations

import torch

from ..errors import LeapDecodeError

GROUP = 32  # Q4_1's block size
INNER_K_TILES = 8  # torch's CPU int4 packing parameter
_check: list[str | None] = []  # [why not] once checked; [None] when the ops work


class WeightOnlyLinear(torch.nn.Module):
    """What Q4Linear and Int8Linear share: the input flattened to rows and cast to bf16 (the kernels' input type),
    the product (`_product`, per kind), the result back in the input's dtype and the bias added after."""

    in_features: int
    out_features: int
    bias: torch.nn.Parameter | None

    def _product(self, flat: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self._product(x.reshape(-1, self.in_features).to(torch.bfloat16)).to(x.dtype)
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features)


class Q4Linear(WeightOnlyLinear):
    """y = x @ dequant(W).T + b with W stored as packed 4-bit codes, a bf16 scale and offset per group of 32 inputs."""

    def __init__(self, codes: torch.Tensor, scales_zeros: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.out_features, self.in_features = codes.shape[0], codes.shape[1] * 2
        # two codes a byte, [out, in / 2] uint8: the host-independent form, from which fused layers are packed (torch's
        # packed layout interleaves blocks of rows whose size depends on the CPU, so packed rows can't be joined)
        self.register_buffer("codes", codes)
        self.register_buffer("packed", torch.ops.aten._convert_weight_to_int4pack_for_cpu(unpack(codes), INNER_K_TILES))
        self.register_buffer("scales_zeros", scales_zeros)  # [in / GROUP, out, 2] bf16: scale, value of code 8
        self.bias = None if bias is None else torch.nn.Parameter(bias, requires_grad=False)

    @classmethod
    def quantize(cls, linear: torch.nn.Linear) -> Q4Linear:
        codes, scales_zeros = quantize_groups(linear.weight.detach().float())
        bias = None if linear.bias is None else linear.bias.detach().float().clone()
        return cls(codes[:, 0::2].to(torch.uint8) | (codes[:, 1::2].to(torch.uint8) << 4), scales_zeros, bias)

    @classmethod
    def cat(cls, parts: list[Q4Linear]) -> Q4Linear:
        """One layer whose outputs are the parts' outputs side by side: their codes, scales and offsets joined row
        by row, so the products equal the parts' bit for bit (each output row is computed from its own weight row)."""
        bias = None if parts[0].bias is None else torch.cat([p.bias for p in parts])
        scales_zeros = torch.cat([p.scales_zeros for p in parts], dim=1)
        return cls(torch.cat([p.codes for p in parts]), scales_zeros, bias)

    def _product(self, flat: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._weight_int4pack_mm_for_cpu(flat, self.packed, GROUP, self.scales_zeros)

    @property
    def weight(self) -> torch.Tensor:
        """The weight [out, in] the kernel multiplies by, dequantized to fp32 (made on each access: for readers of a
        layer's weight such as a draft head, tests and reports)."""
        codes = unpack(self.codes).float().reshape(self.out_features, -1, GROUP)
        scale, zero = self.scales_zeros.float().transpose(0, 1).unbind(-1)
        return ((codes - 8) * scale[..., None] + zero[..., None]).reshape(self.out_features, self.in_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, q4 groups of {GROUP}"


class Int8Linear(WeightOnlyLinear):
    """y = x @ (scale * W).T + b with W int8 per output row (symmetric, scale = max |w| / 127), bf16 activations: the
    output head of a q4 model (GGUF files store it at 8 bits, Q8_0)."""

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach().float()
        scale = (weight.abs().amax(1) / 127).clamp_min(torch.finfo(torch.float32).tiny)
        self.register_buffer("weight8", torch.round(weight / scale[:, None]).clamp(-127, 127).to(torch.int8))
        self.register_buffer("scales", scale.to(torch.bfloat16))
        self.bias = None if linear.bias is None else torch.nn.Parameter(linear.bias.detach().float().clone(), False)

    def _product(self, flat: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._weight_int8pack_mm(flat, self.weight8, self.scales)

    @property
    def weight(self) -> torch.Tensor:
        """The weight [out, in] dequantized (fp32, made on each access, as Q4Linear.weight)."""
        return self.weight8.float() * self.scales.float()[:, None]

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 per row"


def unpack(codes: torch.Tensor) -> torch.Tensor:
    """[out, in / 2] uint8, two codes a byte (low nibble first) -> [out, in] int32 codes 0..15."""
    return torch.stack([codes & 15, codes >> 4], -1).reshape(codes.shape[0], -1).to(torch.int32)


def quantize_groups(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """weight [out, in] fp32 -> (codes [out, in] int32 in 0..15, scales_zeros [in / GROUP, out, 2] bf16) such that
    w ≈ (code - 8) * scale + zero. Per group: scale = (max - min) / 15, code = round((w - min) / scale), the Q4_1 rule,
    so a weight dequantized from Q4_1 blocks gets its codes back."""
    out, inp = weight.shape
    groups = weight.reshape(out, inp // GROUP, GROUP)
    low, high = groups.amin(-1), groups.amax(-1)
    scale = (high - low) / 15
    scale_bf16 = scale.to(torch.bfloat16)
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    codes = torch.round((groups - low[..., None]) / safe[..., None]).clamp(0, 15).to(torch.int32)
    zero = (low + 8 * scale_bf16.float()).to(torch.bfloat16)
    scales_zeros = torch.stack([scale_bf16, zero], -1).transpose(0, 1).contiguous()
    return codes.reshape(out, inp), scales_zeros


def eligible(linear: torch.nn.Module) -> bool:
    """An nn.Linear the int4 kernel takes: inputs in whole groups, outputs a multiple of 16 (its packing's minimum)."""
    return (
        type(linear) is torch.nn.Linear
        and linear.in_features % GROUP == 0
        and linear.out_features % 16 == 0
        and linear.weight.device.type == "cpu"
    )


def q4_unavailable() -> str | None:
    """Why torch's int4 CPU kernels can't run here (None when they exist and compute the dequantized product)."""
    if not _check:
        try:
            weight = torch.linspace(-1, 1, 64 * 64).reshape(64, 64)
            layer = Q4Linear.quantize(_with_weight(weight))
            x = torch.linspace(-1, 1, 3 * 64).reshape(3, 64)
            want = x.bfloat16().float() @ layer.weight.T
            got = layer(x)
            _check.append(None if torch.allclose(got, want, rtol=2e-2, atol=2e-2) else "wrong results")
        except (RuntimeError, AttributeError, NotImplementedError) as e:
            _check.append(f"{type(e).__name__}: {str(e).splitlines()[0][:120]}")
    return _check[0]


def _with_weight(weight: torch.Tensor) -> torch.nn.Linear:
    linear = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False).requires_grad_(False)
    linear.weight.copy_(weight)
    return linear


def quantize_q4(model: torch.nn.Module) -> torch.nn.Module:
    """Replace the model's eligible nn.Linear layers by Q4Linear and its output head by Int8Linear, in place; returns
    the model. Raises a one-line error where torch's int4 CPU kernels are unavailable."""
    why = q4_unavailable()
    if why is not None:
        raise LeapDecodeError(f"q4 weights need torch's int4 CPU kernels, unavailable here ({why}); use float32")
    head = model.get_output_embeddings()
    with torch.no_grad():
        for parent in list(model.modules()):
            for name, child in list(parent.named_children()):
                if child is head and type(child) is torch.nn.Linear:
                    setattr(parent, name, Int8Linear(child))
                elif eligible(child):
                    setattr(parent, name, Q4Linear.quantize(child))
    if getattr(model.config, "tie_word_embeddings", False):
        model.config.tie_word_embeddings = False  # the head is an int8 copy now; the embedding stays as it was
    return model


def has_q4_layers(model: torch.nn.Module) -> bool:
    """Whether quantize_q4 has run on the model."""
    return any(isinstance(m, WeightOnlyLinear) for m in model.modules())
