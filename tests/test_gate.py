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
