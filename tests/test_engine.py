"""The batched Engine: every greedy request returns exactly what plain greedy decoding of it alone returns, whatever
shares its steps (arrivals, chunk sizes, drafters, prefix reuse, cancellations); sampling, stop strings, bad input,
memory. Tiny in-process models with decisive heads (see conftest), so a mismatch is a bug, not a rounding tie."""

from __future__ import annotations

import functools

import pytest
import torch
from conftest import noisy_copy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiny_hf import make_tiny_hf_dir

from leapdecode import generate
from leapdecode.controller import DraftDemand, DraftLengthController, StepCost, plan_draft_lengths
from leapdecode.engine import Engine
from leapdecode.errors import LeapDecodeError
from leapdecode.models import resolve_model

DRAFTERS = ("none", "prompt-lookup", "ngram", "draft-model", "select")


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return resolve_model(str(make_tiny_hf_dir(tmp_path_factory.mktemp("engine") / "tiny", context=160)))


@pytest.fixture(scope="module")
def draft(target):
    return noisy_copy(target.model, seed=3, noise=0.3)


def engine(target, draft, drafter="none", **options):
    """An engine on the tiny target; the draft model drafts whatever its confidence (so drafts really get verified)."""
    if drafter == "draft-model":
        options.update(draft_model=draft, draft_dtype="float32", drafter_options={"confidence": 0.0})
    return Engine(target, drafter=drafter, **options)


@functools.lru_cache(maxsize=None)
def _solo(model_id, prompt: tuple, max_new_tokens: int) -> list[int]:
    return generate(
        _TARGETS[model_id], list(prompt), drafter="none", max_new_tokens=max_new_tokens, prefix_cache=False
    ).token_ids


_TARGETS: dict = {}


def solo(target, prompt, max_new_tokens):
    """Plain greedy decoding of the request alone (the single-request loop with no drafter)."""
    _TARGETS[id(target)] = target
    return _solo(id(target), tuple(prompt), max_new_tokens)


def run(eng, arrivals, cancels=(), on_step=None):
    """Drive the engine step by step: request i arrives at step arrivals[i][0] (an arrival is (step, prompt,
    max_new_tokens) or (step, prompt, max_new_tokens, request options)); cancels: {request index: step};
    `on_step(eng)` after each step (what a test watches between steps)."""
    outputs: dict[int, list] = {}
    ids: dict[int, int] = {}
    cancels = dict(cancels)
    step = 0
    while step <= max([a[0] for a in arrivals] + list(cancels.values()), default=0) or eng.has_work:
        for i, (at, prompt, max_new, *options) in enumerate(arrivals):
            if at == step:
                ids[i] = eng.add_request(
                    prompt,
                    max_new_tokens=max_new,
                    on_output=lambda o, i=i: outputs.setdefault(i, []).append(o),
                    **(options[0] if options else {}),
                )
        for i, at in cancels.items():
            if at == step and i in ids:
                eng.cancel(ids[i])
        eng.step()
        if on_step is not None:
            on_step(eng)
        step += 1
        assert step < 2000
    return outputs


request = st.tuples(st.integers(0, 6), st.integers(1, 30), st.integers(1, 20), st.booleans())


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    requests=st.lists(request, min_size=1, max_size=5),
    drafter=st.sampled_from(DRAFTERS),
    max_batch_tokens=st.sampled_from([1, 3, 8, 64]),
    prefix_cache=st.sampled_from([0, 64]),
    cancel=st.one_of(st.none(), st.tuples(st.integers(0, 4), st.integers(0, 8))),
    seed=st.integers(0, 10**6),
)
def test_batch_greedy_equals_solo_greedy(
    target, draft, requests, drafter, max_batch_tokens, prefix_cache, cancel, seed
):
    gen = torch.Generator().manual_seed(seed)
    shared = torch.randint(4, 64, (20,), generator=gen).tolist()  # a common prefix, as a system prompt would be
    arrivals = []
    for at, length, max_new, share in requests:
        own = torch.randint(4, 64, (length,), generator=gen).tolist()
        arrivals.append((at, (shared + own) if share else own, max_new))
    eng = engine(target, draft, drafter, max_batch_tokens=max_batch_tokens, prefix_cache_tokens=prefix_cache)
    cancels = {cancel[0]: cancel[1]} if cancel else {}
    outputs = run(eng, arrivals, cancels)
    for i, (_, prompt, max_new) in enumerate(arrivals):
        got = [t for o in outputs[i] for t in o.new_token_ids]
        expected = solo(target, prompt, max_new)
        assert outputs[i][-1].finished and sum(o.finished for o in outputs[i]) == 1
        if outputs[i][-1].finish_reason == "abort":
            assert got == expected[: len(got)], f"request {i} ({drafter}) diverged before its cancellation"
        else:
            assert got == expected, f"request {i} ({drafter}, batch {max_batch_tokens}) differs from solo greedy"
    metrics = eng.metrics()
    assert metrics["running"] == metrics["waiting"] == metrics["kv_bytes"] == 0


