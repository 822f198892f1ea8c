"""vLLM's priority scheduling: under the "priority" policy waiting requests are admitted, and running ones preempted
last, in order of (priority, arrival); under "fcfs" (the default) a priority other than 0 is refused. The order never
changes what a request says: every output is still its solo greedy output."""

from __future__ import annotations

import pytest
from live_server import client_of, served
from tiny_hf import make_tiny_hf_dir

from leapdecode import generate
from leapdecode.engine import Engine, SchedulerConfig
from leapdecode.engine.engine import kv_bytes_per_token
from leapdecode.errors import LeapDecodeError
from leapdecode.models import resolve_model

PROMPTS = [[5 + i, 6 + i, 7 + i, 8, 9 + i] * (2 + i % 3) for i in range(8)]


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return resolve_model(str(make_tiny_hf_dir(tmp_path_factory.mktemp("policy") / "tiny", context=256)))


def solo(target, prompt, n):
    return generate(target, prompt, max_new_tokens=n, prefix_cache=False).token_ids


def run(engine, prompts, priorities, n, late=()):
    """Queue the prompts with their priorities, step until done (adding `late` (prompt, priority) pairs after the
    second step); return the request ids in the order they finished and each one's tokens."""
    tokens, finished = {}, []

    def on_output(o):
        tokens.setdefault(o.request_id, []).extend(o.new_token_ids)
        if o.finished:
            finished.append(o.request_id)

    ids = [
        engine.add_request(p, max_new_tokens=n, priority=q, on_output=on_output) for p, q in zip(prompts, priorities)
    ]
    steps = 0
    while engine.has_work:
        engine.step()
        steps += 1
        if steps == 2:
            ids += [engine.add_request(p, max_new_tokens=n, priority=q, on_output=on_output) for p, q in late]
        assert steps < 5000
    return ids, finished, tokens


@pytest.mark.parametrize("policy", ["priority", "fcfs"])
def test_one_at_a_time_requests_finish_in_priority_then_arrival_order(target, policy):
    engine = Engine(target, drafter="prompt-lookup", max_sequences=1, policy=policy)
    priorities = [2, 0, 1, 0, 3] if policy == "priority" else [0] * 5
    late = [(PROMPTS[5], 0)]  # arrives while the first request runs
    ids, finished, tokens = run(engine, PROMPTS[:5], priorities, 12, late)
    ranks = {rid: (q, rid) for rid, q in zip(ids, priorities + [p for _, p in late])}
    # the first admitted request runs to its end before anything else is admitted
    assert finished == [finished[0], *sorted(finished[1:], key=ranks.get)]
    if policy == "priority":
        assert finished[0] == ids[1] and finished[1:3] == [ids[3], ids[5]]  # the late priority 0 beats the 1, 2, 3
    else:
        assert finished == ids
    for rid, prompt in zip(ids, PROMPTS[:6]):
        assert tokens[rid] == solo(target, prompt, 12)


def test_under_kv_pressure_the_lowest_priority_is_preempted_and_loses_nothing(target):
    engine = Engine(
        target,
        drafter="prompt-lookup",
        policy="priority",
        kv_cache_bytes=300 * kv_bytes_per_token(target.model),
        prefix_cache_tokens=64,
    )
    scheduler, victims = engine.scheduler, []
    preempt = scheduler._preempt

    def checked(request):
        assert (request.priority, request.id) == max((r.priority, r.id) for r in scheduler.running)
        victims.append(request)
        preempt(request)

    scheduler._preempt = checked
    # low priorities run first; higher ones arrive after, and are admitted after them while there is room
    ids, _, tokens = run(engine, PROMPTS[:3], [3, 2, 3], 100, late=[(p, i % 2) for i, p in enumerate(PROMPTS[3:])])
    assert len(victims) > 1  # the budget really bit
    for rid, prompt in zip(ids, PROMPTS):
        assert tokens[rid] == solo(target, prompt, 100)
    assert engine.metrics()["kv_peak_bytes"] <= engine.metrics()["kv_budget_bytes"]


@pytest.mark.parametrize("policy", ["priority", "fcfs"])
def test_the_victim_is_the_lowest_priority_not_the_newest(target, policy):
    engine = Engine(target, drafter="none", policy=policy)
    low = [engine.add_request(p, max_new_tokens=50, priority=4 if policy == "priority" else 0) for p in PROMPTS[:2]]
    engine.step()
    high = [engine.add_request(p, max_new_tokens=50) for p in PROMPTS[2:4]]
    engine.step()
    running = engine.scheduler.running
    assert [r.id for r in running] == low + high  # all four run, the low ones admitted first
    assert engine.scheduler.victim().id == (low[-1] if policy == "priority" else high[-1])


def test_fcfs_takes_only_priority_0(target):
    engine = Engine(target, drafter="none")
    with pytest.raises(LeapDecodeError, match="priority"):
        engine.add_request("hello", max_new_tokens=2, priority=1)
    with pytest.raises(LeapDecodeError, match="priority"):
        Engine(target, policy="priority").add_request("hello", max_new_tokens=2, priority=1.5)
    assert not engine.has_work
    engine.add_request("hello", max_new_tokens=2, priority=0)
    with pytest.raises(LeapDecodeError, match="policy"):
        SchedulerConfig(policy="lifo")


def test_priority_over_http(target):
    messages = [{"role": "user", "content": "hello world w1 w2"}]
    with served(target, max_sequences=1, policy="priority") as (url, _):
        client = client_of(url)
        r = client.chat.completions.create(
            model="tiny", messages=messages, max_tokens=8, temperature=0, extra_body={"priority": -5}
        )
        assert r.choices[0].message.content == generate(target, messages, max_new_tokens=8, prefix_cache=False).text
        responses = client.responses.create(
            model="tiny", input="hello", max_output_tokens=4, extra_body={"priority": 2}
        )
        assert responses.status in ("completed", "incomplete")
    with served(target) as (url, _):
        with pytest.raises(Exception) as refused:
            client_of(url).chat.completions.create(
                model="tiny", messages=messages, max_tokens=4, extra_body={"priority": 1}
            )
        assert refused.value.status_code == 400 and refused.value.body["param"] == "priority"
