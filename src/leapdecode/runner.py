"""Runner: owns one causal LM and its KV cache. The only place that calls the model's forward pass."""
from __future__ import annotations

import contextvars
import types

import torch
from transformers import DynamicCache

SKINNY_MAX_ROWS = 32
_skinny = contextvars.ContextVar("leapdecode_skinny_linear", default=False)


class Runner:
    """Prefill a prompt, feed any number of new tokens at once, and roll back rejected positions.

    `position` counts the tokens the model has seen (the next token's position id). It equals the KV cache length
    unless a KV press dropped entries, which is why position ids are always passed explicitly.
    A `press` (see leapdecode.kv) may compress the cache during prefill; decoding and rollback work the same after it.
    """

    def __init__(self, model: torch.nn.Module, press=None):
        self.model = model
        self.press = press
        install_skinny_linear(model)
        self.cache: DynamicCache | None = None
        self.position = 0

    @property
    def cache_length(self) -> int:
        return self.cache.get_seq_length() if self.cache is not None else 0

    @torch.inference_mode()
    def prefill(self, token_ids: list[int]) -> torch.Tensor:
        """Start a new sequence; return the logits [V] that predict the token after the prompt."""
        self.cache = DynamicCache(config=self.model.config)
        self.position = 0
        if self.press is not None:
            logits = self.press.prefill(self.model, self._ids(token_ids), self.cache)
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
        with _skinny_enabled(1 < n <= SKINNY_MAX_ROWS):
            out = self.model(
                input_ids=self._ids(token_ids),
                past_key_values=self.cache,
                use_cache=True,
                position_ids=torch.arange(self.position, self.position + n).unsqueeze(0),
                cache_position=torch.arange(past, past + n),
                logits_to_keep=logits_to_keep,
            )
        self.position += n
        return out.logits[0]


def install_skinny_linear(model: torch.nn.Module) -> None:
    """Give the model's fp32 nn.Linear layers a path for a few rows (draft verification: 2..32 tokens), active only
    inside Runner forwards. On CPU, `x @ W.T` with a handful of rows goes through a GEMM that repacks the whole weight
    matrix per call and costs ~2x a one-row product; `(W @ x.T).T` reads W once, so verifying k tokens costs close to
    decoding one. One-token forwards keep `F.linear`, exactly as plain decoding and HF `generate` compute them."""
    for module in model.modules():
        if type(module) is torch.nn.Linear and not hasattr(module, "_leapdecode_linear"):
            module._leapdecode_linear = module.forward
            module.forward = types.MethodType(_skinny_forward, module)


def _skinny_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    if not _skinny.get() or self.weight.dtype != torch.float32 or x.device.type != "cpu":
        return self._leapdecode_linear(x)
    rows = x.reshape(-1, x.shape[-1])
    y = (self.weight @ rows.T).T.reshape(*x.shape[:-1], self.weight.shape[0])
    return y if self.bias is None else y + self.bias


class _skinny_enabled:
    def __init__(self, on: bool):
        self.on = on

    def __enter__(self):
        self.token = _skinny.set(self.on)

    def __exit__(self, *exc):
        _skinny.reset(self.token)
