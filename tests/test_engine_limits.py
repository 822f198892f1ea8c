"""The Engine under a KV budget and under faults: it never holds more KV than its budget (prefix cache first, then
preemption by recompute), a preempted request still returns exactly its solo output, and a fault that belongs to one
request ends that request only."""

from __future__ import annotations

import pytest
import torch
from tiny_hf import make_tiny_hf_dir

from leapdecode import generate
from leapdecode.engine import Engine
from leapdecode.engine.engine import kv_bytes_per_token
from leapdecode.models import resolve_model

PROMPTS = [[5 + i, 6 + i, 7 + i, 8, 9 + i] * (2 + i % 3) for i in range(8)]


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return resolve_model(str(make_tiny_hf_dir(tmp_path_factory.mktemp("limits") / "tiny", context=256)))


def solo(target, prompt, max_new_tokens, **options):
    return generate(target, prompt, max_new_tokens=max_new_tokens, prefix_cache=False, **options).token_ids


def collect(engine, prompts, max_new_tokens=40, **options):
    """Run the prompts together; return per prompt (token ids, final output)."""
    outputs = {}
    ids = [
        engine.add_request(
            p,
            max_new_tokens=max_new_tokens,
            on_output=lambda o: outputs.setdefault(o.request_id, []).append(o),
            **options,
        )
        for p in prompts
    ]
    steps = 0
    while engine.has_work:
        engine.step()
        steps += 1
        assert steps < 5000
    return [([t for o in outputs[rid] for t in o.new_token_ids], outputs[rid][-1]) for rid in ids]


def test_a_request_preempted_with_a_draft_made_ahead_drops_it(target):
    """Prompt lookup drafts before the plan (it estimates acceptance); a request preempted in that step (KV) must
    not carry the draft into the step that ends its reading again, which verifies nothing."""
    from leapdecode.sequence import draft_ahead

    engine = Engine(target, drafter="prompt-lookup", prefix_cache_tokens=0)
    outputs: dict = {}
    ids = [
        engine.add_request(p, max_new_tokens=30, on_output=lambda o: outputs.setdefault(o.request_id, []).append(o))
        for p in PROMPTS[:2]
    ]
    victim = None
    while victim is None:  # step until a decoding request's context repeats itself: then lookup has a copy
        engine.step()
        for r in engine.scheduler.running:
            if victim is None and r.decoding and r.seq.out and draft_ahead([r.seq], [4], 0.0)[0]:
                victim = r
    assert victim.seq.ahead and victim.seq.draft.tokens
    engine.scheduler._preempt(victim)
    while engine.has_work:
        engine.step()
    for rid, prompt in zip(ids, PROMPTS[:2]):
        assert outputs[rid][-1].finish_reason == "length"
        assert [t for o in outputs[rid] for t in o.new_token_ids] == solo(target, prompt, 30)


@pytest.mark.parametrize("drafter", ["none", "prompt-lookup"])
def test_a_small_kv_budget_is_never_exceeded_and_preemption_loses_nothing(target, drafter):
    budget_tokens = 300  # a few requests' worth: the others wait or get preempted
    engine = Engine(
        target, drafter=drafter, kv_cache_bytes=budget_tokens * kv_bytes_per_token(target.model), prefix_cache_tokens=64
    )
    scheduler, preempted = engine.scheduler, []
    preempt = scheduler._preempt

    def newest_first(request):  # recompute preemption takes the newest running request
        admitted = [r.admitted for r in scheduler.running]
        assert request.admitted == max(admitted) and len(set(admitted)) == len(admitted)
        preempted.append(request)
        preempt(request)

    scheduler._preempt = newest_first
    results = collect(engine, PROMPTS, max_new_tokens=100)
    metrics = engine.metrics()
    assert metrics["num_preemptions"] == len(preempted) > 1  # the budget really bit, and the count says how often
    assert metrics["kv_peak_bytes"] <= metrics["kv_budget_bytes"]
    for prompt, (tokens, final) in zip(PROMPTS, results):
        assert final.finish_reason in ("stop", "length") and tokens == solo(target, prompt, 100)
    assert metrics["kv_bytes"] == 0 and metrics["running"] == 0 and not engine.has_work


