"""The batched Engine on a real packaged model (SmolLM2-135M-Instruct, fp32): six chat requests decoded together,
each with its own drafter state, against each request decoded alone by plain greedy decoding. A difference is
allowed only where the target's top-2 logits at the first differing token are within 1e-3 (batch-shape rounding
of a near-tie); anything else is a bug."""

from __future__ import annotations

import pytest
import torch
from test_real_model import PROMPTS

from leapdecode import generate
from leapdecode.engine import Engine
from leapdecode.models import load_model
from leapdecode.prompt import encode_prompt

pytestmark = pytest.mark.slow
TIE = 1e-3


@pytest.fixture(scope="module")
def smollm():
    return load_model("smollm2-135m")


@pytest.fixture(scope="module")
def solo(smollm):
    return [generate(smollm, p, drafter="none", max_new_tokens=48).token_ids for p in PROMPTS]


@torch.inference_mode()
def top2_margin(target, prompt: str, prefix: list[int]) -> float:
    ids = encode_prompt(target.tokenizer, prompt) + prefix
    logits = target.model(input_ids=torch.tensor([ids]), logits_to_keep=1).logits[0, -1].float()
    top = torch.topk(logits, 2).values
    return float(top[0] - top[1])


@pytest.mark.parametrize("drafter", ["none", "head", "prompt-lookup"])
def test_engine_batch_equals_solo_greedy_on_smollm2(smollm, solo, drafter):
    engine = Engine(smollm, drafter=drafter, max_batch_tokens=96, max_sequences=4)
    results = engine.generate_many(PROMPTS, max_new_tokens=48)
    for prompt, expected, got in zip(PROMPTS, solo, results):
        if got.token_ids == expected:
            continue
        at = next(
            (i for i, (a, b) in enumerate(zip(expected, got.token_ids)) if a != b),
            min(len(expected), len(got.token_ids)),
        )
        margin = top2_margin(smollm, prompt, expected[:at])
        assert margin < TIE, f"{drafter}: differs from solo greedy at token {at} where the top-2 margin is {margin}"
    assert engine.metrics()["kv_bytes"] == 0
