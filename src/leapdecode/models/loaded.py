"""A loaded model: an HF causal LM in eval mode with its tokenizer, checked once for what leapdecode needs of it (its
attention through transformers' AttentionInterface, a KV cache rollback can shorten, a known context)."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import LeapDecodeError


@dataclass
class LoadedModel:
    """A model in eval mode on CPU with its tokenizer; ``name`` is the short name or the spec given."""

    model: "transformers.PreTrainedModel"  # noqa: F821
    tokenizer: "transformers.PreTrainedTokenizerBase"  # noqa: F821
    name: str
    path: str

    def __post_init__(self) -> None:
        problem = unsupported_reason(self.model)
        if problem:
            raise LeapDecodeError(problem if problem.startswith(self.name) else f"{self.name}: {problem}")

    @property
    def context_length(self) -> int:
        """The model's maximum context (``config.max_position_embeddings``), or its attention's sliding window where
        that is shorter: leapdecode's attention attends to every earlier position, which is the model's own
        attention only while the sequence fits in the window."""
        config = self.model.config
        window = sliding_window(config)
        context = int(config.max_position_embeddings)
        return min(context, window) if window else context

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """Every token id that ends generation: the generation config's eos ids, then the tokenizer's."""
        config = getattr(self.model, "generation_config", None)
        eos = config.eos_token_id if config is not None else None
        ids = list(eos) if isinstance(eos, (list, tuple)) else ([] if eos is None else [int(eos)])
        if getattr(self.tokenizer, "eos_token_id", None) is not None and self.tokenizer.eos_token_id not in ids:
            ids.append(self.tokenizer.eos_token_id)
        return tuple(ids)


def unsupported_reason(model) -> str | None:
    """Why leapdecode cannot run `model` exactly (None when it can): it needs a decoder-only model whose attention goes
    through transformers' AttentionInterface (leapdecode's attention replaces it, for the Engine's flat batch too) over a
    KV cache that rollback can shorten, and a context length in its config."""
    config = getattr(model, "config", None)
    kind = type(model).__name__
    if config is None:
        return f"{kind} is not a transformers model"
    if getattr(config, "is_encoder_decoder", False):
        return f"{kind} is an encoder-decoder model; leapdecode runs decoder-only causal LMs"
    if not getattr(type(model), "_supports_attention_backend", False):
        return (
            f"{kind} ({config.model_type}) does not run its attention through transformers' AttentionInterface "
            "(a recurrent state or an attention of its own), which leapdecode's batching and rollback need"
        )
    if not isinstance(getattr(config, "max_position_embeddings", None), int):
        return f"{kind} ({config.model_type}) has no max_position_embeddings in its config: its context is unknown"
    return None


def sliding_window(config) -> int | None:
    """The window of the model's sliding-window attention layers, or None where no layer uses one."""
    window = getattr(config, "sliding_window", None)
    if not isinstance(window, int) or getattr(config, "use_sliding_window", True) is False:
        return None
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None and "sliding_attention" not in layer_types:
        return None
    return window