def test_batch_really_shares_forwards_and_drafts(target, draft):
    """The engine is not decoding one request after another: 4 requests take far fewer steps than their tokens,
    and drafts are verified (and accepted) inside shared steps."""
    prompts = [[5 + i, 6, 7, 8, 5 + i, 6, 7] for i in range(4)]
    eng = engine(target, draft, "draft-model", max_batch_tokens=64)
    results = eng.generate_many(prompts, max_new_tokens=16)
    assert [r.token_ids for r in results] == [solo(target, p, 16) for p in prompts]
    m = eng.metrics()
    assert m["steps"] < sum(len(r.token_ids) for r in results) / 2
    assert m["spec_decode_num_accepted_tokens"] > 0
    assert m["step_seconds"] > m["forward_seconds"] > 0  # a step is its forward and more (drafting, verification)


def test_streams_do_not_draft_beside_a_prompt_being_read(target, draft):
    """A prompt chunk in a step means a request yields nothing until it is read: drafts wait for it, and once it is
    read the streams draft again."""
    eng = engine(target, draft, "draft-model", max_batch_tokens=8)
    schedule, steps = eng.scheduler.schedule, []

    def spy():
        plan = schedule()
        if plan is not None:
            decoding = [r for r in eng.scheduler.running if r.decoding]
            segments = plan.segments
            steps.append((len(decoding) < len(segments), [s.n for s in segments[: len(decoding)]]))
        return plan

    eng.scheduler.schedule = spy
    first, second = [5, 6, 7, 8, 5, 6, 7], [9, 10, 11, 12] * 8
    outputs = run(eng, [(0, first, 30), (4, second, 10)])
    assert [t for o in outputs[0] for t in o.new_token_ids] == solo(target, first, 30)
    assert any(chunk for chunk, _ in steps) and any(max(n, default=1) > 1 for _, n in steps)
    assert all(n == [1] * len(n) for chunk, n in steps if chunk)


def test_seeded_sampling_in_a_batch_draws_plain_sampling_tokens(target, draft):
    prompts = [[9, 10, 11], [12, 13, 14, 15, 16], [17]]
    for drafter in ("none", "prompt-lookup"):
        eng = engine(target, draft, drafter)
        batch = eng.generate_many(prompts, max_new_tokens=12, temperature=1.3, top_k=20, seed=7)
        alone = [
            generate(target, p, drafter="none", max_new_tokens=12, temperature=1.3, top_k=20, seed=7) for p in prompts
        ]
        assert [r.token_ids for r in batch] == [r.token_ids for r in alone]
    unseeded = engine(target, draft).generate_many([[9, 10, 11]] * 4, max_new_tokens=12, temperature=1.5)
    assert len({tuple(r.token_ids) for r in unseeded}) > 1  # a seed is drawn per request when none is given


def test_prefix_cache_reuses_and_stays_exact(target, draft):
    eng = engine(target, draft, prefix_cache_tokens=256)
    system = list(range(4, 60))
    first = eng.generate_many([system + [10, 11]], max_new_tokens=8)[0]
    second = eng.generate_many([system + [12, 13, 14]], max_new_tokens=8)[0]
    assert eng.prefix_cache.hits == 1 and eng.prefix_cache.tokens >= 48
    assert first.token_ids == solo(target, system + [10, 11], 8)
    assert second.token_ids == solo(target, system + [12, 13, 14], 8)
    next_turn = system + [12, 13, 14] + second.token_ids + [15, 16]  # repeats the second request and its answer
    answered = len(system) + 3 + len(second.token_ids) - 1  # rows the second request computed: prompt and output
    keys, _ = eng.prefix_cache.lookup(next_turn)
    assert keys[0].shape[1] == answered // eng.prefix_cache.block * eng.prefix_cache.block > len(system) + 3
    assert eng.generate_many([next_turn], max_new_tokens=8)[0].token_ids == solo(target, next_turn, 8)
    small = engine(target, draft, prefix_cache_tokens=32)
    small.generate_many([system + [1], list(range(10, 60))], max_new_tokens=2)
    assert small.prefix_cache.tokens <= 32  # bounded: least recently used blocks are evicted


@pytest.mark.parametrize("drafter", ["none", "prompt-lookup"])  # none: the stop string ends every step's tokens
def test_stop_strings_end_the_text_before_them(target, draft, drafter):
    eng = engine(target, draft, drafter)
    prompt = "w1 w2 w3 w4 w5"
    full = generate(target, prompt, drafter="none", max_new_tokens=20, raw=True)
    words = full.text.split()
    assert len(words) > 4
    stop = " ".join(words[2:4])
    result = eng.generate_many([prompt], max_new_tokens=20, raw=True, stop=[stop, "never-there"])[0]
    assert stop not in result.text and full.text.startswith(result.text)
    assert result.text == full.text[: full.text.index(stop)]
    assert result.stats.stop_reason == "stop" and len(result.token_ids) < len(full.token_ids)
    streamed = "".join(o.text for o in eng.stream(eng.add_request(prompt, max_new_tokens=20, raw=True, stop=stop)))
    assert streamed == result.text


