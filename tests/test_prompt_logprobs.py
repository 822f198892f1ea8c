"""Prompt logprobs (vLLM's `prompt_logprobs`, and what the server's echo with logprobs returns): each prompt token's
log-probability given the tokens before it equals log_softmax of HF's own forward over the prompt, however the engine
reads the prompt (in one call, in chunks beside other requests, after a preemption, with its prefix cached), and
scoring one request changes no other request's output."""

from __future__ import annotations

import openai
import pytest
import torch
from live_server import client_of, served
from test_engine import run, solo
from tiny_hf import make_tiny_bpe_dir, make_tiny_hf_dir

from leapdecode.engine import Engine
from leapdecode.errors import LeapDecodeError
from leapdecode.models import resolve_model
from leapdecode.params import RequestParams

PROMPT = [5, 17, 3, 49, 42, 7, 7, 12, 64, 31, 2, 8, 60, 11, 23, 45, 6, 20, 19, 4, 33]


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return resolve_model(str(make_tiny_hf_dir(tmp_path_factory.mktemp("scores") / "tiny", context=160)))


@torch.inference_mode()
def hf_scores(target, prompt, top):
    """log_softmax of HF's forward over the prompt: row i scores token i + 1, and its `top` alternatives."""
    logprobs = torch.log_softmax(target.model(torch.tensor([prompt])).logits[0].float(), -1)
    chosen = [logprobs[i, t].item() for i, t in enumerate(prompt[1:])]
    return chosen, logprobs[:-1].topk(top, -1).indices.tolist()


def check(target, scores, prompt, top):
    assert scores[0] is None and len(scores) == len(prompt)
    chosen, alternatives = hf_scores(target, prompt, top)
    assert [s.token for s in scores[1:]] == prompt[1:]
    assert [s.logprob for s in scores[1:]] == pytest.approx(chosen, abs=1e-4)
    assert [[t for t, _ in s.top] for s in scores[1:]] == alternatives
    assert all(lp <= 0 for s in scores[1:] for _, lp in s.top)


@pytest.mark.parametrize("max_batch_tokens", [256, 7])  # the prompt in one call; in chunks of up to 7 rows
def test_prompt_scores_are_hf_log_softmax_and_other_requests_are_unchanged(target, max_batch_tokens):
    eng = Engine(target, drafter="prompt-lookup", max_batch_tokens=max_batch_tokens)
    other = [9, 8, 7, 9, 8, 7, 1, 2]
    outputs = run(
        eng,
        [
            (0, other, 12),
            (1, PROMPT, 5, {"prompt_logprobs": 3}),
            (2, PROMPT, 0, {"prompt_logprobs": 0}),  # scoring alone: no token
        ],
    )
    check(target, outputs[1][0].prompt_logprobs, PROMPT, 3)
    assert [t for o in outputs[1] for t in o.new_token_ids] == solo(target, PROMPT, 5)
    assert [t for o in outputs[0] for t in o.new_token_ids] == solo(target, other, 12)
    assert all(o.prompt_logprobs is None for o in outputs[0] + outputs[1][1:])
    (only,) = outputs[2]
    assert only.finished and only.new_token_ids == [] and only.finish_reason == "length"
    check(target, only.prompt_logprobs, PROMPT, 0)


def test_a_cached_prefix_is_read_again_for_scores(target):
    eng = Engine(target, drafter="none")
    first = eng.generate_many([PROMPT], max_new_tokens=3)[0]
    assert first.prompt_logprobs is None
    again = eng.generate_many([PROMPT + [50, 51]], max_new_tokens=3, prompt_logprobs=1)[0]  # its prefix is cached
    check(target, again.prompt_logprobs, PROMPT + [50, 51], 1)
    assert again.stats.cached_prompt_tokens == 0


@pytest.mark.parametrize("steps", [2, 5])  # preempted while its prompt is read; after it decoded a few tokens
def test_scores_survive_a_preemption(target, steps):
    eng = Engine(target, drafter="none", max_batch_tokens=7, prefix_cache_tokens=64)
    outputs = []
    eng.add_request(PROMPT, max_new_tokens=10, prompt_logprobs=2, on_output=outputs.append)
    for _ in range(steps):
        eng.step()
    (request,) = eng.scheduler.running
    eng.scheduler._preempt(request)
    while eng.has_work:
        eng.step()
    assert eng.metrics()["num_preemptions"] == 1
    check(target, outputs[0].prompt_logprobs, PROMPT, 2)
    assert sum(o.prompt_logprobs is not None for o in outputs) == 1
    assert [t for o in outputs for t in o.new_token_ids] == solo(target, PROMPT, 10)


