"""The one forward: the target model over a flat run of rows, each with its own position, attention given by a layout.

Prefill, decode and verification of one request (the Runner), the batched engine's steps (many sequences in one
flat batch) and a draft model's drafting all run through `ModelForward`. A layout (kv.slots.FlatBatch) says which
rows belong to which sequence and owns their keys/values; the model's attention hands each layer's new keys/values to
it and gets back attention over that sequence's own past only. So the losslessness argument and the kernel choice
live here once: every row sees exactly its own sequence's past, through the same kernels, whoever asked.

Two ways to run the model, chosen once per model: leapdecode's fused decoder forward (kernels.fused_decoder: Llama
and Qwen2) or the model's own HF forward with leapdecode's attention registered through transformers'
`AttentionInterface` (every other architecture). `packed_weights=False` keeps HF's forward and `F.linear`; so does a
model on another device than the CPU (a GPU): leapdecode's kernels are CPU code that reads tensors by address.
"""

from __future__ import annotations

import contextlib

import torch

from .attention import leapdecode_attention
from .errors import LeapDecodeError
from .kernels import BUCKETS, argmax_logits, install_argmax_head, install_packed_linear, packed_kernels, whole_step
from .kernels import settings as kernel_settings
from .kernels.fused_decoder import FusedDecoder, fused_decoder
from .kv.slots import FlatBatch, Segment, SequenceKV
from .models.weight_only import has_q4_layers


class ModelForward:
    """`forward(ids, positions, layout, keep)` -> (logits of the `keep` rows, their final-norm hidden states or None).

    `argmax_only`: the caller reads only the argmax of the logits (greedy), so the output head may run in bf16 under a
    proven error bound (kernels.ArgmaxOutputHead). `hidden`: return the final-norm hidden states of the kept rows
    (what a draft head drafts from)."""

    def __init__(self, model: torch.nn.Module, packed_weights: bool = True):
        self.model = model
        self.packed_weights = packed_weights and on_cpu(model)
        self.decoder = prepare_model(model, self.packed_weights)
        self.rows_alone = rows_alone(model)
        if self.decoder is not None and not self.rows_alone and kernel_settings()["linear"] == "auto":
            whole_step.check(model, whole_step.layers_of(model, self.decoder), self._scratch_forward)

    @torch.inference_mode()
    def __call__(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        layout,
        keep: torch.Tensor,
        *,
        argmax_only: bool = False,
        hidden: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        layout.rows_alone, layout.native_attention = self.rows_alone, self.packed_weights
        with model_kernels(self.model, self.packed_weights, argmax_only, layout):
            if self.decoder is not None:
                logits, states = self.decoder(ids, positions, layout, keep)
                return logits, states if hidden else None
            with final_norm_output(self.model, hidden) as captured:
                logits = self.model(
                    input_ids=ids[None], use_cache=False, position_ids=positions[None], logits_to_keep=keep
                ).logits[0]
            return logits, captured[-1][0, keep] if captured else None

    def _scratch_forward(self, past: int = 128):
        """forward(rows): one greedy forward of `rows` new rows after `past` others, on keys/values of its own (what
        whole_step.check times)."""
        layers, vocab = self.model.config.num_hidden_layers, self.model.get_input_embeddings().num_embeddings
        ids = torch.randint(0, vocab, (past + BUCKETS[-1],), generator=torch.Generator().manual_seed(0))
        kv = SequenceKV(layers)
        self(ids[:past], torch.arange(past), FlatBatch([Segment(kv, 0, past, 0)]), torch.arange(past - 1, past))

        def forward(rows: int) -> None:
            layout = FlatBatch([Segment(kv, 0, rows, past)])
            self(ids[past : past + rows], torch.arange(past, past + rows), layout, torch.arange(rows), argmax_only=True)
            kv.truncate(past)

        return forward


def on_cpu(model: torch.nn.Module) -> bool:
    """Whether the model's weights are in CPU memory, where leapdecode's native kernels can read them."""
    return next(model.parameters()).device.type == "cpu"


def rows_alone(model: torch.nn.Module) -> bool:
    """Whether new rows of a sequence with a past attend one call per row (kv.slots.FlatBatch.rows_alone) and the
    engine reads each prompt in one call (engine.scheduler): for models whose other operations give a row the same
    bits whatever the row count, rounded in bf16 (q4 weights, models.weight_only), where a last-bit difference
    between two ways of computing a row flips near-ties often enough to matter."""
    return has_q4_layers(model)


def prepare_model(model: torch.nn.Module, packed_weights: bool) -> FusedDecoder | None:
    """Give the model's layers the kernels leapdecode's forwards may switch on (once per model); returns the fused
    decoder forward to run the model with, or None for the model's own forward."""
    if not packed_weights:
        return None
    fused = fused_decoder(model)  # first: fusing moves the q/k/v and gate/up weights, which installing reads
    install_packed_linear(model)
    install_argmax_head(model)
    return fused


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
