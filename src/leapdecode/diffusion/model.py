"""A LLaDA-style masked-diffusion transformer built from transformers' Llama components.

LLaDA (Nie et al., 2025) is a Llama-shaped transformer with *bidirectional* attention trained to predict masked tokens:
each answer token is replaced by <mask> with probability t ~ U(0, 1], and the cross-entropy on masked tokens is
weighted by 1/t, an upper bound on the negative log-likelihood. Here the layers are `LlamaDecoderLayer`s whose attention
modules have `is_causal = False` and receive no mask, so every position sees every other one.
`save_pretrained` / `from_pretrained` round-trip like any transformers model.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from transformers import LlamaConfig, PretrainedConfig, PreTrainedModel
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm, LlamaRotaryEmbedding

from ..errors import require

CHECKPOINT_DIR = Path(__file__).parent / "checkpoint"


class MaskedDiffusionConfig(PretrainedConfig):
    model_type = "leapdecode-masked-diffusion"

    def __init__(
        self,
        vocab_size: int = 50,
        hidden_size: int = 128,
        intermediate_size: int = 384,
        num_hidden_layers: int = 4,
        num_attention_heads: int = 4,
        max_position_embeddings: int = 64,
        mask_token_id: int = 1,
        pad_token_id: int = 0,
        eos_token_id: int = 2,
        rope_theta: float = 10000.0,
        rms_norm_eps: float = 1e-5,
        absolute_positions: bool = False,
        **kwargs,
    ) -> None:
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.max_position_embeddings = max_position_embeddings
        self.mask_token_id = mask_token_id
        self.rope_theta = rope_theta
        self.rms_norm_eps = rms_norm_eps
        self.absolute_positions = absolute_positions  # learned absolute position embeddings on top of RoPE
        super().__init__(pad_token_id=pad_token_id, eos_token_id=eos_token_id, **kwargs)

    def llama_config(self) -> LlamaConfig:
        cfg = LlamaConfig(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_attention_heads,
            max_position_embeddings=self.max_position_embeddings,
            rms_norm_eps=self.rms_norm_eps,
            rope_parameters={"rope_type": "default", "rope_theta": self.rope_theta},
            attention_bias=False,
            mlp_bias=False,
            hidden_act="silu",
        )
        cfg._attn_implementation = "sdpa"
        return cfg


class MaskedDiffusionLM(PreTrainedModel):
    """Tokens in, logits out: a bidirectional Llama stack with a tied-free LM head."""

    config_class = MaskedDiffusionConfig
    base_model_prefix = "dllm"
    _no_split_modules = ["LlamaDecoderLayer"]

    def __init__(self, config: MaskedDiffusionConfig) -> None:
        super().__init__(config)
        lcfg = config.llama_config()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        # the task layouts are fixed (answer region at a fixed column), so absolute positions make the positional
        # lookups (copy column j of the prompt into answer column i) direct to learn
        self.embed_positions = (
            nn.Embedding(config.max_position_embeddings, config.hidden_size)
            if getattr(config, "absolute_positions", False)
            else None
        )
        self.layers = nn.ModuleList(LlamaDecoderLayer(lcfg, i) for i in range(config.num_hidden_layers))
        for layer in self.layers:
            layer.self_attn.is_causal = False  # bidirectional: the one change that makes it a diffusion LM
        self.norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary = LlamaRotaryEmbedding(lcfg)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, LlamaRMSNorm):
            nn.init.ones_(module.weight)
        else:
            super()._init_weights(module)  # rotary inverse frequencies (non-persistent buffers)

    def forward(self, input_ids: torch.LongTensor) -> torch.Tensor:
        require(
            input_ids.shape[1] <= self.config.max_position_embeddings,
            f"canvas of {input_ids.shape[1]} tokens exceeds the model's {self.config.max_position_embeddings}",
        )
        h = self.embed_tokens(input_ids)
        pos = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0).expand(input_ids.shape[0], -1)
        if self.embed_positions is not None:
            h = h + self.embed_positions(pos)
        rope = self.rotary(h, pos)
        for layer in self.layers:
            h = layer(h, attention_mask=None, position_ids=pos, position_embeddings=rope, is_causal=False)
        return self.lm_head(self.norm(h))


def masked_diffusion_loss(
    model: MaskedDiffusionLM,
    tokens: torch.LongTensor,
    answer_mask: torch.BoolTensor,
    generator: torch.Generator | None = None,
    eps: float = 1e-3,
    weighting: str = "elbo",
    stratified: bool = False,
) -> torch.Tensor:
    """LLaDA's SFT objective: mask answer tokens with prob t ~ U(eps, 1]; CE on masked tokens.

    weighting "elbo": weighted by 1/t and normalised by each sequence's answer length (LLaDA; an upper bound on the
    NLL). weighting "tokens": the plain mean CE over all masked tokens of the batch (no 1/t; lower-variance
    gradients). stratified: one t per stratum of [eps, 1] (t_i = (i + u_i) / B, shuffled) instead of i.i.d. t, so every
    batch covers all masking rates."""
    require(weighting in ("elbo", "tokens"), f"unknown loss weighting {weighting!r} (elbo or tokens)")
    b = tokens.shape[0]
    u = torch.rand(b, 1, generator=generator)
    if stratified:
        perm = torch.randperm(b, generator=generator).unsqueeze(1)
        u = (perm + u) / b
    t = eps + (1 - eps) * u
    masked = (torch.rand(tokens.shape, generator=generator) < t) & answer_mask
    noisy = torch.where(masked, torch.full_like(tokens, model.config.mask_token_id), tokens)
    logits = model(noisy)
    ce = nn.functional.cross_entropy(logits.transpose(1, 2), tokens, reduction="none")
    if weighting == "tokens":
        return (ce * masked).sum() / masked.sum().clamp(min=1)
    per_seq = (ce * masked / t).sum(1) / answer_mask.sum(1).clamp(min=1)
    return per_seq.mean()


def load_model(path: str | Path | None = None) -> MaskedDiffusionLM:
    """Load a saved model (default: the checkpoint shipped with leapdecode), in eval mode."""
    path = Path(path) if path else CHECKPOINT_DIR
    require((path / "config.json").is_file(), f"no model checkpoint at {path} (expected config.json there)")
    model = MaskedDiffusionLM.from_pretrained(path, dtype=torch.float32)
    return model.eval()
