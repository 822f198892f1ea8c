"""The precision a draft head drafts in: whichever of fp32, bf16 and int8 weights steps it fastest on this host.

A draft head's step (a few products of one row through ~5M weights, then ~2.4M more for its slice of the output
head) is bound by reading those weights, and drafting is a tenth of a speculative step at one stream. Its precision
changes which tokens it proposes a little, never the output (the target verifies every token), so the fastest is the
right one. Which is fastest depends on the host: bf16 products pay where the CPU has bf16 arithmetic, or where
reading half the bytes outweighs converting them; int8 weights (one scale per output row, products on bf16
activations through torch's weight-only int8 kernel, as gpt-fast runs int8 on CPU) read a quarter of fp32's bytes;
q8 weights (each rounded to GGUF Q8_0's form: 8-bit codes times one fp16 scale per 32 inputs) read as few and run on
leapdecode's native kernels, which widen the codes in registers and use both cores.
So each is timed on the head itself, once per head and process (`fastest`), the way it drafts: on the routes the
drafter uses, with its weights out of the cache (a target forward runs between two drafts).

Each int8 product works row by row (a row's result does not depend on the others in the batch), so the engine's
batched drafting keeps giving each sequence the draft it would get alone.
"""

from __future__ import annotations

import copy
import time

import torch
from torch import nn

from ..kernels import install_packed_linear, packed_kernels
from ..kernels.head_step import NativeHeadStep
from ..kernels.native_linear import GROUP
from ..kernels.packed import available

FLUSH_BYTES = 64 << 20  # written between timed steps: more than a CPU's last-level cache holds


def int8_available() -> bool:
    """Whether this torch has the weight-only int8 product (a private aten op: probed, not assumed)."""
    try:
        weight = torch.ones(16, 32, dtype=torch.int8)
        out = torch._weight_int8pack_mm(
            torch.ones(1, 32, dtype=torch.bfloat16), weight, torch.ones(16, dtype=torch.bfloat16)
        )
        return bool(out.shape == (1, 16) and float(out[0, 0]) == 32.0)
    except (AttributeError, RuntimeError, NotImplementedError):
        return False


class Int8Linear(nn.Module):
    """y = x W^T (+ b) with W as int8 rows times one bf16 scale per row; x rounded to bf16, y returned in fp32."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__()
        weight = weight.detach().float()
        scales = (weight.abs().amax(dim=1) / 127).clamp_min(1e-12)
        self.register_buffer("qweight", (weight / scales[:, None]).round().clamp(-127, 127).to(torch.int8))
        self.register_buffer("scales", scales.to(torch.bfloat16))
        self.register_buffer("bias", None if bias is None else bias.detach().float())
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).to(torch.bfloat16)
        y = torch._weight_int8pack_mm(rows.contiguous(), self.qweight, self.scales).float()
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features)


def int8_head(head):
    """A copy of an attached fp32 head whose products (its layers and its output-head slice) use int8 weights; the
    norms stay fp32 and the target's tensors it borrowed stay shared."""
    quantized = copy.copy(head)  # shares the borrowed target tensors; its own modules are replaced below
    quantized._modules = dict(head._modules)
    for name in ("fuse", "gate", "up", "down"):
        layer = getattr(head, name)
        quantized._modules[name] = Int8Linear(layer.weight.float(), layer.bias)
    quantized.out_linear = Int8Linear(head.out_weight.float())
    return quantized


def q8_head(head):
    """A copy of an attached fp32 head whose products (its layers and its output-head slice) read 8-bit codes: every
    weight rounded to Q8_0's form, so that the native kernels (kernels.native_linear) find exact codes and run the
    products from them. The norms stay fp32 and the target's tensors it borrowed stay shared."""
    quantized = copy.copy(head)
    quantized._modules = dict(head._modules)
    for name in ("fuse", "gate", "up", "down"):
        quantized._modules[name] = _coded_linear(getattr(head, name).weight)
    quantized.out_linear = _coded_linear(head.out_weight)
    quantized.meta = {**head.meta, "precision": "q8"}
    install_packed_linear(quantized)
    quantized.native_step = NativeHeadStep.for_head(quantized)
    return quantized


def q8_available() -> bool:
    """Whether the native kernels that run 8-bit codes are built here."""
    return available("native-q", torch.float32)


def _coded_linear(weight: torch.Tensor) -> nn.Linear:
    groups = weight.detach().float().reshape(weight.shape[0], -1, GROUP)
    scale = (groups.abs().amax(-1, keepdim=True) / 127).half().float()
    codes = (groups / scale.clamp_min(torch.finfo(torch.float16).tiny)).round().clamp(-127, 127) + 0.0  # no -0
    layer = nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    layer.weight = nn.Parameter((scale * codes).reshape(weight.shape), requires_grad=False)
    return layer


def fastest(candidates: dict[str, object], repeats: int = 5, steps: int = 4) -> str:
    """The name of the candidate head whose one-row draft step (step + logits) measures fastest here: each timed
    `repeats` times over `steps` steps, interleaved, best time kept, on the kernels' routes as the drafter runs it
    and with the caches flushed before every step (between two drafts a target forward reads far more than they
    hold). A candidate whose step fails here is not chosen (the first candidate, the reference precision, must
    run)."""
    d = next(iter(candidates.values())).config.hidden_size
    gen = torch.Generator().manual_seed(0)
    feature, token = torch.randn(1, d, generator=gen), torch.tensor([1])
    flush = torch.zeros(FLUSH_BYTES // 4)
    best = dict.fromkeys(candidates, float("inf"))
    broken: set[str] = set()
    with torch.inference_mode(), packed_kernels(True):
        for _ in range(repeats):
            for name, head in candidates.items():
                if name in broken:
                    continue
                seconds = 0.0
                try:
                    for _ in range(steps):
                        flush += 1
                        start = time.perf_counter()
                        head.draft_step(feature, token)
                        seconds += time.perf_counter() - start
                except Exception:  # noqa: BLE001 - a private kernel refusing this shape: that precision is out
                    if name == next(iter(candidates)):
                        raise
                    broken.add(name)
                    continue
                best[name] = min(best[name], seconds)
    return min(best, key=best.get)
