"""Logprobs (issue 34, item C): for every output token, its log-probability and the most likely alternatives under the
target model's raw distribution (log_softmax of the logits row that decided it, before temperature, filters and the
min_tokens mask: vLLM's default `raw_logprobs`). Checked against HF's `log_softmax(model(ids).logits)` of the same
tiny model, with and without speculation (drafts really accepted), in the Engine and over HTTP with the `openai`
client in OpenAI's chat and completions shapes, streamed or not."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
import torch
from tiny_hf import make_tiny_hf_dir

from leapdecode import kernels
from leapdecode.engine import Engine
from leapdecode.errors import LeapDecodeError
from leapdecode.models import resolve_model
from leapdecode.params import RequestParams
from leapdecode.prompt import encode_prompt
from leapdecode.serve.app import create_app
from leapdecode.serve.server import BackgroundServer

RAW = "w1 w7"  # raw, greedy: no end of sequence for 150 tokens on this model, and prompt lookup drafts get accepted
EOS_EARLY = "w22 w6 hello w34"  # chat, greedy: [56, 2, 3, <eos>] on this model
TOL = 1e-4  # fp32 rounding between forward shapes (one row, a draft's rows, HF's whole sequence)


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return resolve_model(str(make_tiny_hf_dir(tmp_path_factory.mktemp("logprobs") / "tiny", context=160)))


def hf_logprobs(target, prompt_ids: list[int], out_ids: list[int]) -> torch.Tensor:
    """[len(out_ids), V]: HF's raw log_softmax at the positions that decided each output token."""
    with torch.no_grad():
        logits = target.model(torch.tensor([prompt_ids + out_ids])).logits[0].float()
    return torch.log_softmax(logits, -1)[len(prompt_ids) - 1 : len(prompt_ids) - 1 + len(out_ids)]


def run(engine, prompt, **options):
    """(token ids, TokenLogprobs, last output) of one request run alone in `engine`."""
    rid = engine.add_request(prompt, **options)
    outs = list(engine.stream(rid))
    tokens = [t for o in outs for t in o.new_token_ids]
    logprobs = [x for o in outs for x in o.logprobs]
    assert len(logprobs) == len(tokens) and all(len(o.logprobs) == len(o.new_token_ids) for o in outs)
    return tokens, logprobs, outs[-1]


def check_against_hf(target, prompt_ids, tokens, logprobs, top: int) -> None:
    ref = hf_logprobs(target, prompt_ids, tokens)
    for i, (token, entry) in enumerate(zip(tokens, logprobs)):
        assert entry.token == token
        assert abs(entry.logprob - ref[i, token].item()) < TOL, (i, entry.logprob, ref[i, token].item())
        values, ids = ref[i].topk(top)
        assert [t for t, _ in entry.top] == ids.tolist(), i
        assert max(abs(v - r) for (_, v), r in zip(entry.top, values.tolist())) < TOL, i


def engines(target):
    return {
        "plain": Engine(target, drafter="none"),
        "speculative": Engine(target, drafter="prompt-lookup", draft_length=4, adaptive_draft_length=False),
    }


def test_greedy_logprobs_are_hf_log_softmax_with_and_without_speculation(target):
    prompt_ids = encode_prompt(target.tokenizer, RAW, raw=True)
    results = {}
    for name, engine in engines(target).items():
        tokens, logprobs, last = run(engine, RAW, raw=True, max_new_tokens=60, logprobs=5)
        check_against_hf(target, prompt_ids, tokens, logprobs, 5)
        results[name] = tokens, logprobs, last.stats
    assert results["speculative"][2].accepted_draft_tokens > 0  # drafted positions' logprobs were checked too
    assert results["plain"][0] == results["speculative"][0]
    for a, b in zip(results["plain"][1], results["speculative"][1]):
        assert abs(a.logprob - b.logprob) < TOL and [t for t, _ in a.top] == [t for t, _ in b.top]


