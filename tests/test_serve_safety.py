"""Safe by default and no silently ignored field (issue 34, items 3 and 4): Host and Origin checks, CORS for the
origins allowed, JSON bodies only, error ids instead of exception text, an opaque instance header; every OpenAI/vLLM
field honoured or refused with a 400 that names it, unknown fields listed in a header; /tokenize, /detokenize,
/version as vLLM has them; and the HTTP counters add up to the requests sent."""

from __future__ import annotations

import json
import socket

import httpx
import openai
import pytest
from live_server import served
from tiny_hf import make_tiny_hf_dir

from leapdecode.models import resolve_model
from leapdecode.prompt import encode_prompt
from leapdecode.serve.security import Security, host_name
from leapdecode.version import __version__

ALLOWED = "https://app.example"


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return resolve_model(str(make_tiny_hf_dir(tmp_path_factory.mktemp("safety") / "tiny", context=160)))


@pytest.fixture(scope="module")
def server(target):
    security = Security("127.0.0.1", allowed_hosts=("api.example", ".corp.example"), allowed_origins=(ALLOWED,))
    with served(target, {"security": security}) as running:
        yield running


def post(url, path="/v1/completions", body=None, **headers):
    body = {"model": "tiny", "prompt": "hello", "max_tokens": 3, "temperature": 0} if body is None else body
    return httpx.post(
        url + path, content=json.dumps(body), headers={"content-type": "application/json", **headers}, timeout=30
    )


def error_of(r, status, code=None, param=None):
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if code is not None:
        assert error["code"] == code
    if param is not None:
        assert error["param"] == param
    return error


# ---- Host, Origin, content type -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "host,ok",
    [
        ("localhost:8000", True),
        ("127.0.0.1:8000", True),
        ("[::1]:8000", True),
        ("10.1.2.3:8000", True),  # an IP literal cannot be a rebinding name
        ("api.example", True),
        ("x.corp.example:443", True),
        ("evil.example", False),
        ("127.0.0.1.evil.example", False),
        ("corp.example.evil.example", False),
    ],
)
def test_host_header_is_checked_against_the_bound_address(server, host, ok):
    url, _ = server
    r = post(url, host=host)
    if ok:
        assert r.status_code == 200, r.text
    else:
        error_of(r, 400, "host_not_allowed")
        assert "evil" not in r.text  # the refused name goes to the log, not back to a page


def test_host_names_parse():
    assert host_name("[::1]:80") == "::1" and host_name("A.B.:80") == "a.b" and host_name("::1") == "::1"
    assert Security("0.0.0.0", allowed_hosts=("*",)).host_allowed("anything.example")


def test_cross_origin_requests_are_refused_unless_allowed(server):
    url, _ = server
    error_of(post(url, origin="https://evil.example"), 403, "origin_not_allowed")
    error_of(post(url, origin="null"), 403, "origin_not_allowed")
    r = post(url, origin=ALLOWED)
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == ALLOWED
    preflight = httpx.options(
        url + "/v1/chat/completions",
        headers={"origin": ALLOWED, "access-control-request-method": "POST"},
    )
    assert preflight.status_code == 204 and "POST" in preflight.headers["access-control-allow-methods"]
    denied = httpx.options(url + "/v1/chat/completions", headers={"origin": "https://evil.example"})
    assert denied.status_code == 403 and "access-control-allow-origin" not in denied.headers


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", None])
def test_bodies_must_be_json(server, content_type):
    url, _ = server
    headers = {} if content_type is None else {"content-type": content_type}
    body = json.dumps({"model": "tiny", "prompt": "hello", "max_tokens": 2})
    r = httpx.post(url + "/v1/completions", content=body, headers=headers)
    if content_type is None:
        r = httpx.post(url + "/v1/completions", content=body.encode(), headers={"content-type": ""})
    error_of(r, 415, "invalid_content_type")
    error_of(httpx.post(url + "/v1/completions", headers=headers), 400)  # an empty POST: no body, so no JSON


def test_a_crash_answers_an_error_id_and_logs_the_details(server, caplog):
    url, state = server
    run = state.tokenizers.run

    async def broken(*args):
        raise RuntimeError(f"secret detail on {socket.gethostname()}")

    state.tokenizers.run = broken
    try:
        error = error_of(post(url), 500, "internal_error")
    finally:
        state.tokenizers.run = run
    assert "secret" not in error["message"] and socket.gethostname() not in error["message"]
    eid = error["message"].split("error id ")[1].split(";")[0]
    assert any(eid in r.getMessage() and "secret detail" in r.getMessage() for r in caplog.records)
    assert post(url).status_code == 200


