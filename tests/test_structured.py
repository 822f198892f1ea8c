"""Structured output (a JSON schema, any JSON object, a regex, a choice, a Lark grammar): every row masked by the
grammar after the output and the drafts before it. Checked against HF `generate` with a reference processor that
runs its own llguidance matcher on the tokens HF generated (sharing no leapdecode code), for every drafter, greedy and
seeded sampling, alone and in the batched Engine; planted bugs must fail the same checks."""

from __future__ import annotations

import json
import re

import pytest
import torch
from hf_reference import hf_greedy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_engine import run
from tiny_hf import make_tiny_bpe_dir

from leapdecode import generate, kernels
from leapdecode.drafters.oracle import OracleDrafter
from leapdecode.engine import Engine
from leapdecode.errors import LeapDecodeError
from leapdecode.params import RequestParams
from leapdecode.prompt import encode_prompt
from leapdecode.structured import GrammarState, StructuredOutput

DRAFTERS = ("none", "prompt-lookup", "ngram")
PROMPT = "hello"
SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer"}},
    "required": ["ok", "n"],
    "additionalProperties": False,
}
GRAMMARS = [
    {"regex": "[0-9]{4}-[0-9]{2}-[0-9]{2}"},
    {"choice": ["yes", "no", "maybe"]},
    {"json": SCHEMA},
    {"json_object": True},
    {"grammar": 'start: "the " ("cat" | "mat") " sat on the " ("cat" | "mat")'},
]


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    from leapdecode.models import resolve_model

    return resolve_model(str(make_tiny_bpe_dir(tmp_path_factory.mktemp("structured") / "tiny")))


def follows(structured: dict, text: str) -> bool:
    """A finished output is in the grammar's language."""
    kind, spec = next(iter(structured.items()))
    if kind == "regex":
        return re.fullmatch(spec, text) is not None
    if kind == "choice":
        return text in spec
    if kind in ("json", "json_object"):
        value = json.loads(text)
        return isinstance(value, dict) and (kind == "json_object" or set(value) == {"ok", "n"})
    return re.fullmatch(r"the (cat|mat) sat on the (cat|mat)", text) is not None


def oracles(reference: list[int]) -> list[OracleDrafter]:
    """One drafter that knows the answer (every draft accepted), one wrong from token 3 on (rejected, rolled back)."""
    return [OracleDrafter(reference), OracleDrafter(reference[:3] + [(t + 7) % 300 + 1 for t in reference[3:]])]


@pytest.mark.parametrize("structured", GRAMMARS, ids=lambda g: next(iter(g)))
@pytest.mark.parametrize("argmax_head", ["auto", "on"])  # "on": greedy steps would read an argmax-only output head
def test_greedy_under_a_grammar_is_hf_greedy_for_every_drafter(target, structured, argmax_head):
    prompt_ids = encode_prompt(target.tokenizer, PROMPT, raw=True)
    expected = hf_greedy(target, prompt_ids, 40, structured)
    assert expected != hf_greedy(target, prompt_ids, 40, None)
    for drafter in (*DRAFTERS, *oracles(expected)):
        with kernels.configured(argmax_head=argmax_head):
            got = generate(target, PROMPT, raw=True, drafter=drafter, max_new_tokens=40, structured_output=structured)
        assert got.token_ids == expected, (drafter, structured)
        if got.stats.stop_reason == "eos":
            assert follows(structured, got.text), got.text
    assert expected[-1] == 0 or next(iter(structured)) in ("json_object", "json")  # most end by the grammar


def test_seeded_sampling_under_a_grammar_is_plain_sampling(target):
    for structured in GRAMMARS:
        for seed in range(2):
            options = dict(raw=True, max_new_tokens=40, temperature=0.9, seed=seed, structured_output=structured)
            plain = generate(target, PROMPT, drafter="none", **options)
            for drafter in ("prompt-lookup", *oracles(plain.token_ids)):
                assert generate(target, PROMPT, drafter=drafter, **options).token_ids == plain.token_ids
            if plain.stats.stop_reason == "eos":
                assert follows(structured, plain.text), plain.text


def test_a_draft_is_cut_before_the_first_token_the_grammar_refuses(target):
    structured = GRAMMARS[0]  # a date: eight tokens here
    prompt_ids = encode_prompt(target.tokenizer, PROMPT, raw=True)
    answer = hf_greedy(target, prompt_ids, 12, structured)
    refused = target.tokenizer.encode("{", add_special_tokens=False)
    drafter = OracleDrafter(answer[:3] + refused + answer[3:])
    # a fixed draft length: the adaptive one follows measured step times, which a busy host changes
    options = dict(draft_length=4, adaptive_draft_length=False)
    got = generate(
        target, PROMPT, raw=True, drafter=drafter, max_new_tokens=12, structured_output=structured, **options
    )
    assert got.token_ids == answer
    # the prefill gave answer[0]; then answer[1:3] were drafted, and "{" and what follows it never verified (the
    # oracle then sees the output leave its reference and drafts nothing more)
    assert got.stats.drafted_tokens == 2 and got.stats.accepted_draft_tokens == 2


