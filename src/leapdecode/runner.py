"""Runner: owns one causal LM and its KV cache. The only place that calls the model's forward pass."""
from __future__ import annotations

import contextlib
import contextvars
import types
import weakref

import torch
from transformers import DynamicCache

from .errors import LeapDecodeError

_packed = contextvars.ContextVar("leapdecode_packed_linear", default=False)
# module -> ((weight pointer, version), packed weight); outside the module so that copies of a model don't carry it
_packed_weights: "weakref.WeakKeyDictionary[torch.nn.Linear, tuple]" = weakref.WeakKeyDictionary()
# oneDNN reads a packed weight faster with 4 input rows than with 1-3 (its few-row kernels stream memory worse), so
# fewer rows are zero-padded to four. Measured on AVX-512, 1 thread, whole fp32 forwards over a warm cache: Qwen2.5
# 1.5B 1 token 508 -> 425 ms, 2 tokens 639 -> 477 ms; SmolLM2-135M 1 token 58.9 -> 53.0 ms, 2 tokens 76.4 -> 60.7 ms
PAD_ROWS = 4


class Runner:
    """Prefill a prompt, feed any number of new tokens at once, and roll back rejected positions.

    `position` counts the tokens the model has seen (the next token's position id). It equals the KV cache length
    unless a KV press dropped entries, which is why position ids are always passed explicitly.
    A `press` (see leapdecode.kv) may compress the cache during prefill; decoding and rollback work the same after it.
    `packed_weights` runs the linear layers on pre-packed weights (see install_packed_linear); False keeps HF's.
    With `keep_hidden`, `hidden` holds the final-norm hidden states of the rows of the last returned logits (what a
    draft head drafts from), or None when the forward did not pass the final norm (a KV press prefill may not).
    """

    def __init__(self, model: torch.nn.Module, press=None, packed_weights: bool = True):
        self.model = model
        self.press = press
        self.packed_weights = packed_weights
        if packed_weights:
            install_packed_linear(model)
        self.cache: DynamicCache | None = None
        self.position = 0
        self.keep_hidden = False
        self.hidden: torch.Tensor | None = None

    @property
    def cache_length(self) -> int:
        return self.cache.get_seq_length() if self.cache is not None else 0

    @torch.inference_mode()
    def prefill(self, token_ids: list[int]) -> torch.Tensor:
        """Start a new sequence; return the logits [V] that predict the token after the prompt."""
        self.cache = DynamicCache(config=self.model.config)
        self.position = 0
        if self.press is not None:
            with packed_kernels(self.packed_weights), _final_norm_output(self) as captured:
                logits = self.press.prefill(self.model, self._ids(token_ids), self.cache)
            self.hidden = captured[-1][0, -1:] if captured else None
            self.position = len(token_ids)
            return logits
        return self._forward(token_ids, logits_to_keep=1)[-1]

    @torch.inference_mode()
    def forward(self, token_ids: list[int], last_only: bool = False) -> torch.Tensor:
        """Append tokens to the sequence; return logits [len(token_ids), V], row i predicting the token after i
        (only the last row with `last_only`: the output head is costly per position for large vocabularies)."""
        return self._forward(token_ids, logits_to_keep=1 if last_only else 0)

    def rollback(self, n: int) -> None:
        """Forget the last n positions (rejected draft tokens)."""
        if n > 0:
            self.cache.crop(-n)
            self.position -= n

    def _ids(self, token_ids: list[int]) -> torch.Tensor:
        return torch.tensor([token_ids], dtype=torch.long)

    def _forward(self, token_ids: list[int], logits_to_keep: int) -> torch.Tensor:
        n = len(token_ids)
        past = self.cache_length
        with packed_kernels(self.packed_weights), _final_norm_output(self) as captured:
            out = self.model(
                input_ids=self._ids(token_ids),
                past_key_values=self.cache,
                use_cache=True,
                position_ids=torch.arange(self.position, self.position + n).unsqueeze(0),
                cache_position=torch.arange(past, past + n),
                logits_to_keep=logits_to_keep,
            )
        self.position += n
        if self.keep_hidden:
            self.hidden = captured[-1][0, -out.logits.shape[1]:] if captured else None
        return out.logits[0]


@contextlib.contextmanager
def _final_norm_output(runner: Runner):
    """While active and runner.keep_hidden, collects the output of the model's final norm into the yielded list."""
    captured: list = []
    hook = None
    if runner.keep_hidden:
        norm = getattr(runner.model.get_decoder(), "norm", None)
        if norm is None:
            raise LeapDecodeError(f"{type(runner.model).__name__} has no final `norm` layer to read hidden states "
                                  "from (draft heads support Llama/Qwen2-family models)")
        hook = norm.register_forward_hook(lambda module, args, output: captured.append(output))
    try:
        yield captured
    finally:
        if hook is not None:
            hook.remove()


def install_packed_linear(model: torch.nn.Module) -> None:
    """Give the model's CPU nn.Linear layers (fp32, bf16) a copy of their weight packed once into oneDNN's blocked
    layout, used only inside Runner forwards. `F.linear` hands the GEMM a plain row-major weight that is re-laid-out
    on every call; packed once, a decode step reads the weights as they are, and verifying a few draft tokens costs
    about as much as decoding one (measured on AVX-512: README, "Kernels"). Calls outside a Runner (HF `generate`,
    the bench's baselines) keep `F.linear`. bf16 results equal `F.linear`'s bit for bit; fp32 ones differ in rounding
    (~1e-6 relative), like any other GEMM."""
    for module in model.modules():
        if type(module) is torch.nn.Linear and not hasattr(module, "_leapdecode_linear") and _packable(module.weight):
            module._leapdecode_linear = module.forward
            module.forward = types.MethodType(_packed_forward, module)


def fast_bf16() -> bool:
    """Whether this CPU runs oneDNN's bf16 kernels (AVX-512 and newer); elsewhere bf16 matmuls are slower than fp32."""
    return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def _packable(weight: torch.Tensor) -> bool:
    if weight.device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    if weight.dtype == torch.bfloat16:
        return fast_bf16()
    return weight.dtype == torch.float32


def _packed_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    if not _packed.get():
        return self._leapdecode_linear(x)
    key = (self.weight.data_ptr(), self.weight._version)  # repack if the weight was replaced or changed in place
    cached = _packed_weights.get(self)
    if cached is None or cached[0] != key:
        cached = _packed_weights[self] = (key, torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), None))
    rows = x.numel() // x.shape[-1]
    if rows >= PAD_ROWS:
        return torch.ops.mkldnn._linear_pointwise(x, cached[1], self.bias, "none", [], "")
    flat = x.reshape(rows, x.shape[-1])
    padded = torch.cat([flat, flat.new_zeros(PAD_ROWS - rows, flat.shape[1])])
    out = torch.ops.mkldnn._linear_pointwise(padded, cached[1], self.bias, "none", [], "")[:rows]
    return out.reshape(*x.shape[:-1], out.shape[-1])


class packed_kernels:
    def __init__(self, on: bool):
        self.on = on

    def __enter__(self):
        self.token = _packed.set(self.on)

    def __exit__(self, *exc):
        _packed.reset(self.token)
