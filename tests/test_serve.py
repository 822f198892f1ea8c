"""`leapdecode serve` over HTTP with the official `openai` client: completions and chat, streaming or not, stop
strings, seeds, usage, n, per-request speculative stats, errors in OpenAI's shape, API keys, metrics, and requests
cancelled when their client goes away. A tiny local HF model with a decisive head (see conftest), so a greedy
mismatch is a bug, not a rounding tie; the server speculates (prompt lookup) and is compared with plain decoding."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest
from live_server import served
from tiny_hf import make_tiny_hf_dir

from leapdecode import generate
from leapdecode.engine import Engine
from leapdecode.models import resolve_model
from leapdecode.prompt import encode_prompt
from leapdecode.serve.app import create_app
from leapdecode.serve.server import BackgroundServer

PROMPTS = ["hello world w1 w2 w3", "the w7 w8 a w9", "w10 w11 w12 w10 w11", "a the hello w40"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(make_tiny_hf_dir(tmp_path_factory.mktemp("serve") / "tiny", context=160))


@pytest.fixture(scope="module")
def target(model_dir):
    return resolve_model(model_dir)


@pytest.fixture(scope="module")
def server(target):
    with served(target, max_sequences=8) as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key="unused", max_retries=0)


def solo(target, prompt, n, raw=False, **sampling):
    return generate(target, prompt, drafter="none", max_new_tokens=n, raw=raw, prefix_cache=False, **sampling)


def sse_events(url: str, body: dict, headers=None) -> list[str]:
    with httpx.stream("POST", url, json=body, headers=headers, timeout=60) as r:
        assert r.status_code == 200
        return [line[len("data: ") :] for line in r.iter_lines() if line.startswith("data: ")]


# ---- outputs ---------------------------------------------------------------------------------------------------------


def test_continue_final_message_continues_a_prefilled_answer(client, target):
    """vLLM's `continue_final_message` (with `add_generation_prompt: false`): the answer continues the last message
    instead of opening a new turn; the ids are the template's with that message left open."""
    messages = [{"role": "user", "content": "hello world"}, {"role": "assistant", "content": "the w3 w7"}]
    ids = encode_prompt(target.tokenizer, messages, continue_final=True)
    opened = encode_prompt(target.tokenizer, messages)  # the message closed, a new assistant turn opened
    assert opened[: len(ids)] == ids and len(opened) > len(ids)
    assert ids[-3:] == target.tokenizer("the w3 w7", add_special_tokens=False)["input_ids"]
    r = client.chat.completions.create(
        model="tiny",
        messages=messages,
        max_tokens=12,
        temperature=0,
        extra_body={"continue_final_message": True, "add_generation_prompt": False},
    )
    assert r.choices[0].message.content == solo(target, ids, 12).text and r.usage.prompt_tokens == len(ids)
    plain = client.chat.completions.create(model="tiny", messages=messages, max_tokens=12, temperature=0)
    assert plain.usage.prompt_tokens == len(opened)
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model="tiny", messages=messages, max_tokens=2, extra_body={"continue_final_message": True}
        )
    assert info.value.body["param"] == "continue_final_message"


@pytest.mark.parametrize("prompt", PROMPTS)
def test_chat_greedy_equals_generate(client, target, prompt):
    ref = solo(target, prompt, 40)
    r = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": prompt}], max_tokens=40, temperature=0
    )
    assert r.choices[0].message.content == ref.text
    assert r.choices[0].message.role == "assistant"
    assert r.usage.prompt_tokens == len(ref.prompt_ids)
    assert r.usage.completion_tokens == len(ref.token_ids)
    assert r.usage.total_tokens == len(ref.prompt_ids) + len(ref.token_ids)
    assert r.choices[0].finish_reason == ("length" if len(ref.token_ids) == 40 else "stop")
    assert r.object == "chat.completion" and r.model == "tiny"


@pytest.mark.parametrize("prompt", PROMPTS[:2])
def test_completion_greedy_equals_generate_raw(client, target, prompt):
    ref = solo(target, prompt, 30, raw=True)
    r = client.completions.create(model="tiny", prompt=prompt, max_tokens=30, temperature=0)
    assert r.choices[0].text == ref.text
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(ref.prompt_ids), len(ref.token_ids))
    assert r.object == "text_completion"


