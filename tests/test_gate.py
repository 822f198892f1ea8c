"""The speculation gate: the engine drafts at a load level only where drafted steps have delivered more tokens per
second than plain ones, and keeps exploring the arm that is behind."""

from __future__ import annotations

import dataclasses
import time

import pytest
from tiny_hf import make_tiny_hf_dir

from leapdecode import generate
from leapdecode.engine import Engine
from leapdecode.engine.gate import (
    EXPLORE_EVERY,
    EXPLORE_STEPS,
    MAX_EXPLORE_EVERY,
    MIN_SAMPLES,
    RATE_DECAY,
    ArmSums,
    SpeculationGate,
)


def feed(gate, decoding, on_rate, off_rate, steps):
    """Drive the gate: each step asks, then reports the rate the chosen arm delivers; return the choices."""
    choices = []
    for _ in range(steps):
        on = gate.choose(decoding)
        choices.append(on)
        gate.record(decoding, on, int(on_rate if on else off_rate), 1.0)
    return choices


def exploration_steps(first, steps):
    """Where the rule's bursts start when the same arm keeps its lead: EXPLORE_EVERY steps after `first`, then after
    waits (counted from the end of the previous burst) that double up to MAX_EXPLORE_EVERY."""
    at, every, positions = first - 1, EXPLORE_EVERY, []
    while at + every < steps:
        at += every
        positions.append(at)
        at += EXPLORE_STEPS - 1
        every = min(2 * every, MAX_EXPLORE_EVERY)
    return positions


def burst_steps(first, steps):
    return [i for start in exploration_steps(first, steps) for i in range(start, start + EXPLORE_STEPS) if i < steps]


def test_the_gate_follows_the_arm_that_delivers_and_keeps_exploring():
    gate = SpeculationGate()
    steps = 4 * MAX_EXPLORE_EVERY
    choices = feed(gate, 8, on_rate=50, off_rate=80, steps=steps)
    explored = burst_steps(2 * MIN_SAMPLES, steps)
    assert sum(choices) == MIN_SAMPLES + len(explored)  # off, bar the first samples and exploration
    assert len(explored) < steps / EXPLORE_EVERY  # a fixed wait would explore steps / EXPLORE_EVERY bursts
    assert gate.leaders()[SpeculationGate.level(8)] == 0
    assert sum(feed(gate, 1, on_rate=90, off_rate=30, steps=10 * EXPLORE_EVERY)) > 0.8 * 10 * EXPLORE_EVERY
    # the world changes: drafts start paying at 8 as well; exploration finds it within its longest wait
    choices = feed(gate, 8, on_rate=200, off_rate=80, steps=MAX_EXPLORE_EVERY + 4 * EXPLORE_EVERY)
    found = choices.index(True)
    assert found < MAX_EXPLORE_EVERY and sum(choices[found : found + 2 * EXPLORE_EVERY]) > 1.5 * EXPLORE_EVERY
    assert gate.leaders()[SpeculationGate.level(8)] == 1


def test_a_noisy_arm_is_judged_on_its_sums_not_on_one_step():
    """Drafted steps that yield 1 or 5 tokens (3 on average, in the same time) beat plain steps of 2: the gate must
    keep drafting although half its drafted steps deliver less than a plain one."""
    gate, choices = SpeculationGate(), []
    for i in range(20 * EXPLORE_EVERY):
        on = gate.choose(1)
        choices.append(on)
        gate.record(1, on, (1 if i % 2 else 5) if on else 2, 1.0)
    assert sum(choices[4 * EXPLORE_EVERY :]) > 0.9 * 16 * EXPLORE_EVERY


def test_a_drafting_arm_whose_lead_is_within_the_noise_does_not_lead():
    """Drafted steps of 1 or 5 tokens (3 on average) against plain steps of 2.9: drafting is ahead on average, but
    by far less than a standard error, so plain steps run, bar the explorations; against plain steps of 2 the lead
    is beyond the noise and drafting runs."""
    for plain, drafting_leads in ((2.9, False), (2.0, True)):
        gate, choices = SpeculationGate(), []
        for i in range(20 * EXPLORE_EVERY):
            on = gate.choose(1)
            choices.append(on)
            gate.record(1, on, (1 if i % 2 else 5) if on else plain, 1.0)
        assert gate.rate(1, 1) > gate.rate(1, 0) and gate.lead(1) == int(drafting_leads)
        drafted = sum(choices[4 * EXPLORE_EVERY :])
        assert drafted > 0.9 * 16 * EXPLORE_EVERY if drafting_leads else 0 < drafted < 0.3 * 16 * EXPLORE_EVERY