@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(prompt=""), "empty"),
        (dict(prompt=[]), "empty"),
        (dict(prompt=[5] * 200), "context"),
        (dict(prompt=[5, 10**6]), "vocabulary"),
        (dict(max_new_tokens=0), "max_new_tokens"),
        (dict(max_new_tokens=2.5), "max_new_tokens"),
        (dict(temperature=-1.0), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_k=-3), "top_k"),
        (dict(stop=[""]), "stop"),
        (dict(seed="x"), "seed"),
    ],
)
def test_bad_requests_fail_alone(target, draft, bad, message):
    eng = engine(target, draft)
    good = eng.add_request([5, 6, 7], max_new_tokens=6)
    args = dict(prompt=[5, 6], max_new_tokens=4) | bad
    with pytest.raises(LeapDecodeError, match=message):
        eng.add_request(args.pop("prompt"), **args)
    outs = list(eng.stream(good))
    assert [t for o in outs for t in o.new_token_ids] == solo(target, [5, 6, 7], 6)


def test_cancel_frees_kv_at_once(target, draft):
    eng = engine(target, draft)
    rids = [eng.add_request([5, 6, 7, i + 8], max_new_tokens=50) for i in range(3)]
    for _ in range(4):
        eng.step()
    before = eng.metrics()["kv_bytes"]
    eng.cancel(rids[0])
    assert 0 < eng.metrics()["kv_bytes"] < before and eng.metrics()["running"] == 2
    for rid in rids[1:]:
        eng.cancel(rid)
    assert eng.metrics()["kv_bytes"] == 0 and not eng.has_work


def test_warm_up_serves_one_request_and_leaves_no_trace(target, draft):
    """The server's warm-up: a short request runs through prefill and decode steps (their row counts are then
    prepared), the counters start from zero after it, and the next request decodes as it would have."""
    e = engine(target, draft, drafter="prompt-lookup")
    assert e.warm_up() > 0
    assert 1 in e._seen_rows and len(e._seen_rows) >= 2  # a prompt's rows and single decode rows were stepped
    assert not e.has_work and set(e.counters.values()) == {0}
    # a decode-only step of every stream count was timed: chunk sizing reads measured costs, not a line between two
    assert set(range(1, e.max_sequences + 1)) <= set(e.scheduler.forward_costs.seconds)
    prompt = [5, 9, 13, 9, 13, 9]
    assert e.generate_many([prompt], max_new_tokens=12)[0].token_ids == solo(target, prompt, 12)


def test_generate_many_takes_generates_arguments(target, draft):
    eng = engine(target, draft)
    with pytest.raises(LeapDecodeError, match="drafter"):
        eng.generate_many(["w1"], drafter="ngram")
    with pytest.raises(LeapDecodeError):
        Engine(target, max_batch_tokens=0)
    chat = [{"role": "user", "content": "hello world"}]
    assert (
        eng.generate_many([chat], max_new_tokens=5)[0].token_ids == generate(target, chat, max_new_tokens=5).token_ids
    )


def test_planner_for_one_sequence_is_the_single_request_rule():
    costs = StepCost()
    for rows, seconds in {1: 0.05, 2: 0.051, 5: 0.055, 9: 0.07, 17: 0.12}.items():
        costs.record(rows, seconds)
    for acceptance in (0.1, 0.5, 0.8, 0.95):
        c = DraftLengthController(k_max=16, costs=costs)
        c.accepted, c.rejected = acceptance * 100, (1 - acceptance) * 100
        brute = max(range(17), key=lambda k: (sum(c.acceptance**j for j in range(k + 1)) / costs(k + 1), -k))
        assert c.best_k() == brute


def test_planner_drafts_less_when_rows_are_no_longer_free():
    """Flat cost up to 8 rows, then linear: 4 sequences draft well; 32 sequences (rows already costly) draft little."""
    costs = StepCost()
    for rows in (1, 8, 16, 32, 64, 128):
        costs.record(rows, 0.05 * max(1, rows / 8))
    demand = DraftDemand(acceptance=0.7, draft_seconds=0.0, cap=8)
    few = plan_draft_lengths([demand] * 4, costs, base_rows=4, base_tokens=4.0)
    many = plan_draft_lengths([demand] * 32, costs, base_rows=32, base_tokens=32.0)
    assert sum(few) >= 4 and sum(many) / 32 < sum(few) / 4
    assert plan_draft_lengths([DraftDemand(0.05, 0.0, 8)] * 32, costs, 32, 32.0) == [0] * 32  # hopeless: no drafts