def test_metrics_count_the_bytes_the_kv_tensors_hold(target):
    """metrics() counts KV bytes from rows (the server calls it after every step); they equal the tensors' own sizes."""
    engine = Engine(target, prefix_cache_tokens=64)
    for prompt in PROMPTS[:4]:
        engine.add_request(prompt, max_new_tokens=30)
    seen = 0
    while engine.has_work:
        engine.step()
        metrics, scheduler = engine.metrics(), engine.scheduler
        held = sum(t.numel() * t.element_size() for r in scheduler.running for t in r.kv.keys + r.kv.values)
        assert metrics["kv_bytes"] == held
        cached = sum(
            t.numel() * t.element_size() for b in scheduler.prefix_cache.blocks.values() for t in b.keys + b.values
        )
        assert metrics["prefix_cache_bytes"] == cached
        seen += held > 0 and cached > 0
    assert seen  # both were non-zero at some step


def test_at_most_max_sequences_run_and_every_prompt_token_is_counted_once(target):
    engine = Engine(target, max_sequences=2)
    scheduler, running = engine.scheduler, []
    admit = scheduler._admit
    scheduler._admit = lambda: (admit(), running.append(len(scheduler.running)))
    results = collect(engine, PROMPTS[:5], max_new_tokens=20)
    assert max(running) == 2  # the bound binds: five requests, two at a time
    assert [tokens for tokens, _ in results] == [solo(target, p, 20) for p in PROMPTS[:5]]
    assert engine.metrics()["prompt_tokens"] == sum(map(len, PROMPTS[:5]))


def test_seeded_sampling_is_reproducible_through_preemption(target):
    tight = Engine(target, kv_cache_bytes=250 * kv_bytes_per_token(target.model), prefix_cache_tokens=0)
    roomy = Engine(target)
    sampled = dict(temperature=1.2, top_k=30, seed=11, ignore_eos=True)  # 100 tokens each, whatever is drawn: preempted
    squeezed = collect(tight, PROMPTS, max_new_tokens=100, **sampled)
    assert tight.metrics()["num_preemptions"] > 0
    assert [t for t, _ in squeezed] == [t for t, _ in collect(roomy, PROMPTS, max_new_tokens=100, **sampled)]


def test_a_request_too_long_for_the_budget_fails_alone(target):
    engine = Engine(target, kv_cache_bytes=100 * kv_bytes_per_token(target.model), prefix_cache_tokens=0)
    (long_tokens, long_final), (short_tokens, short_final) = collect(engine, [[5, 6, 7] * 60, [5, 6, 7]], 8)
    assert long_final.finish_reason == "error" and "KV budget" in long_final.error
    assert short_final.finish_reason in ("stop", "length") and short_tokens == solo(target, [5, 6, 7], 8)


class Faulty:
    """Wraps the engine's drafter factory: drafters of requests whose prompt starts with token 66 raise."""

    def __init__(self, make):
        self.make = make

    def __call__(self):
        drafter = self.make()
        propose = drafter.propose

        def faulty(context, k):
            if context[0] == 66:
                raise RuntimeError("planted drafter fault")
            return propose(context, k)

        drafter.propose = faulty
        return drafter


def test_a_drafter_fault_fails_its_request_only(target):
    engine = Engine(target, drafter="prompt-lookup", draft_length=2, adaptive_draft_length=False)
    engine.scheduler.make_drafter = Faulty(engine.scheduler.make_drafter)
    prompts = [PROMPTS[0], [66] + PROMPTS[1], PROMPTS[2]]
    results = collect(engine, prompts, max_new_tokens=30)
    assert results[1][1].finish_reason == "error" and "planted drafter fault" in results[1][1].error
    for i in (0, 2):
        assert results[i][0] == solo(target, prompts[i], 30)
    assert engine.metrics()["request_failures"] == 1 and not engine.has_work