def test_both_arms_are_measured_before_either_is_trusted():
    gate = SpeculationGate()
    choices = [gate.choose(4) for _ in range(1)]
    gate.record(4, choices[0], 10, 1.0)
    assert choices == [1] and gate.choose(4) == 0  # then the plain arm gets its turn


def test_the_gate_rule_step_by_step():
    """The rule exactly: arms alternate (drafting first) until each has MIN_SAMPLES steps; then the arm ahead runs
    (plain steps on a tie), except bursts of EXPLORE_STEPS steps of the other arm after EXPLORE_EVERY steps, then after
    waits that double while the same arm leads (up to MAX_EXPLORE_EVERY) and go back to EXPLORE_EVERY when the lead
    changes; rates are decayed sums of tokens over decayed sums of seconds; a step of no measurable time is not a
    sample."""
    gate = SpeculationGate()
    steps = 3 * MAX_EXPLORE_EVERY
    choices = feed(gate, 5, on_rate=10, off_rate=20, steps=steps)  # plain steps deliver more
    start = 2 * MIN_SAMPLES
    assert choices[:start] == [True, False] * MIN_SAMPLES
    explored = exploration_steps(start, steps)
    assert [i for i in range(start, steps) if choices[i]] == burst_steps(start, steps)
    assert explored[:3] == [start + 15, start + 15 + 3 + 32, start + 15 + 3 + 32 + 3 + 64] and EXPLORE_EVERY == 16
    assert explored[-1] - explored[-2] == MAX_EXPLORE_EVERY + EXPLORE_STEPS - 1
    assert gate.samples == {(3, True): choices.count(True), (3, False): choices.count(False)}
    assert (gate.rate(3, True), gate.rate(3, False)) == (pytest.approx(10.0), pytest.approx(20.0))
    assert gate.leaders() == {3: 0}
    # the lead changes between two explorations: the next one comes EXPLORE_EVERY steps after the one that saw it
    wait = MAX_EXPLORE_EVERY - (steps - 1 - (explored[-1] + EXPLORE_STEPS - 1))
    assert feed(gate, 5, on_rate=10, off_rate=20, steps=wait - 1) == [False] * (wait - 1)
    on, off = gate.arms[(3, True)], gate.arms[(3, False)]
    on.tokens = 3 * off.tokens * on.seconds / off.seconds
    later = feed(gate, 5, on_rate=30, off_rate=20, steps=2 * EXPLORE_EVERY + EXPLORE_STEPS + 1)
    assert later[:EXPLORE_STEPS] == [False] * EXPLORE_STEPS  # the burst that finds drafting ahead runs plain steps
    plain = [i for i, on in enumerate(later) if not on]
    assert plain == list(range(EXPLORE_STEPS)) + list(range(EXPLORE_STEPS + 15, EXPLORE_STEPS + 15 + EXPLORE_STEPS))

    gate = SpeculationGate()
    gate.record(2, True, 10, 1.0)
    gate.record(2, True, 20, 3.0)
    gate.record(2, True, 5, 0.0)  # no time measured: ignored
    assert gate.rate(2, True) == (RATE_DECAY * 10 + 20) / (RATE_DECAY * 1.0 + 3.0) and gate.samples == {(2, True): 2}
    assert gate.leaders() == {2: None}  # the plain arm not measured yet
    gate.record(9, False, 10, 1.0)
    assert gate.leaders() == {2: None, 4: None}  # nor the drafting arm at 8-15 sequences
    gate.record(2, False, 10, 1.0)  # a step of the level fades both arms' sums there
    assert gate.arms[(2, True)].tokens == pytest.approx(RATE_DECAY * (RATE_DECAY * 10 + 20))
    assert gate.arms[(2, True)].seconds == pytest.approx(RATE_DECAY * (RATE_DECAY * 1.0 + 3.0))
    assert gate.arms[(4, False)].tokens == 10  # not another level's
    for _ in range(MIN_SAMPLES):
        gate.record(2, True, 10, 1.0)
        gate.record(2, False, 10, 1.0)
    gate.arms[(2, True)] = dataclasses.replace(gate.arms[(2, False)])
    assert gate.leaders() == {2: 0, 4: None} and gate.choose(2) == 0  # a tie: plain steps keep the lead


def test_an_arm_s_rate_comes_with_its_standard_error():
    """Decayed sums: weights RATE_DECAY^age for the rate, their squares for its variance (delta method)."""
    arm, d = ArmSums(), RATE_DECAY
    arm.add(1, 1.0)
    arm.fade()
    arm.add(5, 1.0)
    rate = (d * 1 + 5) / (d + 1)
    assert arm.rate == pytest.approx(rate)
    assert arm.variance == pytest.approx((d**2 * (1 - rate) ** 2 + (5 - rate) ** 2) / (d + 1) ** 2)
    steady = ArmSums()
    for seconds in (1.0, 2.0, 0.5):
        steady.add(3 * seconds, seconds)
    assert steady.rate == pytest.approx(3) and steady.variance == pytest.approx(0, abs=1e-12)


