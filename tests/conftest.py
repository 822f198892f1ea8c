"""Shared fixtures: tiny random-weight models built in-process (no downloads), made decisive so that
floating-point near-ties between k-token and 1-token forwards cannot flip an argmax (see shared MEASURED.md)."""
from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

VOCAB = 96


def tiny_model(arch: str, seed: int, head_scale: float = 8.0, vocab: int = VOCAB) -> torch.nn.Module:
    """A 2-layer random model; its output head is scaled so logits are far apart (decisive argmax)."""
    torch.manual_seed(seed)
    common = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    if arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    else:
        model = Qwen2ForCausalLM(Qwen2Config(**common))
    with torch.no_grad():
        model.lm_head.weight.mul_(head_scale)
    return model.eval()


def noisy_copy(model: torch.nn.Module, seed: int, noise: float) -> torch.nn.Module:
    """A draft model that agrees with `model` often but not always."""
    import copy

    torch.manual_seed(seed)
    draft = copy.deepcopy(model)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(noise * p.std() * torch.randn_like(p))
    return draft.eval()


@pytest.fixture(autouse=True)
def one_thread_for_tiny_models(request):
    """Tiny matrices run fastest on one thread (several threads on a busy machine are far slower); tests of real
    models (marked slow, not tiny) keep all cores."""
    if request.node.get_closest_marker("slow") and not request.node.get_closest_marker("tiny"):
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
