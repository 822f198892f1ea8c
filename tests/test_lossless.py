"""Losslessness: greedy speculative decoding emits exactly the tokens of plain greedy decoding (HF `generate`)."""
from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import VOCAB, noisy_copy, tiny_head, tiny_model
from leapdecode.controller import DraftLengthController
from leapdecode.decode import decode
from leapdecode.drafters import make_drafter
from leapdecode.models.quantize import quantize_int8
from leapdecode.runner import Runner
from leapdecode.sampling import SamplingConfig

ARCHS = ["llama", "qwen2"]


@pytest.fixture(scope="module")
def models():
    out = {}
    for i, arch in enumerate(ARCHS):
        target = tiny_model(arch, seed=10 + i)
        out[arch] = {
            "target": target,
            "drafts": {
                "self": target,  # always agrees: long accepted runs, exercises k growth and EOS inside drafts
                "noisy": noisy_copy(target, seed=20 + i, noise=0.5),  # agrees sometimes
                "independent": tiny_model(arch, seed=30 + i),  # rarely agrees: many rejections and rollbacks
                "int8": quantize_int8(noisy_copy(target, seed=40 + i, noise=0.2)),  # the default draft precision
            },
            "heads": {"trained": tiny_head(target, trained=True)[0], "random": tiny_head(target, trained=False)[0]},
        }
    return out


def hf_greedy(model, prompt: list[int], max_new_tokens: int, eos: int | None) -> list[int]:
    with torch.no_grad():
        ids = torch.tensor([prompt])
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False,
                             eos_token_id=eos, pad_token_id=0)
    tokens = out[0, len(prompt):].tolist()
    if eos is not None and eos in tokens:
        tokens = tokens[: tokens.index(eos) + 1]
    return tokens


@st.composite
def prompts(draw):
    """Random prompts, often with repeated chunks so that lookup drafters find matches."""
    chunk = draw(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=8))
    prefix = draw(st.lists(st.integers(0, VOCAB - 1), max_size=12))
    repeats = draw(st.integers(1, 4))
    return (prefix + chunk * repeats)[:40] or [1]


def run_property(models, arch, data):
    prompt = data.draw(prompts(), label="prompt")
    drafter_name = data.draw(st.sampled_from(["none", "prompt-lookup", "ngram", "draft-model", "head"]), label="drafter")
    k = data.draw(st.integers(1, 8), label="k")
    adaptive = data.draw(st.booleans(), label="adaptive")
    max_new = data.draw(st.integers(1, 40), label="max_new_tokens")
    target = models[arch]["target"]
    reference = hf_greedy(target, prompt, max_new, None)
    eos_choice = data.draw(st.sampled_from(["none", "inside", "first", "absent"]), label="eos")
    eos = {"none": None, "inside": reference[len(reference) // 2], "first": reference[0],
           "absent": next(t for t in range(VOCAB) if t not in reference)}[eos_choice]
    if eos is not None:
        reference = hf_greedy(target, prompt, max_new, eos)
    options = {}
    if drafter_name == "draft-model":
        kind = data.draw(st.sampled_from(["self", "noisy", "independent", "int8"]), label="draft")
        options = {"draft_model": models[arch]["drafts"][kind], "confidence": data.draw(st.sampled_from([0.0, 0.05]))}
    elif drafter_name == "prompt-lookup":
        options = {"max_ngram": data.draw(st.integers(1, 4), label="max_ngram")}
    elif drafter_name == "head":
        options = {"head": models[arch]["heads"][data.draw(st.sampled_from(["trained", "random"]), label="head")],
                   "lookup_ngram": data.draw(st.integers(0, 3), label="lookup_ngram"),
                   "confidence": data.draw(st.sampled_from([0.0, 0.1, 0.5]), label="confidence")}
    elif drafter_name == "ngram":
        options = {"store_key": f"test-{arch}"}
    drafter = make_drafter(drafter_name, **options)
    out, stats = decode(Runner(target), prompt, drafter, sampling=SamplingConfig(),
                        controller=DraftLengthController(k_init=k, k_max=max(k, 8), adaptive=adaptive),
                        max_new_tokens=max_new, eos_ids=set() if eos is None else {eos}, context_length=512)
    assert out == reference, f"{drafter_name} diverged from plain greedy"
    assert stats.new_tokens == len(out)
    assert sum(stats.accepted_per_step) == len(out)
    assert stats.forward_passes == len(stats.accepted_per_step) <= len(out)


@pytest.mark.parametrize("arch", ARCHS)
@settings(max_examples=110, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_greedy_speculative_equals_plain_greedy(models, arch, data):
    run_property(models, arch, data)


def test_self_drafting_is_accepted_in_long_runs(models):
    """A draft model identical to the target is always right: fewer forwards than tokens (the test can fail).
    The draft length is fixed: a draft model as costly as the target never pays, so the adaptive controller would
    rightly stop drafting (its choices are tested with synthetic timings in test_controller.py)."""
    target = models["llama"]["target"]
    drafter = make_drafter("draft-model", draft_model=target, confidence=0.0)
    out, stats = decode(Runner(target), [3, 1, 4, 1, 5], drafter, sampling=SamplingConfig(),
                        controller=DraftLengthController(k_init=4, adaptive=False), max_new_tokens=40, eos_ids=set(),
                        context_length=512)
    assert out == hf_greedy(target, [3, 1, 4, 1, 5], 40, None)
    assert stats.forward_passes <= 10
    assert stats.acceptance_rate == 1.0


def test_context_limit_stops_generation(models):
    target = models["qwen2"]["target"]
    prompt = list(range(20))
    out, stats = decode(Runner(target), prompt, make_drafter("prompt-lookup"), sampling=SamplingConfig(),
                        controller=DraftLengthController(), max_new_tokens=100, eos_ids=set(), context_length=32)
    assert len(prompt) + len(out) == 32
    assert stats.stop_reason == "context"
    assert out == hf_greedy(target, prompt, 12, None)