def test_a_row_masked_by_the_state_before_the_draft_is_caught(target, monkeypatch):
    """Plant the bug (every row masked as the first, ignoring the drafts before it): equality with HF must fail."""
    original = GrammarState.mask

    def before_draft(self, logits, draft):
        first = original(self, logits[:1], [])
        return logits.float().masked_fill(torch.isneginf(first), float("-inf"))

    monkeypatch.setattr(GrammarState, "mask", before_draft)
    prompt_ids = encode_prompt(target.tokenizer, PROMPT, raw=True)
    failures = 0
    for structured in GRAMMARS:
        expected = hf_greedy(target, prompt_ids, 40, structured)
        failures += _try(target, OracleDrafter(expected), structured) != expected
    assert failures > 0


def test_a_grammar_turns_off_the_argmax_only_output_head(target):
    """Masked rows need true logits for every allowed token, not only the unmasked argmax."""
    from leapdecode.controller import DraftLengthController
    from leapdecode.drafters import make_drafter
    from leapdecode.sampling import SamplingConfig
    from leapdecode.sequence import SequenceState
    from leapdecode.structured import grammar_for

    def state(structured):
        return SequenceState(
            [5, 6],
            make_drafter("none"),
            sampling=SamplingConfig(),
            controller=DraftLengthController(),
            max_new_tokens=4,
            eos_ids={0},
            context_length=64,
            grammar=grammar_for(StructuredOutput.of(structured), target),
        )

    assert state(None).argmax_only and not state(GRAMMARS[0]).argmax_only


def _try(target, drafter, structured):
    try:
        return generate(
            target, PROMPT, raw=True, drafter=drafter, max_new_tokens=40, structured_output=structured
        ).token_ids
    except LeapDecodeError:  # the output left its grammar: also a failure
        return None


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    specs=st.lists(
        st.tuples(st.integers(0, 4), st.integers(1, 12), st.integers(1, 30), st.integers(-1, len(GRAMMARS) - 1)),
        min_size=1,
        max_size=5,
    ),
    drafter=st.sampled_from(DRAFTERS),
    max_batch_tokens=st.sampled_from([3, 8, 64]),
    seed=st.integers(0, 10**6),
)
def test_engine_batches_under_grammars_equal_hf_greedy_alone(target, specs, drafter, max_batch_tokens, seed):
    """Requests with different grammars (or none) arriving over the first steps, sharing steps."""
    gen = torch.Generator().manual_seed(seed)
    vocab = len(target.tokenizer)
    requests = [
        (at, torch.randint(1, vocab, (length,), generator=gen).tolist(), n, GRAMMARS[g] if g >= 0 else None)
        for at, length, n, g in specs
    ]
    engine = Engine(target, drafter=drafter, max_batch_tokens=max_batch_tokens, max_sequences=3)
    outputs = run(engine, [(at, prompt, n, {"structured_output": g}) for at, prompt, n, g in requests])
    for i, (_, prompt, n, structured) in enumerate(requests):
        got = [t for o in outputs[i] for t in o.new_token_ids]
        assert got == hf_greedy(target, prompt, n, structured), (i, structured)


@pytest.mark.parametrize(
    "value,match",
    [
        ({"regex": "[0-9", "choice": ["a"]}, "exactly one"),
        ({"colour": "red"}, "unknown kind"),
        ({"choice": []}, "choice"),
        ({"json": 3}, "json"),
        ("json", "structured_output"),
    ],
)
def test_bad_specs_fail_in_one_line(value, match):
    with pytest.raises(LeapDecodeError, match=match):
        RequestParams(structured_output=value)


@pytest.mark.parametrize(
    "value", [{"regex": "[0-9"}, {"json": '{"type": "objectx"}'}, {"json": "{bad"}, {"grammar": "start: ("}]
)
def test_grammars_that_do_not_compile_fail_at_once(target, value):
    engine = Engine(target, drafter="none")
    with pytest.raises(LeapDecodeError, match="structured_output") as info:
        engine.add_request(PROMPT, raw=True, structured_output=value)
    assert "\n" not in str(info.value)
    assert not engine.has_work
    with pytest.raises(LeapDecodeError, match="structured_output"):
        generate(target, PROMPT, raw=True, structured_output=value)


