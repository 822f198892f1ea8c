"""OpenAI's Predicted Outputs (RequestParams.prediction, drafters.prediction): drafts copy the request's prediction,
so an answer that repeats it takes fewer forwards, and the output stays that of plain greedy decoding whatever the
prediction is (right, edited, unrelated, empty), alone or in the Engine's batch."""

from __future__ import annotations

import random

import pytest
import torch
from conftest import VOCAB, tiny_head, tiny_model
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiny_hf import make_tiny_hf_dir

from leapdecode import generate
from leapdecode.controller import DraftLengthController
from leapdecode.decode import decode
from leapdecode.drafters import make_drafter
from leapdecode.drafters.prediction import PredictionDrafter, with_prediction
from leapdecode.engine import Engine
from leapdecode.errors import LeapDecodeError
from leapdecode.models import resolve_model
from leapdecode.runner import Runner
from leapdecode.sampling import SamplingConfig


@pytest.fixture(scope="module")
def tiny():
    target = tiny_model("llama", seed=91)
    return target, tiny_head(target, trained=True)[0]


def greedy(target, prompt, max_new, drafter, adaptive=True):
    return decode(
        Runner(target),
        prompt,
        drafter,
        sampling=SamplingConfig(),
        controller=DraftLengthController(k_init=4, k_max=8, adaptive=adaptive),
        max_new_tokens=max_new,
        eos_ids=set(),
        context_length=512,
    )


def edited(rng: random.Random, tokens: list[int], edits: int) -> list[int]:
    """tokens with `edits` random insertions, deletions and substitutions (an edited file, say)."""
    out = list(tokens)
    for _ in range(edits):
        at = rng.randrange(len(out) + 1)
        kind = rng.choice(["insert", "delete", "replace"])
        if kind == "insert" or not out or at == len(out):
            out[at:at] = [rng.randrange(VOCAB) for _ in range(rng.randrange(1, 4))]
        elif kind == "delete":
            del out[at : at + rng.randrange(1, 4)]
        else:
            out[at] = rng.randrange(VOCAB)
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_greedy_with_any_prediction_is_plain_greedy(tiny, data):
    target, head = tiny
    rng = random.Random(data.draw(st.integers(0, 10**6), label="seed"))
    prompt = [rng.randrange(VOCAB) for _ in range(rng.randrange(1, 20))]
    max_new = data.draw(st.integers(1, 40), label="max_new_tokens")
    reference, _ = greedy(target, prompt, max_new, make_drafter("none"))
    kind = data.draw(st.sampled_from(["exact", "edited", "longer", "unrelated", "prompt"]), label="prediction")
    prediction = {
        "exact": reference,
        "edited": edited(rng, reference, rng.randrange(1, 6)),
        "longer": reference + edited(rng, reference, 2),
        "unrelated": [rng.randrange(VOCAB) for _ in range(rng.randrange(1, 30))],
        "prompt": prompt,
    }[kind]
    inner = data.draw(st.sampled_from(["none", "prompt-lookup", "ngram", "head"]), label="drafter")
    drafter = make_drafter(inner, **({"head": head} if inner == "head" else {}))
    out, stats = greedy(target, prompt, max_new, with_prediction(drafter, prediction), data.draw(st.booleans()))
    assert out == reference, f"{inner} with a {kind} prediction diverged from plain greedy"
    assert stats.prediction_tokens == len(prediction) and 0 <= stats.accepted_prediction_tokens <= len(out)
    if kind == "exact":
        assert stats.accepted_prediction_tokens == len(out)


def test_an_answer_that_repeats_its_prediction_takes_few_forwards(tiny):
    target, _ = tiny
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    reference, plain = greedy(target, prompt, 60, make_drafter("none"))
    # drafts of a fixed length (4): how many forwards they take does not hang on how the host timed them
    out, stats = greedy(target, prompt, 60, with_prediction(make_drafter("none"), reference), adaptive=False)
    assert out == reference and plain.forward_passes == 60
    assert stats.forward_passes <= 15, stats.accepted_per_step  # every forward accepts a whole draft of the prediction
    assert stats.accepted_prediction_tokens == 60


def test_the_place_in_the_prediction_is_found_again_after_an_edit():
    drafter = PredictionDrafter([10, 11, 12, 13, 14, 15, 16, 17, 18, 19], make_drafter("none"))
    drafter.start([1, 2], None)
    drafter.floor = 0.0
    context = [1, 2]
    assert drafter.propose(context, 3).tokens == [10, 11, 12]
    for step in ([10, 11], [12, 99], [98], [14]):  # the output replaces 13 by 99 98, then goes on with 14
        context += step
        drafter.observe(context, len(step))
    assert drafter.propose(context, 3).tokens == []  # one token back in the prediction is not enough to copy on
    context += [15]
    drafter.observe(context, 1)
    assert drafter.propose(context, 3).tokens == [16, 17, 18]  # "14 15": the place is found again
    context += [16, 17]
    drafter.observe(context, 2)
    assert drafter.propose(context, 2).tokens == [18, 19]
    assert drafter.followed(context, 2) == 5  # 10 11 12 and 16 17 (14 15 found the place again)


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return resolve_model(str(make_tiny_hf_dir(tmp_path_factory.mktemp("prediction") / "tiny", context=160)))


@pytest.mark.parametrize("drafter", ["none", "prompt-lookup"])
def test_engine_requests_with_and_without_predictions_get_plain_greedy(target, drafter):
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(4, 64, (n,), generator=gen).tolist() for n in (7, 12, 5, 9)]
    solo = [generate(target, p, max_new_tokens=30, prefix_cache=False).token_ids for p in prompts]
    predictions = [solo[0], solo[1][:10] + [7, 7, 7] + solo[1][12:], None, [60, 61, 62]]
    engine = Engine(target, drafter=drafter, max_sequences=4)
    outputs: dict[int, list] = {i: [] for i in range(4)}
    for i, (p, q) in enumerate(zip(prompts, predictions)):
        extra = {"prediction": q} if q is not None else {}
        engine.add_request(p, max_new_tokens=30, on_output=outputs[i].append, **extra)
    while engine.has_work:
        engine.step()
    for i in range(4):
        got = [t for o in outputs[i] for t in o.new_token_ids]
        assert got == solo[i], f"request {i} with prediction {predictions[i]} differs from solo greedy"
    stats = outputs[0][-1].stats
    assert stats.prediction_tokens == 30 and stats.accepted_prediction_tokens == 30
    assert stats.forward_passes < 30  # the batch's steps verified its prediction's drafts


def test_a_prediction_of_text_is_tokenized_and_bad_ones_fail_in_one_line(target):
    text = target.tokenizer.decode(generate(target, [5, 6, 7], max_new_tokens=12).token_ids)
    result = generate(target, [5, 6, 7], max_new_tokens=12, prediction=text)
    assert result.stats.prediction_tokens > 0
    with pytest.raises(LeapDecodeError, match="prediction must be a string or a list of token ids"):
        generate(target, [5, 6, 7], max_new_tokens=4, prediction={"type": "content"})
    with pytest.raises(LeapDecodeError, match="prediction: token id"):
        generate(target, [5, 6, 7], max_new_tokens=4, prediction=[10**7])
