"""Runner: owns one causal LM and its KV cache. The only place that calls the model's forward pass."""

from __future__ import annotations

import contextlib

import torch
from transformers import DynamicCache

from .attention import causal_mask, grouped_sdpa, leapdecode_attention
from .compat import cache_arg
from .errors import LeapDecodeError
from .kernels import argmax_logits, install_argmax_head, install_packed_linear, packed_kernels
from .kernels.fused_decoder import FusedDecoder, fused_decoder
from .kv.buffered import buffered_cache


class Runner:
    """Prefill a prompt, feed any number of new tokens at once, and roll back rejected positions.

    `position` counts the tokens the model has seen (the next token's position id). It equals the KV cache length
    unless a KV press dropped entries, which is why position ids are always passed explicitly.
    A `press` (see leapdecode.kv) may compress the cache during prefill; decoding and rollback work the same after it.
    `packed_weights` runs the model through leapdecode's kernels: the fused decoder forward where the model is
    supported (kernels.fused_decoder) and the calibrated linear paths (install_packed_linear); False keeps HF's
    forward and `F.linear`.
    With `argmax_only` (greedy decoding reads nothing else), returned logits are faithful only in their argmax: the
    output head may then run in bf16 under a proven error bound (kernels.ArgmaxOutputHead).
    With `keep_hidden`, `hidden` holds the final-norm hidden states of the rows of the last returned logits (what a
    draft head drafts from), or None when the forward did not pass the final norm (a KV press prefill may not).
    """

    def __init__(self, model: torch.nn.Module, press=None, packed_weights: bool = True):
        self.model = model
        self.press = press
        self.packed_weights = packed_weights
        self.decoder = prepare_model(model, packed_weights)
        self.argmax_only = False
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
        self.cache = buffered_cache(self.model.config)
        self.position = 0
        if self.press is not None:
            with self._kernels(), final_norm_output(self.model, self.keep_hidden) as captured:
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

    def _kernels(self):
        return model_kernels(self.model, self.packed_weights, self.argmax_only)

    def _ids(self, token_ids: list[int]) -> torch.Tensor:
        return torch.tensor([token_ids], dtype=torch.long, device=self.device)

    @property
    def device(self) -> torch.device:
        return self.model.device

    def _forward(self, token_ids: list[int], logits_to_keep: int) -> torch.Tensor:
        n = len(token_ids)
        past = self.cache_length
        if self.decoder is not None:
            return self._fused_forward(token_ids, past, logits_to_keep)
        with self._kernels(), final_norm_output(self.model, self.keep_hidden) as captured:
            out = self.model(
                input_ids=self._ids(token_ids),
                **cache_arg(self.cache),
                use_cache=True,
                position_ids=torch.arange(self.position, self.position + n, device=self.device).unsqueeze(0),
                cache_position=torch.arange(past, past + n, device=self.device),
                logits_to_keep=logits_to_keep,
            )
        self.position += n
        if self.keep_hidden:
            self.hidden = captured[-1][0, -out.logits.shape[1] :] if captured else None
        return out.logits[0]

    def _fused_forward(self, token_ids: list[int], past: int, logits_to_keep: int) -> torch.Tensor:
        n = len(token_ids)
        mask = causal_mask(n, past + n, self.device)[None, None] if n > 1 else None

        def attend(layer, query, key, value, scaling):
            keys, values = self.cache.update(key, value, layer)
            return grouped_sdpa(query, keys, values, mask, scaling)

        positions = torch.arange(self.position, self.position + n, device=self.device)
        with self._kernels():
            logits, hidden = self.decoder(self._ids(token_ids)[0], positions, attend, slice(-logits_to_keep, None))
        self.position += n
        self.hidden = hidden if self.keep_hidden else None
        return logits


def prepare_model(model: torch.nn.Module, packed_weights: bool) -> FusedDecoder | None:
    """Give the model's layers the kernels leapdecode's forwards may switch on (once per model); returns the fused
    decoder forward to run the model with, or None for the model's own forward."""
    if not packed_weights:
        return None
    install_packed_linear(model)
    install_argmax_head(model)
    return fused_decoder(model)


@contextlib.contextmanager
def model_kernels(model: torch.nn.Module, packed_weights: bool, argmax_only: bool, layout=None):
    """What leapdecode's forwards switch on: packed weights, the argmax-only output head, and leapdecode's attention
    (grouped-query SDPA, or per-sequence attention over a flat batch `layout`); all scoped to the forward."""
    with packed_kernels(packed_weights), argmax_logits(argmax_only), leapdecode_attention(model, layout):
        yield


@contextlib.contextmanager
def final_norm_output(model: torch.nn.Module, enabled: bool):
    """While active and enabled, collects the output of the model's final norm into the yielded list."""
    captured: list = []
    hook = None
    if enabled:
        norm = getattr(model.get_decoder(), "norm", None)
        if norm is None:
            raise LeapDecodeError(
                f"{type(model).__name__} has no final `norm` layer to read hidden states "
                "from (draft heads support Llama/Qwen2-family models)"
            )
        hook = norm.register_forward_hook(lambda module, args, output: captured.append(output))
    try:
        yield captured
    finally:
        if hook is not None:
            hook.remove()