def test_sampled_logprobs_are_the_raw_distribution_not_the_tempered_one(target):
    prompt_ids = encode_prompt(target.tokenizer, RAW, raw=True)
    options = dict(raw=True, max_new_tokens=40, logprobs=3, temperature=1.6, top_k=8, seed=7)
    results = {}
    for name, engine in engines(target).items():
        tokens, logprobs, last = run(engine, RAW, **options)
        check_against_hf(target, prompt_ids, tokens, logprobs, 3)
        results[name] = tokens, last.stats
    assert results["plain"][0] == results["speculative"][0]  # seeded sampling, model-free drafter: same tokens


def test_min_tokens_masks_sampling_but_not_the_reported_logprobs(target):
    """EOS is the raw argmax at output position 3 of EOS_EARLY; min_tokens keeps it from being chosen there, and the
    logprobs still show it as the most likely token, with HF's raw value."""
    prompt_ids = encode_prompt(target.tokenizer, EOS_EARLY)
    eos = target.eos_token_ids[0]
    for engine in engines(target).values():
        tokens, logprobs, _ = run(engine, EOS_EARLY, max_new_tokens=8, min_tokens=6, logprobs=2)
        assert tokens[3] != eos and logprobs[3].top[0][0] == eos
        check_against_hf(target, prompt_ids, tokens, logprobs, 2)


def test_a_logprobs_request_beside_greedy_ones_gets_full_logits(target):
    """Greedy requests read only the argmax of their logits, so a step of greedy requests may run the argmax-only
    output head (bf16, exact argmax, other logits not the model's): forced on here. A logprobs request turns it off
    for the steps it is in."""
    with kernels.configured(argmax_head="on"):
        engine = engines(target)["speculative"]
        for i in range(3):
            engine.add_request(f"w{i} w{i + 3} w{i + 5}", raw=True, max_new_tokens=30)
        prompt_ids = encode_prompt(target.tokenizer, RAW, raw=True)
        tokens, logprobs, _ = run(engine, RAW, raw=True, max_new_tokens=30, logprobs=1)
    check_against_hf(target, prompt_ids, tokens, logprobs, 1)


def test_a_stop_string_cuts_the_logprobs_with_the_tokens(target):
    """A stop string completed inside a step of several accepted tokens drops the tokens after it, and their logprobs
    with them. Several stop words are tried so that some are completed mid-step (checked)."""
    engine = engines(target)["speculative"]
    full_tokens, full, _ = run(engine, RAW, raw=True, max_new_tokens=60, logprobs=0)
    words = target.tokenizer.decode(full_tokens, skip_special_tokens=True).split()
    mid_step = 0
    for j in range(20, 50, 2):  # the output's words j-2..j as the stop string
        stop = " ".join(words[j - 2 : j + 1])
        tokens, logprobs, last = run(engine, RAW, raw=True, max_new_tokens=60, logprobs=0, stop=[stop])
        assert last.finish_reason == "stop" and tokens == full_tokens[: len(tokens)]
        assert [e.logprob for e in logprobs] == pytest.approx([e.logprob for e in full[: len(tokens)]], abs=TOL)
        mid_step += last.stats.accepted_per_step[-1] > len(last.new_token_ids)
    assert mid_step > 0


def test_no_logprobs_unless_asked(target):
    engine = engines(target)["plain"]
    rid = engine.add_request(RAW, raw=True, max_new_tokens=5)
    assert all(o.logprobs is None for o in engine.stream(rid))


@pytest.mark.parametrize("bad", [-1, 21, True, 2.0, "3"])
def test_bad_logprobs_are_refused_once(bad):
    with pytest.raises(LeapDecodeError, match="logprobs"):
        RequestParams(logprobs=bad)


# ---- over HTTP ------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def served(target):
    engine = Engine(target, drafter="prompt-lookup", draft_length=4, adaptive_draft_length=False)
    app = create_app(engine, served_model_name="tiny")
    with BackgroundServer(app) as url:
        yield url, engine
    app.state.server.close()


def reference(target, prompt, chat: bool, n: int):
    """(prompt ids, greedy tokens, their token strings, HF logprobs) of one request."""
    engine = engines(target)["plain"]
    tokens, _, _ = run(engine, prompt, raw=not chat, max_new_tokens=n, logprobs=0)
    prompt_ids = encode_prompt(target.tokenizer, prompt, raw=not chat)
    strings = [target.tokenizer.decode([t], skip_special_tokens=False) for t in tokens]
    return prompt_ids, tokens, strings, hf_logprobs(target, prompt_ids, tokens)