def test_the_instance_header_names_no_host(server):
    url, _ = server
    instance = httpx.get(url + "/health").headers["x-leapdecode-instance"]
    assert instance and socket.gethostname() not in instance and len(instance) == 12


# ---- fields ---------------------------------------------------------------------------------------------------------

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 3, "temperature": 0}
COMPLETION = {"model": "tiny", "prompt": "hello", "max_tokens": 3, "temperature": 0}
REFUSED = [
    ("/v1/chat/completions", {"tool_choice": "auto"}, "tool_choice"),
    # tool_choice auto (the default with tools) on a template that does not show the model its tools
    ("/v1/chat/completions", {"tools": [{"type": "function", "function": {"name": "f"}}]}, "tool_choice"),
    ("/v1/chat/completions", {"functions": [{"name": "f"}]}, "functions"),
    ("/v1/chat/completions", {"function_call": "auto"}, "function_call"),
    ("/v1/chat/completions", {"response_format": {"type": "json_object"}}, "response_format"),
    ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs"),  # without logprobs: true
    ("/v1/chat/completions", {"echo": "yes"}, "echo"),
    ("/v1/chat/completions", {"chat_template": "{{ 1 }}"}, "chat_template"),
    ("/v1/chat/completions", {"reasoning_effort": "high"}, "reasoning_effort"),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi", "tool_calls": [{}]}]},
        "messages.0.tool_calls",
    ),
    ("/v1/completions", {"response_format": {"type": "json_object"}}, "response_format"),
    ("/v1/completions", {"suffix": "x"}, "suffix"),
    ("/v1/completions", {"max_tokens": 0}, "max_tokens"),  # the prompt alone needs echo
    ("/v1/completions", {"guided_json": {"type": "object"}}, "guided_json"),
    ("/v1/completions", {"length_penalty": 0.5}, "length_penalty"),
    ("/v1/completions", {"bad_words": [""]}, "bad_words"),
    ("/v1/completions", {"use_beam_search": True}, "use_beam_search"),
    ("/v1/completions", {"spaces_between_special_tokens": False}, "spaces_between_special_tokens"),
    ("/v1/completions", {"truncate_prompt_tokens": 0}, "truncate_prompt_tokens"),
    ("/v1/completions", {"priority": 3}, "priority"),
    ("/v1/completions", {"best_of": 3}, "best_of"),
]


@pytest.mark.parametrize("path,extra,param", REFUSED)
def test_fields_this_server_cannot_honour_get_a_400_naming_them(server, path, extra, param):
    url, _ = server
    base = CHAT if "chat" in path else COMPLETION
    error = error_of(post(url, path, {**base, **extra}), 400, param=param)
    assert param.split(".")[-1] in error["message"]


NEUTRAL = [
    (
        "/v1/chat/completions",
        {"tool_choice": "none", "parallel_tool_calls": False, "response_format": {"type": "text"}},
    ),
    ("/v1/chat/completions", {"user": "u1", "metadata": {"a": "b"}, "store": False, "service_tier": "auto"}),
    (
        "/v1/chat/completions",
        {
            "messages": [
                {"role": "assistant", "content": "hi", "refusal": None},
                {"role": "user", "content": "hello", "name": "bo"},
            ]
        },
    ),
    ("/v1/completions", {"presence_penalty": 0, "repetition_penalty": 1, "skip_special_tokens": True, "best_of": 1}),
]


@pytest.mark.parametrize("path,extra", NEUTRAL)
def test_neutral_values_and_metadata_are_accepted_and_not_reported(server, path, extra):
    url, _ = server
    r = post(url, path, {**(CHAT if "chat" in path else COMPLETION), **extra})
    assert r.status_code == 200, r.text
    assert "x-leapdecode-ignored-fields" not in r.headers


def test_unknown_fields_are_listed_in_a_header_and_change_nothing(server, caplog):
    url, _ = server
    plain = post(url, "/v1/chat/completions", CHAT)
    extra = {"frobnicate": 3, "messages": [{"role": "user", "content": "hello", "mood": "calm"}]}
    r = post(url, "/v1/chat/completions", {**CHAT, **extra})
    assert r.status_code == 200
    assert r.headers["x-leapdecode-ignored-fields"] == "frobnicate,messages.0.mood"
    assert r.json()["choices"][0]["message"] == plain.json()["choices"][0]["message"]
    assert any("frobnicate" in rec.getMessage() for rec in caplog.records)
    with httpx.stream(
        "POST", url + "/v1/completions", json={**COMPLETION, "stream": True, "frobnicate": 1}, timeout=30
    ) as s:
        assert s.headers["x-leapdecode-ignored-fields"] == "frobnicate"


