"""OpenAI's Responses API through the `openai` client: the answer equals `generate` on the same messages alone while
the server speculates (plain, streamed, continued with previous_response_id, under a JSON schema, with tool calls),
the stream's events come in order and add up to the final response, stored responses are bounded, and what the
server cannot do is a one-line 400 naming the field."""

from __future__ import annotations

import json

import openai
import pydantic
import pytest
from live_server import client_of, served
from tiny_hf import make_tiny_bpe_dir

from leapdecode import generate
from leapdecode.models import resolve_model
from leapdecode.serve.response_store import ResponseStore
from leapdecode.serve.responses_api import input_messages
from leapdecode.serve.tools import ToolChoice

WEATHER = {
    "type": "object",
    "properties": {"city": {"enum": ["Lima", "Paris"]}},
    "required": ["city"],
    "additionalProperties": False,
}
TOOL = {"type": "function", "name": "weather", "parameters": WEATHER}


class Pick(pydantic.BaseModel):  # a bounded schema: a random tiny model would write an open string forever
    city: str = pydantic.Field(json_schema_extra={"enum": ["Lima", "Paris"]})
    hot: bool


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return resolve_model(str(make_tiny_bpe_dir(tmp_path_factory.mktemp("responses") / "tiny", context=1024)))


@pytest.fixture(scope="module")
def client(target):
    with served(target, max_sequences=4) as (url, _):
        yield client_of(url)


def alone(target, messages, tokens, **options):
    return generate(target, messages, drafter="none", max_new_tokens=tokens, **options)