def top_strings(target, ref_row: torch.Tensor, k: int) -> list[str]:
    return [target.tokenizer.decode([t], skip_special_tokens=False) for t in ref_row.topk(k).indices.tolist()]


@pytest.mark.parametrize("stream", [False, True])
def test_chat_logprobs_over_http(target, served, stream):
    url, engine = served
    _, tokens, strings, ref = reference(target, RAW, chat=True, n=30)
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60)
    drafts = engine.metrics()["spec_decode_num_accepted_tokens"]
    kwargs = dict(
        model="tiny", messages=[{"role": "user", "content": RAW}], max_tokens=30, temperature=0, stream=stream
    )
    r = client.chat.completions.create(logprobs=True, top_logprobs=3, **kwargs)
    if stream:
        content = [
            x for chunk in r if chunk.choices and chunk.choices[0].logprobs for x in chunk.choices[0].logprobs.content
        ]
    else:
        content = r.choices[0].logprobs.content
    assert engine.metrics()["spec_decode_num_accepted_tokens"] > drafts  # drafts were accepted in this request
    assert [c.token for c in content] == strings
    for i, c in enumerate(content):
        assert abs(c.logprob - ref[i, tokens[i]].item()) < TOL
        assert c.bytes == list(strings[i].encode())
        assert [t.token for t in c.top_logprobs] == top_strings(target, ref[i], 3)
        assert [t.logprob for t in c.top_logprobs] == pytest.approx(ref[i].topk(3).values.tolist(), abs=TOL)
    plain = client.chat.completions.create(**{**kwargs, "stream": False})
    assert plain.choices[0].logprobs is None


@pytest.mark.parametrize("stream", [False, True])
def test_completions_logprobs_over_http(target, served, stream):
    url, _ = served
    _, tokens, strings, ref = reference(target, RAW, chat=False, n=30)
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60)
    r = client.completions.create(model="tiny", prompt=RAW, max_tokens=30, temperature=0, logprobs=2, stream=stream)
    chunks = [c.choices[0].logprobs for c in r if c.choices[0].logprobs] if stream else [r.choices[0].logprobs]
    got_tokens = [t for c in chunks for t in c.tokens]
    got = [x for c in chunks for x in c.token_logprobs]
    tops = [x for c in chunks for x in c.top_logprobs]
    offsets = [x for c in chunks for x in c.text_offset]
    assert got_tokens == strings
    assert got == pytest.approx([ref[i, t].item() for i, t in enumerate(tokens)], abs=TOL)
    for i, top in enumerate(tops):  # vLLM's shape: the chosen token, then the 2 most likely
        expected = {strings[i], *top_strings(target, ref[i], 2)}
        assert set(top) == expected and top[strings[i]] == pytest.approx(got[i], abs=TOL)
    assert offsets == [sum(len(s) for s in strings[:i]) for i in range(len(strings))]


@pytest.mark.parametrize(
    "path, fields, param",
    [
        ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs"),
        ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ("/v1/completions", {"logprobs": 21}, "logprobs"),
        ("/v1/completions", {"max_tokens": 0}, "max_tokens"),  # 0 only with echo
    ],
)
def test_bad_logprobs_fields_get_a_400_naming_them(served, path, fields, param):
    url, _ = served
    body = {"model": "tiny", "max_tokens": 2}
    body |= {"messages": [{"role": "user", "content": RAW}]} if "chat" in path else {"prompt": RAW}
    r = httpx.post(url + path, content=json.dumps({**body, **fields}), headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


@pytest.mark.parametrize("drafter", ["none", "prompt-lookup"])
def test_generate_returns_the_same_logprobs(target, drafter):
    from leapdecode import generate

    result = generate(target, RAW, raw=True, max_new_tokens=24, logprobs=3, drafter=drafter)
    assert len(result.logprobs) == len(result.token_ids) == 24
    check_against_hf(target, result.prompt_ids, result.token_ids, result.logprobs, 3)
    assert result.as_dict()["logprobs"][0]["token_id"] == result.token_ids[0]
    assert generate(target, RAW, raw=True, max_new_tokens=4).logprobs is None