def test_explorations_stay_frequent_while_the_two_arms_are_within_the_noise():
    """Drafted steps of 1 or 5 tokens (3 on average) against plain steps of 3: whichever leads, the lead is never
    clear, so the wait between explorations never doubles; against plain steps of 1 it does, up to its maximum."""
    close, clear = SpeculationGate(), SpeculationGate()
    for i in range(8 * MAX_EXPLORE_EVERY):
        for gate, plain in ((close, 3), (clear, 1)):
            on = gate.choose(1)
            gate.record(1, on, (1 if i % 2 else 5) if on else plain, 1.0)
            if i > 4 * MAX_EXPLORE_EVERY and gate is close:
                assert gate.every.get(1, EXPLORE_EVERY) == EXPLORE_EVERY
    assert clear.every[1] == MAX_EXPLORE_EVERY and clear.lead(1) == 1


def test_each_load_level_keeps_its_own_exploration_schedule():
    """Steps of two load levels interleaved: each level explores at the positions of its own steps, as if alone."""
    gate, steps = SpeculationGate(), 2 * MAX_EXPLORE_EVERY
    choices = {2: [], 16: []}
    for i in range(2 * steps):
        decoding = 2 if i % 2 else 16
        on = gate.choose(decoding)
        choices[decoding].append(on)
        gate.record(decoding, on, 10 if on else 20, 1.0)
    start = 2 * MIN_SAMPLES
    for level_choices in choices.values():
        assert [i for i in range(start, steps) if level_choices[i]] == burst_steps(start, steps)


class SlowDrafter:
    """Wraps a drafter so that proposing costs far more than the tiny model's whole forward."""

    def __init__(self, make):
        self.make = make

    def __call__(self):
        drafter = self.make()
        propose = drafter.propose

        def slow(context, k):
            time.sleep(0.02)
            return propose(context, k)

        drafter.propose = slow
        return drafter


def test_the_engine_stops_drafting_where_drafts_cost_throughput(tmp_path):
    target = str(make_tiny_hf_dir(tmp_path / "tiny", context=512))
    engine = Engine(target, drafter="prompt-lookup")
    engine.scheduler.make_drafter = SlowDrafter(engine.scheduler.make_drafter)
    prompts = [[5 + i, 6, 7, 8] * 4 for i in range(4)]
    results = engine.generate_many(prompts, max_new_tokens=150)
    assert [r.token_ids for r in results] == [generate(target, p, max_new_tokens=150).token_ids for p in prompts]
    gate = engine.scheduler.gate
    assert all(lead == 0 for lead in gate.leaders().values() if lead is not None)
    drafted = sum(n for (_, on), n in gate.samples.items() if on)
    plain = sum(n for (_, on), n in gate.samples.items() if not on)
    # drafts were tried (the planner's cost model soon prices them out too), then plain steps once they were seen to lose
    assert 0 < drafted < plain / 3


def test_a_new_level_follows_its_measured_neighbour_instead_of_paying_its_own_start_up():
    """Drafts lose at 8-15 sequences (measured): at 16, never seen before, the gate runs plain steps from the first
    one, then explores in bursts as usual and goes by its own samples once it has them."""
    gate = SpeculationGate()
    feed(gate, 8, on_rate=10, off_rate=20, steps=2 * MIN_SAMPLES)
    assert gate.lead(SpeculationGate.level(8)) == 0 and gate.lead(SpeculationGate.level(16)) == 0
    assert gate.lead(SpeculationGate.level(64)) is None  # two levels away: not a neighbour
    choices = feed(gate, 16, on_rate=30, off_rate=20, steps=EXPLORE_EVERY + 3 * EXPLORE_STEPS)
    assert choices[: EXPLORE_EVERY - 1] == [False] * (EXPLORE_EVERY - 1)  # no drafted start-up samples
    later = feed(gate, 16, on_rate=30, off_rate=20, steps=4 * EXPLORE_EVERY)
    assert gate.measured(SpeculationGate.level(16)) and gate.lead(SpeculationGate.level(16)) == 1
    assert sum(later[-EXPLORE_EVERY:]) > 0.7 * EXPLORE_EVERY  # its own samples now: drafts lead there