def test_matches_the_generate_command(client, model_dir, capsys):
    from leapdecode.cli import main

    assert (
        main(["generate", PROMPTS[2], "--model", model_dir, "--drafter", "none", "--max-new-tokens", "25", "--json"])
        == 0
    )
    expected = json.loads(capsys.readouterr().out)["text"]
    r = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": PROMPTS[2]}], max_tokens=25, temperature=0
    )
    assert r.choices[0].message.content == expected


@pytest.mark.parametrize(
    "penalties",
    [
        dict(frequency_penalty=0.8, presence_penalty=0.3),
        dict(extra_body={"repetition_penalty": 1.4}),
        dict(logit_bias={"5": 40, "7": -100}, presence_penalty=-0.5),
    ],
)
def test_penalties_and_logit_bias_through_the_openai_client(client, target, penalties):
    """OpenAI's frequency/presence penalties and logit_bias, vLLM's repetition_penalty: the server's speculative
    answer (prompt lookup) equals `generate` alone with the same settings, which differs from the plain answer."""
    options = {k: v for k, v in penalties.items() if k != "extra_body"} | penalties.get("extra_body", {})
    if "logit_bias" in options:
        options["logit_bias"] = {int(t): b for t, b in options["logit_bias"].items()}
    ref = solo(target, PROMPTS[0], 40, **options)
    assert ref.token_ids != solo(target, PROMPTS[0], 40).token_ids
    r = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": PROMPTS[0]}], max_tokens=40, temperature=0, **penalties
    )
    assert r.choices[0].message.content == ref.text
    raw = solo(target, PROMPTS[1], 30, raw=True, **options)
    r = client.completions.create(model="tiny", prompt=PROMPTS[1], max_tokens=30, temperature=0, **penalties)
    assert r.choices[0].text == raw.text


def test_chat_stream_joins_to_the_same_text_with_usage_last(client, target):
    ref = solo(target, PROMPTS[0], 40)
    chunks = list(
        client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": PROMPTS[0]}],
            max_tokens=40,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == ref.text
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason in ("stop", "length")
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(ref.token_ids)
    assert all(c.usage is None for c in chunks[:-1])


def test_completion_stream_ends_with_done(server, target):
    url, _ = server
    ref = solo(target, PROMPTS[1], 20, raw=True)
    events = sse_events(
        url + "/v1/completions",
        {"model": "tiny", "prompt": PROMPTS[1], "max_tokens": 20, "temperature": 0, "stream": True},
    )
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == ref.text
    assert "usage" not in chunks[0]  # only with stream_options.include_usage
    assert chunks[-1]["leapdecode"]["new_tokens"] == len(ref.token_ids)


@pytest.mark.parametrize("stream", [False, True])
def test_stop_string_is_cut_and_never_sent(client, target, stream):
    ref = solo(target, PROMPTS[0], 40)
    words = ref.text.split()
    assert len(words) >= 4, "the reference needs a few words to stop inside"
    stop = words[3]
    expected = ref.text[: ref.text.index(stop)]
    kwargs = dict(
        model="tiny",
        messages=[{"role": "user", "content": PROMPTS[0]}],
        max_tokens=40,
        temperature=0,
        stop=[stop, "never-there"],
    )
    if stream:
        chunks = list(client.chat.completions.create(stream=True, **kwargs))
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        reason = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    else:
        r = client.chat.completions.create(**kwargs)
        text, reason = r.choices[0].message.content, [r.choices[0].finish_reason]
    assert text == expected and stop not in text
    assert reason == ["stop"]


def test_seeded_sampling_is_reproducible_and_equals_generate(client, target):
    ref = solo(target, PROMPTS[3], 30, temperature=1.5, top_p=0.95, seed=7)
    outs = [
        client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": PROMPTS[3]}],
            max_tokens=30,
            temperature=1.5,
            top_p=0.95,
            seed=7,
        )
        .choices[0]
        .message.content
        for _ in range(2)
    ]
    assert outs == [ref.text, ref.text]


def test_n_choices_use_seed_plus_index(client, target):
    r = client.completions.create(model="tiny", prompt=PROMPTS[3], max_tokens=15, temperature=1.5, seed=3, n=2)
    assert [c.index for c in r.choices] == [0, 1]
    for c in r.choices:
        assert c.text == solo(target, PROMPTS[3], 15, raw=True, temperature=1.5, seed=3 + c.index).text
    assert r.usage.prompt_tokens == len(encode_prompt(target.tokenizer, PROMPTS[3], raw=True))