# ---- through the server, with the openai client ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def client(target):
    from live_server import client_of, served

    with served(target, max_sequences=4) as (url, _):
        yield client_of(url)


@pytest.mark.parametrize(
    "request_fields,structured",
    [
        (dict(response_format={"type": "json_object"}), {"json_object": True}),
        (
            dict(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}),
            {"json": SCHEMA},
        ),
        (dict(extra_body={"structured_outputs": {"regex": GRAMMARS[0]["regex"]}}), GRAMMARS[0]),
        (dict(extra_body={"guided_choice": ["yes", "no", "maybe"]}), GRAMMARS[1]),
        (dict(extra_body={"guided_regex": GRAMMARS[0]["regex"]}), GRAMMARS[0]),
        (dict(extra_body={"guided_grammar": GRAMMARS[4]["grammar"]}), GRAMMARS[4]),
    ],
)
def test_openai_response_format_and_vllm_fields(client, target, request_fields, structured):
    ref = generate(target, PROMPT, drafter="none", max_new_tokens=40, structured_output=structured)
    chat = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": PROMPT}], max_tokens=40, temperature=0, **request_fields
    )
    assert chat.choices[0].message.content == ref.text
    chunks = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=40,
        temperature=0,
        stream=True,
        **request_fields,
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == ref.text
    raw = generate(target, PROMPT, raw=True, drafter="none", max_new_tokens=40, structured_output=structured)
    extra = request_fields.get("extra_body", {}) | {k: v for k, v in request_fields.items() if k != "extra_body"}
    done = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=40, temperature=0, extra_body=extra)
    assert done.choices[0].text == raw.text


@pytest.mark.parametrize(
    "fields,param",
    [
        (dict(response_format={"type": "yaml"}), "response_format"),
        (dict(response_format={"type": "json_schema", "json_schema": {"name": "x"}}), "response_format"),
        (dict(response_format={"type": "json_object"}, extra_body={"guided_regex": "a+"}), "response_format"),
        (dict(extra_body={"guided_regex": "[0-9"}), None),
        (dict(extra_body={"structured_outputs": {"colour": "red"}}), None),
    ],
)
def test_bad_structured_requests_get_a_400(client, fields, param):
    import openai

    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": PROMPT}], max_tokens=5, **fields
        )
    error = info.value.body
    assert "\n" not in error["message"]
    if param:
        assert error["param"] == param
    assert client.models.list().data  # still serving


def test_a_word_level_tokenizer_refuses_grammars_in_one_line(tmp_path):
    from tiny_hf import make_tiny_hf_dir

    from leapdecode.models import resolve_model

    words = resolve_model(str(make_tiny_hf_dir(tmp_path / "words")))
    with pytest.raises(LeapDecodeError, match="not available for this tokenizer"):
        generate(words, "w1 w2", raw=True, structured_output={"regex": "w1+"})


def test_the_generate_command_takes_a_grammar(target, capsys, tmp_path):
    from leapdecode.cli import main

    model = target.path
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(SCHEMA))
    for flags, structured in (
        (["--regex", GRAMMARS[0]["regex"]], GRAMMARS[0]),
        (["--choice", "yes", "--choice", "no", "--choice", "maybe"], GRAMMARS[1]),
        (["--json-schema", str(schema)], {"json": SCHEMA}),
        (["--json-object"], {"json_object": True}),
    ):
        assert main(["generate", PROMPT, "--model", model, "--raw", "--max-new-tokens", "40", "--json", *flags]) == 0
        expected = generate(target, PROMPT, raw=True, max_new_tokens=40, structured_output=structured).text
        assert json.loads(capsys.readouterr().out)["text"] == expected
    assert main(["generate", PROMPT, "--model", model, "--regex", "[0-9"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "regex" in err


def test_min_tokens_gives_way_where_the_grammar_can_only_end(target):
    """A complete grammar allows only the end of sequence; min_tokens masks it: the output ends (plain and
    speculative alike) instead of drawing from nothing."""
    for drafter in ("none", "prompt-lookup"):
        got = generate(
            target, PROMPT, raw=True, drafter=drafter, max_new_tokens=10, min_tokens=5, structured_output=GRAMMARS[1]
        )
        assert got.text in ("yes", "no", "maybe") and got.stats.stop_reason == "eos"
    from leapdecode.sequence import _suppress

    only_the_end = torch.full((2, 8), float("-inf"))
    only_the_end[:, 3] = 0.5  # token 3 the end of sequence, the only one the grammar allows
    only_the_end[1, 5] = 1.0
    kept = _suppress(only_the_end, {3}, rows=2)
    assert kept[0, 3] == 0.5 and kept[1, 3] == float("-inf") and kept[1, 5] == 1.0
