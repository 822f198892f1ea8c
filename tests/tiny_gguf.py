"""A tiny random Llama model written as a GGUF file with gguf's own GGUFWriter (fp32 tensors, a llama-style
tokenizer in the metadata), optionally with a tensor left out or cut short: what a broken download or converter
leaves."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM

VOCAB, HIDDEN, INTERMEDIATE, LAYERS, HEADS, KV_HEADS, CONTEXT = 32, 16, 32, 2, 4, 2, 64
_LAYER_TENSORS = (
    ("self_attn.q_proj", "attn_q"),
    ("self_attn.k_proj", "attn_k"),
    ("self_attn.v_proj", "attn_v"),
    ("self_attn.o_proj", "attn_output"),
    ("mlp.gate_proj", "ffn_gate"),
    ("mlp.up_proj", "ffn_up"),
    ("mlp.down_proj", "ffn_down"),
    ("input_layernorm", "attn_norm"),
    ("post_attention_layernorm", "ffn_norm"),
)


def tiny_llama(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=CONTEXT,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
    )
    return LlamaForCausalLM(config).eval()


def _to_gguf_rotary(t: torch.Tensor, heads: int) -> torch.Tensor:
    """HF's q/k row order -> llama.cpp's (transformers' GGUF loader undoes this)."""
    return t.reshape(heads, 2, t.shape[0] // heads // 2, *t.shape[1:]).swapaxes(1, 2).reshape(t.shape)


def write_tiny_gguf(path: Path, model: LlamaForCausalLM, drop: tuple[str, ...] = (), cut: tuple[str, ...] = ()) -> Path:
    """Write `model` to `path` as GGUF; tensors named in `drop` (GGUF names, e.g. "blk.1.ffn_up.weight") are left
    out, those in `cut` lose their last row."""
    import gguf

    names = {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }
    for i in range(LAYERS):
        for hf, name in _LAYER_TENSORS:
            names[f"model.layers.{i}.{hf}.weight"] = f"blk.{i}.{name}.weight"
    unknown = (set(drop) | set(cut)) - set(names.values())
    assert not unknown, f"no such tensor: {unknown}"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny")
    writer.add_context_length(CONTEXT)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(INTERMEDIATE)
    writer.add_block_count(LAYERS)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(10000.0)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(["<unk>", "<s>", "</s>"] + [f"\u2581w{i}" for i in range(VOCAB - 3)])
    writer.add_token_scores([0.0] * 3 + [-float(i) for i in range(VOCAB - 3)])
    writer.add_token_types([2, 3, 3] + [1] * (VOCAB - 3))
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    state = model.state_dict()
    for hf, name in names.items():
        if name in drop:
            continue
        tensor = state[hf]
        if name.endswith("attn_q.weight"):
            tensor = _to_gguf_rotary(tensor, HEADS)
        elif name.endswith("attn_k.weight"):
            tensor = _to_gguf_rotary(tensor, KV_HEADS)
        array = tensor.numpy().astype(np.float32)
        writer.add_tensor(name, array[:-1] if name in cut else array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