def test_response_carries_speculative_stats(client):
    r = client.completions.create(model="tiny", prompt=PROMPTS[2], max_tokens=40, temperature=0)
    spec = r.model_extra["leapdecode"]
    assert spec["drafter"] == "prompt-lookup"
    assert spec["new_tokens"] == r.usage.completion_tokens
    assert spec["mean_accepted_tokens"] == pytest.approx(spec["new_tokens"] / spec["forward_passes"], abs=1e-3)
    assert 0 <= spec["accepted_draft_tokens"] <= spec["drafted_tokens"]


def test_models_and_health(client, server):
    assert [m.id for m in client.models.list().data] == ["tiny"]
    assert client.models.retrieve("tiny").id == "tiny"
    with pytest.raises(openai.NotFoundError) as caught:
        client.models.retrieve("gpt-4o")
    assert caught.value.body["code"] == "model_not_found"
    r = httpx.get(server[0] + "/health")
    assert r.status_code == 200 and r.json()["status"] == "ok"
    assert r.headers["x-leapdecode-instance"]
    for ping in (httpx.get, httpx.post):  # vLLM's liveness path
        assert ping(server[0] + "/ping").json()["status"] == "ok"


# ---- errors ----------------------------------------------------------------------------------------------------------

LONG = " ".join(["w5"] * 200)
BAD = [
    ("/v1/completions", b"{not json", 400, None),
    ("/v1/completions", {"model": "nope", "prompt": "hello"}, 404, "model"),
    ("/v1/completions", {"model": "tiny", "prompt": "hello", "max_tokens": -3}, 400, "max_tokens"),
    ("/v1/completions", {"model": "tiny", "prompt": "hello", "max_tokens": 10**9}, 400, "max_tokens"),
    ("/v1/completions", {"model": "tiny", "prompt": "hello", "temperature": -0.5}, 400, "temperature"),
    ("/v1/completions", {"model": "tiny", "prompt": "hello", "top_p": 0}, 400, "top_p"),
    ("/v1/completions", {"model": "tiny", "prompt": LONG}, 400, "prompt"),
    ("/v1/completions", {"model": "tiny", "prompt": ""}, 400, "prompt"),
    ("/v1/completions", {"model": "tiny", "prompt": "hello", "logprobs": 21}, 400, "logprobs"),
    ("/v1/completions", {"model": "tiny", "prompt": "hello", "stop": [""]}, 400, "stop"),
    ("/v1/completions", {"model": "tiny", "prompt": "hello", "n": 0}, 400, "n"),
    ("/v1/completions", {"model": "tiny"}, 400, "prompt"),
    ("/v1/completions", [1, 2], 400, None),
    ("/v1/chat/completions", {"model": "tiny", "messages": []}, 400, "messages"),
    ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "wizard", "content": "hi"}]}, 400, None),
    (
        "/v1/chat/completions",
        {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 0},
        400,
        "max_completion_tokens",
    ),
    (
        "/v1/chat/completions",
        {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "frequency_penalty": 2.5},
        400,
        "frequency_penalty",
    ),
    ("/v1/completions", {"model": "tiny", "prompt": "hello", "repetition_penalty": 0}, 400, "repetition_penalty"),
    ("/v1/completions", {"model": "tiny", "prompt": "hello", "logit_bias": {"5": 101}}, 400, "logit_bias"),
    ("/v1/completions", {"model": "tiny", "prompt": "hello", "logit_bias": {"x": 1}}, 400, "logit_bias"),
    ("/v1/completions", {"model": "tiny", "prompt": "hello", "logit_bias": {"99999999": 1}}, 400, "logit_bias"),
    ("/v1/nowhere", {}, 404, None),
]


def assert_openai_error(r: httpx.Response, status: int, param=None):
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    message = body["error"]["message"]
    assert message and "\n" not in message and len(message) <= 500
    assert body["error"]["type"] == "invalid_request_error"
    if param is not None:
        assert body["error"]["param"] == param


