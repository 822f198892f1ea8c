"""vLLM's request options min_p, ignore_eos, min_tokens and stop_token_ids (issue 34, item 3), checked against HF
`generate` and its logits warpers on a tiny local model, and lossless under speculation: with a drafter, greedy
output and seeded sampling give exactly the tokens of plain decoding, in `generate` and in the batched Engine."""

from __future__ import annotations

import pytest
import torch
from tiny_hf import make_tiny_hf_dir
from transformers import (
    LogitsProcessorList,
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from leapdecode import generate
from leapdecode.engine import Engine
from leapdecode.errors import LeapDecodeError
from leapdecode.models import resolve_model
from leapdecode.params import RequestParams
from leapdecode.prompt import encode_prompt
from leapdecode.sampling import SamplingConfig, probabilities

EOS_EARLY = "w22 w6 hello w34"  # chat, greedy: [56, 2, 3, <eos>] on this model
RAW = "w1 w7"  # raw, greedy: [63, 40, 6, 27, ...] and no end of sequence for 150 tokens


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return resolve_model(str(make_tiny_hf_dir(tmp_path_factory.mktemp("options") / "tiny", context=160)))


def hf_greedy(target, prompt, n, raw=False, **options) -> list[int]:
    ids = torch.tensor([encode_prompt(target.tokenizer, prompt, raw=raw)])
    with torch.no_grad():
        out = target.model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False, pad_token_id=0, **options
        )
    return out[0, ids.shape[1] :].tolist()


def both(target, prompt, **options):
    """(plain, speculative) results of generate."""
    return (
        generate(target, prompt, drafter="none", **options),
        generate(target, prompt, drafter="prompt-lookup", **options),
    )


def test_the_prompts_behave_as_the_tests_assume(target):
    assert generate(target, EOS_EARLY, max_new_tokens=20).token_ids == [56, 2, 3, 1]
    assert generate(target, RAW, raw=True, max_new_tokens=6).token_ids[:4] == [63, 40, 6, 27]


# ---- min_p ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cfg",
    [
        SamplingConfig(temperature=1.0, min_p=0.1),
        SamplingConfig(temperature=0.7, min_p=0.3, top_k=20),
        SamplingConfig(temperature=1.3, min_p=0.05, top_p=0.9),
        SamplingConfig(temperature=1.0, min_p=1.0),
    ],
)
def test_min_p_is_hf_min_p_after_the_other_warpers(cfg):
    torch.manual_seed(0)
    logits = torch.randn(5, 96) * 3
    warpers = [TemperatureLogitsWarper(cfg.temperature)]
    if cfg.top_k:
        warpers.append(TopKLogitsWarper(cfg.top_k))
    if cfg.top_p < 1:
        warpers.append(TopPLogitsWarper(cfg.top_p))
    warpers.append(MinPLogitsWarper(cfg.min_p))
    expected = LogitsProcessorList(warpers)(None, logits.clone()).softmax(-1)
    got = probabilities(logits, cfg)
    assert torch.equal(got > 0, expected > 0)  # the same tokens survive
    torch.testing.assert_close(got, expected)


def test_min_p_sampling_is_lossless_under_speculation(target):
    for seed in range(3):
        plain, spec = both(target, RAW, raw=True, max_new_tokens=30, temperature=1.5, min_p=0.2, seed=seed)
        assert spec.token_ids == plain.token_ids
    # greedy: min_p keeps the most likely token, so nothing changes
    assert generate(target, RAW, raw=True, max_new_tokens=10, min_p=0.5).token_ids == hf_greedy(target, RAW, 10, True)


# ---- ignore_eos, min_tokens, stop_token_ids -------------------------------------------------------------------------


def test_ignore_eos_runs_past_the_end_of_sequence_as_hf_without_one(target):
    plain, spec = both(target, EOS_EARLY, max_new_tokens=14, ignore_eos=True)
    assert plain.token_ids == spec.token_ids == hf_greedy(target, EOS_EARLY, 14, eos_token_id=None)
    assert plain.token_ids[3] == 1 and len(plain.token_ids) == 14 and plain.stats.stop_reason == "length"


def test_min_tokens_masks_the_end_of_sequence_before_it(target):
    plain, spec = both(target, EOS_EARLY, max_new_tokens=40, min_tokens=8)
    expected = hf_greedy(target, EOS_EARLY, 40, min_new_tokens=8, eos_token_id=1)
    assert plain.token_ids == spec.token_ids == expected
    assert 1 not in plain.token_ids[:8]