def test_bad_values_are_refused_in_one_line(target):
    with pytest.raises(LeapDecodeError, match="prompt_logprobs"):
        RequestParams(prompt_logprobs=-1)
    with pytest.raises(LeapDecodeError, match="max_new_tokens"):
        RequestParams(max_new_tokens=0)  # 0 only when scoring
    from leapdecode import generate

    with pytest.raises(LeapDecodeError, match="Engine"):
        generate(target, PROMPT, prompt_logprobs=1)


@pytest.mark.slow
def test_scores_on_smollm2_match_hf_while_greedy_requests_decode():
    """SmolLM2-135M, whose greedy steps read the output head only through its argmax: a step that scores a prompt
    gets true logits (fp32 kernels against HF's F.linear: equal to within 1e-3)."""
    target = resolve_model("smollm2-135m")
    eng = Engine(target, drafter="auto")
    prompt = target.tokenizer("The capital of France is Paris. The capital of Italy is")["input_ids"]
    plain = eng.generate_many([prompt], max_new_tokens=4)[0]
    outputs = run(eng, [(0, prompt[:5], 16), (1, prompt, 4, {"prompt_logprobs": 5})])
    scored = outputs[1][0].prompt_logprobs
    chosen, alternatives = hf_scores(target, prompt, 5)
    assert [s.logprob for s in scored[1:]] == pytest.approx(chosen, abs=1e-3)
    assert [[t for t, _ in s.top][:1] for s in scored[1:]] == [a[:1] for a in alternatives]
    assert [t for o in outputs[1] for t in o.new_token_ids] == plain.token_ids


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    bpe = resolve_model(str(make_tiny_bpe_dir(tmp_path_factory.mktemp("echo") / "tiny", context=512)))
    with served(bpe, max_batch_tokens=16) as (url, _):
        yield bpe, client_of(url)


def test_echo_with_logprobs_scores_the_prompt_through_http(client):
    """What lm-evaluation-harness's loglikelihood asks of a completions server: the echoed prompt's logprobs."""
    bpe, client = client
    ids = bpe.tokenizer("the cat sat on the mat and then the cat sat again")["input_ids"]
    plain = client.completions.create(model="tiny", prompt=ids, max_tokens=3, logprobs=2, temperature=0)
    echoed = client.completions.create(model="tiny", prompt=ids, max_tokens=3, logprobs=2, temperature=0, echo=True)
    lp = echoed.choices[0].logprobs
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None and len(lp.tokens) == len(ids) + 3
    chosen, _ = hf_scores(bpe, ids, 2)
    assert lp.token_logprobs[1 : len(ids)] == pytest.approx(chosen, abs=1e-4)
    # the answer's: a step that also keeps the prompt's rows may take another output-head kernel (fp32 rounding)
    assert lp.token_logprobs[len(ids) :] == pytest.approx(plain.choices[0].logprobs.token_logprobs, abs=1e-4)
    assert echoed.choices[0].text == bpe.tokenizer.decode(ids) + plain.choices[0].text
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
    scored = client.completions.create(model="tiny", prompt=ids, max_tokens=0, logprobs=1, echo=True)
    assert scored.usage.completion_tokens == 0 and scored.choices[0].finish_reason == "length"
    alone = scored.choices[0].logprobs.token_logprobs
    assert alone[0] is None and alone[1:] == pytest.approx(lp.token_logprobs[1 : len(ids)], abs=1e-4)
    stream = list(
        client.completions.create(
            model="tiny", prompt=ids, max_tokens=3, logprobs=2, temperature=0, echo=True, stream=True
        )
    )
    streamed = [v for c in stream for v in (c.choices[0].logprobs.token_logprobs if c.choices[0].logprobs else [])]
    assert streamed[0] is None and streamed[1:] == pytest.approx(lp.token_logprobs[1:], abs=1e-4)
    assert stream[0].choices[0].text == bpe.tokenizer.decode(ids)
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="tiny", prompt=ids, max_tokens=0)
    assert info.value.body["param"] == "max_tokens"
