"""The speculation gate: the engine drafts at a load level only where drafted steps have delivered more tokens per
second than plain ones, and keeps exploring the arm that is behind."""

from __future__ import annotations

import time

from tiny_hf import make_tiny_hf_dir

from leapdecode import generate
from leapdecode.engine import Engine
from leapdecode.engine.gate import EXPLORE_EVERY, MAX_EXPLORE_EVERY, MIN_SAMPLES, SpeculationGate


def feed(gate, decoding, on_rate, off_rate, steps):
    """Drive the gate: each step asks, then reports the rate the chosen arm delivers; return the choices."""
    choices = []
    for _ in range(steps):
        on = gate.allow(decoding)
        choices.append(on)
        gate.record(decoding, on, int(on_rate if on else off_rate), 1.0)
    return choices


def exploration_steps(first, steps):
    """Where the rule explores when the same arm keeps its lead: EXPLORE_EVERY steps after `first`, then after
    waits that double up to MAX_EXPLORE_EVERY."""
    at, every, positions = first - 1, EXPLORE_EVERY, []
    while at + every < steps:
        at += every
        positions.append(at)
        every = min(2 * every, MAX_EXPLORE_EVERY)
    return positions


def test_the_gate_follows_the_arm_that_delivers_and_keeps_exploring():
    gate = SpeculationGate()
    steps = 4 * MAX_EXPLORE_EVERY
    choices = feed(gate, 8, on_rate=50, off_rate=80, steps=steps)
    explorations = len(exploration_steps(2 * MIN_SAMPLES, steps))
    assert sum(choices) == MIN_SAMPLES + explorations  # off, bar the first samples and exploration
    assert explorations < steps / (4 * EXPLORE_EVERY)  # a fixed rate would explore steps / EXPLORE_EVERY times
    assert gate.drafting()[SpeculationGate.level(8)] is False
    assert sum(feed(gate, 1, on_rate=90, off_rate=30, steps=10 * EXPLORE_EVERY)) > 0.85 * 10 * EXPLORE_EVERY
    # the world changes: drafts start paying at 8 as well; exploration finds it within its longest wait
    choices = feed(gate, 8, on_rate=200, off_rate=80, steps=MAX_EXPLORE_EVERY + 4 * EXPLORE_EVERY)
    found = choices.index(True)
    assert found < MAX_EXPLORE_EVERY and all(choices[found : found + 2 * EXPLORE_EVERY])
    assert gate.drafting()[SpeculationGate.level(8)] is True


def test_both_arms_are_measured_before_either_is_trusted():
    gate = SpeculationGate()
    choices = [gate.allow(4) for _ in range(1)]
    gate.record(4, choices[0], 10, 1.0)
    assert choices == [True] and gate.allow(4) is False  # then the plain arm gets its turn


def test_the_gate_rule_step_by_step():
    """The rule exactly: arms alternate (drafting first) until each has MIN_SAMPLES steps; then the arm ahead runs
    (drafting on a tie), except one exploration step of the other arm after EXPLORE_EVERY steps, then after waits
    that double while the same arm leads (up to MAX_EXPLORE_EVERY) and go back to EXPLORE_EVERY when the lead
    changes; rates are decayed averages; a step of no measurable time is not a sample."""
    from leapdecode.engine.gate import RATE_DECAY

    gate = SpeculationGate()
    steps = 3 * MAX_EXPLORE_EVERY
    choices = feed(gate, 5, on_rate=10, off_rate=20, steps=steps)  # plain steps deliver more
    start = 2 * MIN_SAMPLES
    assert choices[:start] == [True, False] * MIN_SAMPLES
    explored = exploration_steps(start, steps)
    assert [i for i in range(start, steps) if choices[i]] == explored
    assert explored[:4] == [start + 15, start + 47, start + 111, start + 239] and EXPLORE_EVERY == 16
    assert explored[-1] - explored[-2] == MAX_EXPLORE_EVERY
    assert gate.samples == {(3, True): choices.count(True), (3, False): choices.count(False)}
    assert gate.rates == {(3, True): 10.0, (3, False): 20.0} and gate.drafting() == {3: False}
    # the lead changes between two explorations: the next one comes EXPLORE_EVERY steps after the one that saw it
    wait = MAX_EXPLORE_EVERY - (steps - 1 - explored[-1])
    assert feed(gate, 5, on_rate=10, off_rate=20, steps=wait - 1) == [False] * (wait - 1)
    gate.rates[(3, True)] = 30.0  # drafts now lead
    later = feed(gate, 5, on_rate=30, off_rate=20, steps=2 * EXPLORE_EVERY + 1)
    assert later[0] is False  # the exploration that finds drafting ahead runs the plain arm
    assert [i for i, on in enumerate(later) if not on] == [0, EXPLORE_EVERY]

    gate = SpeculationGate()
    gate.record(2, True, 10, 1.0)
    gate.record(2, True, 20, 1.0)
    gate.record(2, True, 5, 0.0)  # no time measured: ignored
    assert gate.rates == {(2, True): RATE_DECAY * 10 + (1 - RATE_DECAY) * 20} and gate.samples == {(2, True): 2}
    assert gate.drafting() == {2: None}  # the plain arm not measured yet
    gate.record(9, False, 10, 1.0)
    assert gate.drafting() == {2: None, 4: None}  # nor the drafting arm at 8-15 sequences
    del gate.rates[(4, False)], gate.samples[(4, False)]
    for _ in range(MIN_SAMPLES):
        gate.record(2, True, 10, 1.0)
        gate.record(2, False, 10, 1.0)
    gate.rates[(2, True)] = gate.rates[(2, False)]  # a tie: drafting keeps the lead
    assert gate.drafting() == {2: True} and gate.allow(2) is True


def test_each_load_level_keeps_its_own_exploration_schedule():
    """Steps of two load levels interleaved: each level explores at the positions of its own steps, as if alone."""
    gate, steps = SpeculationGate(), 2 * MAX_EXPLORE_EVERY
    choices = {2: [], 16: []}
    for i in range(2 * steps):
        decoding = 2 if i % 2 else 16
        on = gate.allow(decoding)
        choices[decoding].append(on)
        gate.record(decoding, on, 10 if on else 20, 1.0)
    start = 2 * MIN_SAMPLES
    for level_choices in choices.values():
        assert [i for i in range(start, steps) if level_choices[i]] == exploration_steps(start, steps)


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
    assert all(lead is False for lead in gate.drafting().values() if lead is not None)
    drafted = sum(n for (_, on), n in gate.samples.items() if on)
    plain = sum(n for (_, on), n in gate.samples.items() if not on)
    assert MIN_SAMPLES <= drafted < plain / 3  # drafts were tried, then mostly plain steps once they were seen to lose
