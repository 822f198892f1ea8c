"""The speculation gate: the engine drafts at a load level only where drafted steps have delivered more tokens per
second than plain ones, and keeps exploring the arm that is behind."""

from __future__ import annotations

import time

from tiny_hf import make_tiny_hf_dir

from leapdecode import generate
from leapdecode.engine import Engine
from leapdecode.engine.gate import EXPLORE_EVERY, MIN_SAMPLES, SpeculationGate


def feed(gate, decoding, on_rate, off_rate, steps):
    """Drive the gate: each step asks, then reports the rate the chosen arm delivers; return the share drafted."""
    drafted = 0
    for _ in range(steps):
        on = gate.allow(decoding)
        drafted += on
        gate.record(decoding, on, int(on_rate if on else off_rate), 1.0)
    return drafted / steps


def test_the_gate_follows_the_arm_that_delivers_and_keeps_exploring():
    gate = SpeculationGate()
    share = feed(gate, 8, on_rate=50, off_rate=80, steps=10 * EXPLORE_EVERY)
    assert share < 2 / EXPLORE_EVERY + 2 * MIN_SAMPLES / (10 * EXPLORE_EVERY)  # off, bar exploration
    assert gate.drafting()[SpeculationGate.level(8)] is False
    assert feed(gate, 1, on_rate=90, off_rate=30, steps=10 * EXPLORE_EVERY) > 0.85  # per level: at 1, drafts win
    # the world changes: drafts start paying at 8 as well, and exploration finds it
    assert feed(gate, 8, on_rate=200, off_rate=80, steps=20 * EXPLORE_EVERY) > 0.8


def test_both_arms_are_measured_before_either_is_trusted():
    gate = SpeculationGate()
    choices = [gate.allow(4) for _ in range(1)]
    gate.record(4, choices[0], 10, 1.0)
    assert choices == [True] and gate.allow(4) is False  # then the plain arm gets its turn


def test_the_gate_rule_step_by_step():
    """The rule exactly: arms alternate (drafting first) until each has MIN_SAMPLES steps; then the arm ahead runs
    (drafting on a tie), except every EXPLORE_EVERY-th step of the level, which runs the other; rates are decayed
    averages; a step of no measurable time is not a sample."""
    from leapdecode.engine.gate import RATE_DECAY

    gate = SpeculationGate()
    choices = []
    for _ in range(3 * EXPLORE_EVERY):
        on = gate.allow(5)
        choices.append(on)
        gate.record(5, on, 10 if on else 20, 1.0)  # plain steps deliver more
    start = 2 * MIN_SAMPLES
    assert choices[:start] == [True, False] * MIN_SAMPLES
    assert [i for i in range(start, len(choices)) if choices[i]] == [
        i for i in range(start, len(choices)) if i % EXPLORE_EVERY == EXPLORE_EVERY - 1
    ]
    assert gate.samples == {(3, True): choices.count(True), (3, False): choices.count(False)}
    assert gate.rates == {(3, True): 10.0, (3, False): 20.0} and gate.drafting() == {3: False}

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
