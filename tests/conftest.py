"""Shared fixtures: tiny random-weight models built in-process (no downloads).

Their output head is scaled (by 8 by default). That sharpens the sampling distributions; it does NOT remove ties:
multiplying by a power of two is exact in floating point, so a scaled model has the same argmax ties and the same
relative top-2 margins as the unscaled one. Greedy equality tests hold on these models because random heads seldom put
two logits within rounding of each other; tests/test_ties.py builds exact ties (duplicated head rows) and near-ties
(rows one ulp apart) on purpose and checks what happens there."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

VOCAB = 96


def tiny_model(arch: str, seed: int, head_scale: float = 8.0, vocab: int = VOCAB) -> torch.nn.Module:
    """A 2-layer random model; its output head is scaled by `head_scale` (sharper sampling laws; ties unchanged).
    An arch ending in "-q4" ("qwen2-q4") is that model with q4 weights (models.weight_only)."""
    if arch.endswith("-q4"):
        from leapdecode.models.weight_only import quantize_q4

        return quantize_q4(tiny_model(arch.removesuffix("-q4"), seed, head_scale, vocab))
    torch.manual_seed(seed)
    common = dict(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
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


@pytest.fixture
def native_linear_lib():
    """The native linear kernel's library, or a skip naming why it is unavailable here."""
    from leapdecode.kernels import native_linear

    if native_linear.library() is None:
        pytest.skip(f"native linear kernel unavailable here: {native_linear.why_not()}")
    return native_linear.library()


@pytest.fixture
def private_calibration(tmp_path, monkeypatch):
    """Kernel calibrations into a cache dir of the test's own, from an empty memory, as on a quiet machine (the kernel
    tests use it for every test)."""
    from leapdecode import kernels
    from leapdecode.kernels import calibrate, ops

    monkeypatch.setattr(calibrate, "_quiet", lambda: True)
    calibrate.forget()
    with kernels.configured(cache_dir=str(tmp_path)):
        yield tmp_path
    calibrate.forget()
    ops.forget_checks()


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


def greedy_records(model: torch.nn.Module, count: int, seed: int, length: int = 30) -> list[dict]:
    """Greedy answers of `model` to random prompts, in the records format of leapdecode.heads."""
    gen = torch.Generator().manual_seed(seed)
    records = []
    for _ in range(count):
        prompt = torch.randint(
            0, model.config.vocab_size, (int(torch.randint(3, 12, (1,), generator=gen)),), generator=gen
        )
        with torch.no_grad():
            out = model.generate(
                prompt[None],
                attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                max_new_tokens=length,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
            )
        records.append({"prompt_ids": prompt.tolist(), "answer_ids": out[0, len(prompt) :].tolist()})
    return records


def tiny_head(model: torch.nn.Module, trained: bool, seed: int = 0):
    """A draft head for a tiny model: trained on its greedy answers (agrees often) or left random (rarely agrees)."""
    from leapdecode.heads.model import DraftHead, HeadConfig
    from leapdecode.lab.heads.train import HeadTrainConfig, train_head

    if trained:
        cfg = HeadTrainConfig(
            vocab=model.config.vocab_size, intermediate=128, epochs=6, batch_size=64, lr=3e-3, seed=seed, val_share=0.2
        )
        return train_head(model, greedy_records(model, 40, seed), cfg, "tiny", log=lambda *a: None)
    torch.manual_seed(seed)
    config = HeadConfig(
        hidden_size=model.config.hidden_size,
        intermediate_size=128,
        target_vocab_size=model.config.vocab_size,
        target="tiny",
    )
    return DraftHead(config, torch.arange(model.config.vocab_size)).attach(model).eval(), {}