@pytest.mark.parametrize("path,body,status,param", BAD)
def test_bad_requests_get_openai_errors_and_the_server_keeps_serving(server, client, path, body, status, param):
    url, _ = server
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(url + path, content=content, headers={"content-type": "application/json"}, timeout=30)
    assert_openai_error(r, status, param)
    assert client.completions.create(model="tiny", prompt="hello", max_tokens=2, temperature=0).choices


def test_openai_client_raises_its_own_errors(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="tiny", prompt="hello", max_tokens=5, temperature=-1)
    assert info.value.body["param"] == "temperature"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4", messages=[{"role": "user", "content": "hi"}])


def test_api_key_and_body_limit(target):
    app = create_app(
        Engine(target, drafter="none"), served_model_name="org/tiny", api_key="s3cret", max_body_bytes=1 << 20
    )
    try:
        with BackgroundServer(app) as url:
            good = openai.OpenAI(base_url=url + "/v1", api_key="s3cret", max_retries=0)
            assert good.completions.create(model="org/tiny", prompt="hello", max_tokens=3, temperature=0).choices
            assert good.models.retrieve("org/tiny").id == "org/tiny"  # a name with a slash, as vLLM's hub ids
            with pytest.raises(openai.AuthenticationError):
                openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0).models.list()
            with pytest.raises(openai.AuthenticationError):
                openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0).models.retrieve("org/tiny")
            assert_openai_error(httpx.post(url + "/v1/completions", json={"model": "org/tiny", "prompt": "hello"}), 401)
            big = b'{"model": "org/tiny", "prompt": "' + b"w1 " * (10 * 1024 * 1024 // 3) + b'"}'
            r = httpx.post(
                url + "/v1/completions",
                content=big,
                timeout=60,
                headers={"authorization": "Bearer s3cret", "content-type": "application/json"},
            )
            assert_openai_error(r, 413)
            assert httpx.get(url + "/health").status_code == 200  # open without a key, as /metrics
    finally:
        app.state.server.close()


# ---- concurrency, cancellation, metrics ---------------------------------------------------------------------------


def _slow_steps(engine, seconds: float):
    step = engine.step

    def slow():
        time.sleep(seconds)
        return step()

    engine.step = slow
    return step


def _wait_idle(state, timeout=30.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        snap = state.thread.snapshot
        if snap["running"] == 0 and snap["waiting"] == 0 and state.thread.in_flight == 0:
            return snap
        time.sleep(0.05)
    raise AssertionError(f"the engine did not go idle: {state.thread.snapshot}")


def _abort_count(url: str) -> float:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith("vllm:request_success_total{") and 'finished_reason="abort"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


LONG_RUNNER = "w1 w7"  # greedy: 150 tokens without an end of sequence (checked below)


def test_disconnect_mid_stream_cancels_and_frees_kv(server, target):
    url, state = server
    assert len(solo(target, LONG_RUNNER, 150, raw=True).token_ids) == 150
    original = _slow_steps(state.engine, 0.2)  # >= 10 steps even if every draft were accepted
    try:
        before = _abort_count(url)
        body = {
            "model": "tiny",
            "prompt": LONG_RUNNER,
            "max_tokens": 150,
            "temperature": 0,
            "stream": True,
            "stop": ["never-there"],
        }
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=30) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    break
            # the health route answers while the engine thread is busy stepping
            assert httpx.get(url + "/health", timeout=5).status_code == 200
            assert state.thread.snapshot["running"] + state.thread.snapshot["waiting"] >= 1 or state.thread.in_flight
        snap = _wait_idle(state)
        assert snap["kv_tokens"] == 0 and snap["kv_bytes"] == 0
        assert _abort_count(url) == before + 1
    finally:
        state.engine.step = original


def test_disconnect_while_waiting_for_a_whole_response_cancels(server):
    url, state = server
    original = _slow_steps(state.engine, 0.2)
    try:
        before = _abort_count(url)
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(
                url + "/v1/completions",
                json={
                    "model": "tiny",
                    "prompt": LONG_RUNNER,
                    "max_tokens": 150,
                    "temperature": 0,
                    "stop": ["never-there"],
                },
                timeout=0.5,
            )
        _wait_idle(state)
        assert _abort_count(url) == before + 1
    finally:
        state.engine.step = original


def test_metrics_use_vllm_names_and_match_the_engine(server, client):
    url, state = server
    client.completions.create(model="tiny", prompt=PROMPTS[2], max_tokens=30, temperature=0)
    _wait_idle(state)
    text = httpx.get(url + "/metrics").text
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    engine = state.engine.metrics()
    for key in (
        "spec_decode_num_drafts",
        "spec_decode_num_draft_tokens",
        "spec_decode_num_accepted_tokens",
        "generation_tokens",
        "prompt_tokens",
    ):
        assert values[f'vllm:{key}_total{{model_name="tiny"}}'] == engine[key]
    assert engine["spec_decode_num_drafts"] > 0
    assert values['vllm:num_requests_running{model_name="tiny"}'] == 0
    assert values['vllm:num_requests_waiting{model_name="tiny"}'] == 0
    assert values['leapdecode:kv_cache_tokens{model_name="tiny"}'] == 0
    finished = sum(v for k, v in values.items() if k.startswith("vllm:request_success_total") and "abort" not in k)
    assert values['vllm:e2e_request_latency_seconds_count{model_name="tiny"}'] == finished
    assert values['vllm:time_to_first_token_seconds_count{model_name="tiny"}'] >= 1
    assert values['vllm:inter_token_latency_seconds_count{model_name="tiny"}'] >= 1
    # the speculation gate: per load level each arm's measured rate, and which arm it runs there
    spec = engine["speculation"]
    assert all(set(level["rates"]) <= {"none", "draft"} for level in spec.values())
    assert any(level["ahead"] for level in spec.values())
    for span, level in spec.items():
        for arm, rate in level["rates"].items():
            key = f'{{arm="{arm}",decoding="{span}",model_name="tiny"}}'
            assert values["leapdecode:speculation_arm_tokens_per_second" + key] == pytest.approx(rate)
            if level["ahead"] is not None:
                assert values["leapdecode:speculation_arm_ahead" + key] == (arm == level["ahead"])


def test_a_failing_step_fails_its_requests_and_the_server_goes_on(server, client, caplog):
    url, state = server
    step = state.engine.step

    def broken():
        state.engine.step = step  # once
        raise RuntimeError("planted")

    state.engine.step = broken
    try:
        r = httpx.post(
            url + "/v1/completions",
            json={"model": "tiny", "prompt": "hello", "max_tokens": 5, "temperature": 0},
            timeout=30,
        )
    finally:
        state.engine.step = step
    assert r.status_code == 500 and r.json()["error"]["code"] == "engine_error"
    # the client gets an id to quote; the exception text stays in the server's log, under that id
    message = r.json()["error"]["message"]
    assert "planted" not in message and "RuntimeError" not in message
    eid = message.split("error id ")[1].split(";")[0]
    assert any(eid in rec.getMessage() and "planted" in rec.getMessage() for rec in caplog.records)
    _wait_idle(state)
    assert client.completions.create(model="tiny", prompt="hello", max_tokens=3, temperature=0).choices


def test_uvloop_and_httptools_serve_the_same_stream(target):
    """`leapdecode serve --loop uvloop --http httptools`: the streamed and whole answers are solo greedy, errors the same."""
    pytest.importorskip("uvloop")
    pytest.importorskip("httptools")
    with served(target, server_options=dict(loop="uvloop", http="httptools")) as (url, _):
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        ref = solo(target, PROMPTS[1], 24)
        messages = [{"role": "user", "content": PROMPTS[1]}]
        chunks = list(
            client.chat.completions.create(model="tiny", messages=messages, max_tokens=24, temperature=0, stream=True)
        )
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == ref.text
        whole = client.chat.completions.create(model="tiny", messages=messages, max_tokens=24, temperature=0)
        assert whole.choices[0].message.content == ref.text
        assert_openai_error(httpx.post(url + "/v1/chat/completions", json={"model": "tiny"}), 400)


def test_a_runtime_that_is_not_installed_is_one_clear_error(monkeypatch):
    import importlib.util

    from leapdecode.errors import LeapDecodeError
    from leapdecode.serve.server import check_runtime

    check_runtime("asyncio", "h11")  # the defaults need nothing more
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    for loop, http in (("uvloop", "h11"), ("asyncio", "httptools")):
        with pytest.raises(LeapDecodeError, match="is not installed: pip install"):
            check_runtime(loop, http)