def test_request_id_names_the_response(server):
    url, _ = server
    assert post(url, body={**COMPLETION, "request_id": "abc-1"}).json()["id"] == "cmpl-abc-1"
    error_of(post(url, body={**COMPLETION, "request_id": "a b"}), 400, param="request_id")


# ---- /tokenize, /detokenize, /version -------------------------------------------------------------------------------


def test_tokenize_and_detokenize_as_vllm(server, target):
    url, _ = server
    r = post(url, "/tokenize", {"model": "tiny", "prompt": "hello world w3"})
    body = r.json()
    assert r.status_code == 200 and body["tokens"] == encode_prompt(target.tokenizer, "hello world w3", raw=True)
    assert body["count"] == len(body["tokens"]) and body["max_model_len"] == 160 and body["token_strs"] is None
    chat = post(url, "/tokenize", {"messages": [{"role": "user", "content": "hi w1"}], "return_token_strs": True})
    expected = encode_prompt(target.tokenizer, [{"role": "user", "content": "hi w1"}])
    assert chat.json()["tokens"] == expected and len(chat.json()["token_strs"]) == len(expected)
    # a prefilled answer: the count is the prompt a chat completion with the same fields reads
    prefilled = {"messages": [{"role": "user", "content": "hi w1"}, {"role": "assistant", "content": "the w3"}]}
    prefilled |= {"continue_final_message": True, "add_generation_prompt": False}
    counted = post(url, "/tokenize", prefilled).json()
    assert counted["tokens"] == encode_prompt(target.tokenizer, prefilled["messages"], continue_final=True)
    answered = post(url, "/v1/chat/completions", {**CHAT, **prefilled, "max_tokens": 1}).json()
    assert answered["usage"]["prompt_tokens"] == counted["count"] != len(expected)
    error_of(post(url, "/tokenize", {**prefilled, "add_generation_prompt": True}), 400, param="continue_final_message")
    back = post(url, "/detokenize", {"model": "tiny", "tokens": body["tokens"]})
    assert back.status_code == 200 and back.json() == {"prompt": "hello world w3"}
    error_of(post(url, "/detokenize", {"tokens": [10**6]}), 400, param="tokens")
    error_of(post(url, "/tokenize", {"model": "nope", "prompt": "x"}), 404)
    error_of(post(url, "/tokenize", {}), 400)
    assert httpx.get(url + "/version").json() == {"version": __version__}


def test_openai_client_and_http_counters_add_up(server):
    url, state = server

    def count() -> float:
        total = 0.0
        for line in httpx.get(url + "/metrics").text.splitlines():
            if line.startswith("leapdecode:http_requests_total{") and 'endpoint="/v1/' in line and "models" not in line:
                total += float(line.rsplit(" ", 1)[1])
        return total

    before = count()
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
    client.completions.create(model="tiny", prompt="hello", max_tokens=2, temperature=0)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], tool_choice="auto")
    post(url, origin="https://evil.example")  # refused in front of the handler, still counted
    post(url, host="evil.example")
    httpx.post(url + "/v1/completions", content=b"{}", headers={"content-type": "text/plain"})
    assert count() == before + 5


# ---- vLLM's sampling and stop options over HTTP ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [
        dict(max_tokens=14, ignore_eos=True),
        dict(max_tokens=30, min_tokens=8),
        dict(max_tokens=30, stop_token_ids=[2]),
        dict(max_tokens=20, temperature=1.5, min_p=0.2, seed=3),
    ],
)
def test_min_p_ignore_eos_min_tokens_stop_token_ids(server, target, options):
    from leapdecode import generate

    url, _ = server
    prompt = "w22 w6 hello w34"  # greedy: three tokens, then the end of sequence
    r = post(url, "/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": prompt}], **options})
    assert r.status_code == 200, r.text
    assert "x-leapdecode-ignored-fields" not in r.headers
    renamed = {"max_new_tokens" if k == "max_tokens" else k: v for k, v in options.items()}
    ref = generate(target, prompt, drafter="none", **renamed)
    assert r.json()["choices"][0]["message"]["content"] == ref.text
    assert r.json()["usage"]["completion_tokens"] == len(ref.token_ids)


@pytest.mark.parametrize(
    "extra,param",
    [
        ({"stop_token_ids": [10**6]}, "stop_token_ids"),
        ({"stop_token_ids": "x"}, "stop_token_ids"),
        ({"min_tokens": 9, "max_tokens": 3}, "min_tokens"),
        ({"min_p": 1.5}, "min_p"),
        ({"ignore_eos": "yes"}, "ignore_eos"),
    ],
)
def test_bad_sampling_options_get_a_400_naming_them(server, extra, param):
    url, _ = server
    error_of(post(url, body={**COMPLETION, **extra}), 400, param=param)