def test_an_answer_is_generate_alone_and_is_stored(client, target):
    r = client.responses.create(
        model="tiny", instructions="be brief", input="hello there", max_output_tokens=12, temperature=0
    )
    want = alone(target, [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}], 12)
    assert r.output_text == want.text and r.id.startswith("resp_") and r.object == "response"
    assert (
        (r.usage.input_tokens, r.usage.output_tokens)
        == (len(want.prompt_ids), len(want.token_ids))
        == (r.usage.input_tokens, 12)
    )
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    (item,) = r.output
    assert item.type == "message" and item.role == "assistant" and item.content[0].type == "output_text"
    assert client.responses.retrieve(r.id).output_text == r.output_text
    client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)
    unstored = client.responses.create(model="tiny", input="hi", max_output_tokens=2, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


def test_the_stream_adds_up_to_the_answer(client, target):
    events = list(
        client.responses.create(model="tiny", input="hello", max_output_tokens=16, temperature=0, stream=True)
    )
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == alone(target, [{"role": "user", "content": "hello"}], 16).text == events[-1].response.output_text
    with client.responses.stream(model="tiny", input="hello", max_output_tokens=16, temperature=0) as stream:
        assert stream.get_final_response().output_text == text  # the client's own helper reads the events


def test_previous_response_id_continues_the_conversation(client, target):
    first = client.responses.create(
        model="tiny", instructions="not carried over", input="one", max_output_tokens=6, temperature=0
    )
    second = client.responses.create(
        model="tiny", input="two", previous_response_id=first.id, max_output_tokens=6, temperature=0
    )
    history = [
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "two"},
    ]
    assert second.output_text == alone(target, history, 6).text
    explicit = client.responses.create(
        model="tiny",
        input=[
            {"role": "user", "content": [{"type": "input_text", "text": "one"}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": first.output_text}]},
            {"role": "user", "content": "two"},
        ],
        max_output_tokens=6,
        temperature=0,
    )
    assert explicit.output_text == second.output_text and explicit.usage.input_tokens == second.usage.input_tokens


def test_a_json_schema_answer_equals_the_grammar_alone(client, target):
    schema = openai.lib._pydantic.to_strict_json_schema(Pick)
    r = client.responses.create(
        model="tiny",
        input="pick",
        text={"format": {"type": "json_schema", "name": "pick", "schema": schema, "strict": True}},
        max_output_tokens=40,
        temperature=0,
    )
    want = alone(target, [{"role": "user", "content": "pick"}], 40, structured_output={"json": schema})
    unconstrained = alone(target, [{"role": "user", "content": "pick"}], 40)
    assert r.output_text == want.text != unconstrained.text and r.output_text.startswith("{")


@pytest.mark.parametrize("stream", [False, True])
def test_tool_calls_are_function_call_items_and_go_back_in_the_input(client, target, stream):
    choice = ToolChoice([{"type": "function", "function": TOOL}], "required", None)
    want = json.loads(
        alone(target, [{"role": "user", "content": "weather?"}], 60, structured_output=choice.structured()).text
    )
    r = client.responses.create(
        model="tiny",
        input="weather?",
        tools=[TOOL],
        tool_choice="required",
        max_output_tokens=60,
        temperature=0,
        stream=stream,
    )
    if stream:
        events = list(r)
        assert "response.function_call_arguments.done" in [e.type for e in events]
        r = events[-1].response
    calls = [item for item in r.output if item.type == "function_call"]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [(w["name"], w["parameters"]) for w in want]
    follow = client.responses.create(
        model="tiny",
        input=[
            {"role": "user", "content": "weather?"},
            *({"type": "function_call", "call_id": c.call_id, "name": c.name, "arguments": c.arguments} for c in calls),
            *({"type": "function_call_output", "call_id": c.call_id, "output": "18 C"} for c in calls),
        ],
        max_output_tokens=4,
        temperature=0,
    )
    assert follow.output[0].type == "message" and follow.usage.input_tokens > r.usage.input_tokens


def test_input_items_become_chat_messages():
    calls = [{"type": "function_call", "call_id": f"c{i}", "name": "weather", "arguments": "{}"} for i in (1, 2)]
    messages = input_messages(
        [
            {"role": "developer", "content": "rules"},
            {"role": "user", "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}]},
            *calls,
            {"type": "function_call_output", "call_id": "c1", "output": "18 C"},
        ]
    )
    assert messages[:2] == [{"role": "system", "content": "rules"}, {"role": "user", "content": "ab"}]
    assert messages[2]["role"] == "assistant" and [c["id"] for c in messages[2]["tool_calls"]] == ["c1", "c2"]
    assert messages[3] == {"role": "tool", "tool_call_id": "c1", "content": "18 C"} and len(messages) == 4


def test_logprobs_come_with_the_text(client):
    r = client.responses.create(
        model="tiny", input="hello", max_output_tokens=5, top_logprobs=2, include=["message.output_text.logprobs"]
    )
    part = r.output[0].content[0]
    assert len(part.logprobs) == 5 == r.usage.output_tokens
    assert all(len(lp.top_logprobs) == 2 and lp.logprob <= 0 for lp in part.logprobs)


@pytest.mark.parametrize(
    "options,param",
    [
        ({"background": True}, "background"),
        ({"reasoning": {"effort": "high"}}, "reasoning"),
        ({"truncation": "auto"}, "truncation"),
        ({"tools": [{"type": "web_search"}]}, "tools"),
        ({"previous_response_id": "resp_unknown"}, "previous_response_id"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input.0.content"),
        ({"input": [{"type": "reasoning", "summary": []}]}, "input.0.type"),
        ({"input": []}, "input"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"text": {"format": {"type": "xml"}}}, "text.format"),
    ],
)
def test_what_cannot_run_is_a_one_line_400(client, options, param):
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model="tiny", **{"input": "hi", **options})
    assert info.value.body["param"] == param and "\n" not in info.value.body["message"]
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="another", input="hi")
    assert client.responses.create(model="tiny", input="hi", max_output_tokens=2, temperature=0).usage.output_tokens


def test_the_store_is_bounded_least_recently_used_out():
    store = ResponseStore(limit=2, characters=10_000)
    for rid in ("a", "b"):
        store.put({"id": rid}, [{"role": "user", "content": rid}])
    store.get("a")  # used: b is now the oldest
    store.put({"id": "c"}, [])
    assert store.get("b") is None and store.get("a") is not None and len(store) == 2
    store.put({"id": "big"}, [{"role": "user", "content": "x" * 20_000}])  # over the characters alone
    assert len(store) == 0 and store.get("big") is None
    assert not store.delete("a")


@pytest.mark.slow
def test_a_conversation_on_smollm2_is_greedy_alone():
    """SmolLM2-135M with its shipped head (the server's default drafter): two turns chained by previous_response_id,
    the second streamed, each equal to `generate` without drafts on the same history."""
    target = resolve_model("smollm2-135m")
    with served(target, drafter="auto") as (url, _):
        client = client_of(url)
        first = client.responses.create(
            model="tiny", input="Give me three tips for learning to cook.", max_output_tokens=64, temperature=0
        )
        events = list(
            client.responses.create(
                model="tiny",
                input="Now make the second tip longer.",
                previous_response_id=first.id,
                max_output_tokens=64,
                temperature=0,
                stream=True,
            )
        )
    history = [{"role": "user", "content": "Give me three tips for learning to cook."}]
    assert first.output_text == alone(target, history, 64).text
    history += [
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "Now make the second tip longer."},
    ]
    assert events[-1].response.output_text == alone(target, history, 64).text
    assert events[-1].response.leapdecode["drafter"] == "head"