def test_a_drafter_failing_to_start_fails_its_request_only(target):
    engine = Engine(target, drafter="prompt-lookup")
    make = engine.scheduler.make_drafter

    def failing_start():
        drafter = make()
        start = drafter.start

        def faulty(prompt_ids, sampling):
            if prompt_ids[0] == 66:
                raise RuntimeError("planted start fault")
            start(prompt_ids, sampling)

        drafter.start = faulty
        return drafter

    engine.scheduler.make_drafter = failing_start
    prompts = [PROMPTS[0], [66] + PROMPTS[1]]
    results = collect(engine, prompts, max_new_tokens=10)
    assert results[1][1].finish_reason == "error" and "RuntimeError: planted start fault" in results[1][1].error
    assert results[0][0] == solo(target, prompts[0], 10) and not engine.has_work
    many = engine.generate_many(prompts, max_new_tokens=10)  # the batch call reports the failure, keeps the rest
    assert many[1].error and "planted start fault" in many[1].error and many[1].stats.stop_reason == "error"
    assert many[0].token_ids == results[0][0] and many[0].error is None


def test_non_finite_logits_fail_their_request_only(target):
    engine = Engine(target)
    forward = engine.executor.forward
    prompts = [PROMPTS[0], [66] + PROMPTS[1], PROMPTS[2]]

    def poisoned(ids, positions, layout, keep, **kw):
        """The faulty request's rows come out NaN (as an overflow in its own rows would)."""
        logits, hidden = forward(ids, positions, layout, keep, **kw)
        faulty = [r.kv for r in engine.scheduler.running if r.prompt_ids[0] == 66]
        rows = [s for s in layout.segments if any(s.kv is kv for kv in faulty)]
        bad = [i for i, row in enumerate(keep.tolist()) if any(s.first_row <= row < s.first_row + s.n for s in rows)]
        if bad:
            logits = logits.clone()
            logits[bad] = float("nan")
        return logits, hidden

    engine.executor.forward = poisoned
    results = collect(engine, prompts, max_new_tokens=20)
    assert results[1][1].finish_reason == "error" and "non-finite" in results[1][1].error
    for i in (0, 2):
        assert results[i][0] == solo(target, prompts[i], 20)


def test_a_row_is_non_finite_only_where_a_value_is_whatever_its_sum():
    """engine.executor's check: NaN and infinities fail their row; finite values whose sum overflows do not."""
    from leapdecode.engine.executor import _finite_rows

    logits = torch.zeros(5, 8)
    logits[1, 3] = float("nan")
    logits[2, 0] = float("inf")
    logits[3, :2] = torch.tensor([float("inf"), float("-inf")])
    logits[4, :] = 3e38  # every value finite, the sum is not
    assert _finite_rows(logits) == [True, False, False, False, True]
    assert _finite_rows(logits[[0, 4]]) == [True, True] and _finite_rows(logits[:0]) == []


def test_a_failing_forward_ends_its_step_and_the_engine_goes_on(target):
    engine = Engine(target)
    forward, calls = engine.executor.forward, []

    def broken_once(*args, **kw):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("planted forward fault")
        return forward(*args, **kw)

    engine.executor.forward = broken_once
    first = collect(engine, PROMPTS[:2], max_new_tokens=10)
    assert [final.finish_reason for _, final in first] == ["error", "error"]
    assert engine.metrics()["step_failures"] == 1 and engine.metrics()["kv_bytes"] == 0
    ((tokens, final),) = collect(engine, [PROMPTS[3]], max_new_tokens=10)
    assert tokens == solo(target, PROMPTS[3], 10)