def test_with_three_arms_the_gate_runs_the_best_and_the_arms_behind_take_turns():
    """Arms 0 (plain), 1 (a drafter's cheaper tier), 2 (its whole way): measured in turn, the drafting arms first;
    then the best runs and the explorations alternate between the two behind, on the two-arm schedule."""
    gate, rates, steps = SpeculationGate(("copies", "head")), {0: 20, 1: 30, 2: 10}, 2 * MAX_EXPLORE_EVERY
    choices = []
    for _ in range(steps):
        arm = gate.choose(4)
        choices.append(arm)
        gate.record(4, arm, rates[arm], 1.0)
    start = 3 * MIN_SAMPLES
    assert choices[:start] == [2, 1, 0] * MIN_SAMPLES
    bursts = exploration_steps(start, steps)
    expected = [1] * steps
    for turn, at in enumerate(bursts):
        for i in range(at, min(at + EXPLORE_STEPS, steps)):
            expected[i] = (0, 2)[turn % 2]
    assert choices[start:] == expected[start:] and len(bursts) > 4
    assert gate.leaders() == {3: 1} and gate.clear(3)


def test_the_gate_reports_each_level_s_rates_and_the_arm_ahead_by_name():
    gate = SpeculationGate(("copies", "head"))
    for _ in range(MIN_SAMPLES):
        for arm, tokens in ((0, 2), (1, 3), (2, 1)):
            gate.record(5, arm, tokens, 1.0)
    gate.record(1, 2, 4, 2.0)
    assert [SpeculationGate.span(level) for level in (1, 2, 3, 5)] == ["1", "2-3", "4-7", "16-31"]
    assert gate.names == ("none", "copies", "head") and gate.report() == {
        "1": {"ahead": None, "rates": {"head": 2.0}},
        "4-7": {"ahead": "copies", "rates": {"none": 2.0, "copies": pytest.approx(3.0), "head": 1.0}},
    }


def test_with_three_arms_a_lead_is_clear_only_over_both_others():
    gate = SpeculationGate(("copies", "head"))
    for i in range(4 * MIN_SAMPLES):  # arm 1 yields 1 or 5 tokens (3 on average), arm 0 always 3, arm 2 always 1
        for arm, tokens in ((0, 3), (1, 1 if i % 2 else 5), (2, 1)):
            gate.record(1, arm, tokens, 1.0)
    assert gate.measured(1) and not gate.clear(1)  # 0 and 1 are within the noise, though both far above 2
    gate.arms[(1, 0)] = ArmSums()
    gate.arms[(1, 0)].add(1, 1.0)
    gate.arms[(1, 0)].add(1, 1.0)
    assert gate.clear(1) and gate.lead(1) == 1


def test_the_head_s_tiers_are_arms_of_the_engine_s_gate_and_every_arm_stays_lossless(tmp_path):
    """A head drafter offers two tiers (copies alone; copies and head steps): the engine's gate has three arms, and
    whichever arm a step runs (drawn at random here), every request gets the tokens of plain greedy alone."""
    import random
    from unittest.mock import patch

    from conftest import tiny_head

    from leapdecode.drafters.head import HeadDrafter
    from leapdecode.models import resolve_model

    target = resolve_model(str(make_tiny_hf_dir(tmp_path / "tiny", context=256)))
    head_dir = tmp_path / "head"
    tiny_head(target.model, trained=False, seed=1)[0].save(head_dir)
    engine = Engine(target, drafter="head", drafter_options={"head": str(head_dir), "confidence": 0.0})
    gate, draw = engine.scheduler.gate, random.Random(0)
    assert gate.n_arms == 3
    arms, tiers = [], []
    gate.choose = lambda n: arms.append(draw.randrange(3)) or arms[-1]
    propose_many = HeadDrafter.propose_many.__func__

    def seen(cls, drafters, contexts, ks):  # the tier each drafting sequence was asked for, with the step's arm
        tiers.extend((arms[-1], d.tier) for d, k in zip(drafters, ks) if k > 0)
        return propose_many(cls, drafters, contexts, ks)

    prompts = [[5 + i, 6, 7, 8] * 3 + [9 + i, 6, 7] for i in range(3)]
    with patch.object(HeadDrafter, "propose_many", classmethod(seen)):
        results = engine.generate_many(prompts, max_new_tokens=40)
    assert [r.token_ids for r in results] == [
        generate(target, p, max_new_tokens=40, drafter="none").token_ids for p in prompts
    ]
    assert {arm for (_, arm) in gate.samples} == {0, 1, 2} and set(arms) == {0, 1, 2}
    assert tiers and all(tier == arm - 1 for arm, tier in tiers)  # arm 1: copies alone; arm 2: the whole way