def test_stop_token_ids_end_the_output_and_stay_in_it(target):
    plain, spec = both(target, RAW, raw=True, max_new_tokens=30, stop_token_ids=[27])
    assert plain.token_ids == spec.token_ids == [63, 40, 6, 27]
    assert plain.stats.stop_reason == "stop"
    plain, spec = both(target, RAW, raw=True, max_new_tokens=40, stop_token_ids=[27], min_tokens=6)
    expected = hf_greedy(target, RAW, 40, True, min_new_tokens=6, eos_token_id=[1, 27])
    assert plain.token_ids == spec.token_ids == expected and 27 not in expected[:6]


def test_seeded_sampling_with_stop_options_is_lossless(target):
    options = dict(max_new_tokens=30, temperature=1.2, min_tokens=5, stop_token_ids=[27, 18], ignore_eos=True)
    for seed in range(3):
        plain, spec = both(target, RAW, raw=True, seed=seed, **options)
        assert spec.token_ids == plain.token_ids
        assert not {27, 18} & set(plain.token_ids[:5])


def test_the_engine_honours_them_too(target):
    engine = Engine(target, drafter="prompt-lookup", max_sequences=4)
    requests = [
        (EOS_EARLY, dict(max_new_tokens=14, ignore_eos=True)),
        (EOS_EARLY, dict(max_new_tokens=40, min_tokens=8)),
        (RAW, dict(max_new_tokens=30, stop_token_ids=[27], raw=True)),
        (RAW, dict(max_new_tokens=30, temperature=1.5, min_p=0.2, seed=4, raw=True)),
    ]
    for prompt, options in requests:
        (got,) = engine.generate_many([prompt], **options)
        assert got.token_ids == generate(target, prompt, drafter="none", **options).token_ids, options


# ---- stop strings in generate (as in the Engine) --------------------------------------------------------------------


def first_tokens_holding(target, token_ids, text) -> list[int]:
    """The shortest prefix of token_ids whose text contains `text`: where plain decoding meets that stop string."""
    for n in range(1, len(token_ids) + 1):
        if text in target.tokenizer.decode(token_ids[:n], skip_special_tokens=True):
            return token_ids[:n]
    raise AssertionError(f"{text!r} is not in the output")


@pytest.mark.parametrize("drafter", ["none", "prompt-lookup", "ngram"])
@pytest.mark.parametrize("stop", [["w44 w55"], ["w44 w5", "w56"], ["w50 w6 "]])  # inside a token, two, after a space
def test_generate_ends_at_a_stop_string_where_plain_decoding_meets_it(target, drafter, stop):
    full = generate(target, RAW, raw=True, max_new_tokens=30)  # "... w50 w6 w32 w44 w55 w56 ..."; no stop
    at = min(full.text.index(s) for s in stop)
    first = min(stop, key=full.text.index)
    streamed = []
    got = generate(target, RAW, raw=True, max_new_tokens=30, stop=stop, drafter=drafter, stream=streamed.extend)
    assert got.text == full.text[:at]
    assert got.token_ids == streamed == first_tokens_holding(target, full.token_ids, first)
    assert got.stats.stop_reason == "stop" and got.stats.new_tokens == len(got.token_ids)
    kept = generate(
        target, RAW, raw=True, max_new_tokens=30, stop=stop, drafter=drafter, include_stop_str_in_output=True
    )
    assert kept.text == full.text[: at + len(first)] and kept.token_ids == got.token_ids
    (engine,) = Engine(target, drafter=drafter).generate_many([RAW], raw=True, max_new_tokens=30, stop=stop)
    assert (engine.text, engine.token_ids) == (got.text, got.token_ids)


def test_a_stop_string_never_met_changes_nothing(target):
    full = generate(target, RAW, raw=True, max_new_tokens=30, logprobs=2)
    got = generate(target, RAW, raw=True, max_new_tokens=30, logprobs=2, stop=["w99 w99"], drafter="prompt-lookup")
    assert (got.text, got.token_ids, got.stats.stop_reason) == (full.text, full.token_ids, "length")
    assert [lp.token for lp in got.logprobs] == got.token_ids
    cut = generate(target, RAW, raw=True, max_new_tokens=30, logprobs=2, stop=["w44 w55"])
    assert [lp.token for lp in cut.logprobs] == cut.token_ids  # the logprobs end with the output


def test_validation_in_one_line():
    with pytest.raises(LeapDecodeError, match="min_tokens"):
        RequestParams(max_new_tokens=4, min_tokens=5)
    with pytest.raises(LeapDecodeError, match="min_p"):
        RequestParams(min_p=1.5)
    with pytest.raises(LeapDecodeError, match="stop_token_ids"):
        RequestParams(stop_token_ids=[-1])
    with pytest.raises(LeapDecodeError, match="ignore_eos"):
        RequestParams(ignore_eos=1)
    assert RequestParams(stop_token_ids=[3, 4]).stop_token_ids == (3, 4)
