"""Runner: owns one causal LM and its KV cache. The only place that calls the model's forward pass."""
from __future__ import annotations

import contextlib
import os

import torch
from transformers import DynamicCache

from .errors import LeapDecodeError
from .kernels import argmax_logits, install_argmax_head, install_packed_linear, packed_kernels
from .kv_buffer import buffered_cache

GQA_SWITCH = "TRANSFORMERS_SDPA_FORCE_GQA"  # read by transformers' sdpa_attention_forward at every call


class Runner:
    """Prefill a prompt, feed any number of new tokens at once, and roll back rejected positions.

    `position` counts the tokens the model has seen (the next token's position id). It equals the KV cache length
    unless a KV press dropped entries, which is why position ids are always passed explicitly.
    A `press` (see leapdecode.kv) may compress the cache during prefill; decoding and rollback work the same after it.
    `packed_weights` runs the linear layers on pre-packed weights (see install_packed_linear); False keeps HF's.
    With `argmax_only` (greedy decoding reads nothing else), returned logits are faithful only in their argmax: the
    output head may then run in bf16 under a proven error bound (kernels.ArgmaxOutputHead).
    With `keep_hidden`, `hidden` holds the final-norm hidden states of the rows of the last returned logits (what a
    draft head drafts from), or None when the forward did not pass the final norm (a KV press prefill may not).
    """

    def __init__(self, model: torch.nn.Module, press=None, packed_weights: bool = True):
        self.model = model
        self.press = press
        self.packed_weights = packed_weights
        if packed_weights:
            install_packed_linear(model)
            install_argmax_head(model)
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
            with self._kernels(), _final_norm_output(self) as captured:
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

    @contextlib.contextmanager
    def _kernels(self):
        """What Runner forwards switch on: packed weights, the argmax-only output head, grouped-query attention."""
        with packed_kernels(self.packed_weights), argmax_logits(self.argmax_only), _grouped_query_attention():
            yield

    def _ids(self, token_ids: list[int]) -> torch.Tensor:
        return torch.tensor([token_ids], dtype=torch.long)

    def _forward(self, token_ids: list[int], logits_to_keep: int) -> torch.Tensor:
        n = len(token_ids)
        past = self.cache_length
        with self._kernels(), _final_norm_output(self) as captured:
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
def _grouped_query_attention():
    """HF's SDPA attention repeats every key/value head for its query heads (a copy of the whole KV cache per layer)
    whenever a mask is passed, i.e. for every forward of more than one token over a cache; torch's SDPA takes grouped
    heads directly (`enable_gqa`), which HF uses under this switch. Same attention, no copy: a 5-token forward over
    1,200 cached tokens of SmolLM2-135M took 62 instead of 73 ms (1 thread). Scoped to Runner forwards."""
    saved = os.environ.get(GQA_SWITCH)
    os.environ[GQA_SWITCH] = "1"
    try:
        yield
    finally:
        if saved is None:
            del os.environ[GQA_SWITCH]
        else:
            os.environ[GQA_SWITCH] = saved


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
