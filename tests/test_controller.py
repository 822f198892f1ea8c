"""The draft-length controller picks k from measured acceptance and cost (synthetic timings, no model)."""

from leapdecode.controller import DraftLengthController


def feed(controller, steps, proposed, accepted, seconds_of):
    for _ in range(steps):
        k = proposed if proposed is not None else controller.next_k()
        controller.update(k, min(accepted, k), k + 1, seconds_of(k + 1), 0.0)


def test_times_a_plain_step_before_choosing():
    c = DraftLengthController(k_init=4)
    c.update(0, 0, 0, 0.0)  # the prefill step: nothing timed
    assert c.next_k() == 4
    c.update(4, 4, 5, 0.05)
    assert c.next_k() == 0  # one plain step, to learn what drafting competes with
    c.update(0, 0, 1, 0.05)
    assert c.next_k() == 16


def test_flat_cost_and_full_acceptance_grow_to_k_max():
    c = DraftLengthController(k_init=4, k_max=16)
    feed(c, 1, 0, 0, lambda n: 0.05)
    feed(c, 20, None, 99, lambda n: 0.05)
    assert c.next_k() == 16


def test_costly_verification_and_rejections_stop_drafting_then_retry():
    c = DraftLengthController(k_init=4, k_max=8)
    seconds = lambda n: 0.05 * n  # noqa: E731 - verification grows linearly: drafts must be accepted to pay
    feed(c, 1, 0, 0, seconds)
    feed(c, 10, 4, 0, seconds)
    assert c.next_k() == 0
    feed(c, 60, 0, 0, seconds)  # no drafting: acceptance decays back to the prior, drafting pays again in theory
    assert c.acceptance > 0.55


def test_draft_cost_shortens_drafts():
    cheap, costly = DraftLengthController(k_max=16), DraftLengthController(k_max=16)
    for c, draft_seconds in ((cheap, 0.0), (costly, 0.02)):
        c.update(0, 0, 1, 0.05)
        for _ in range(30):
            k = max(c.next_k(), 1)
            c.update(k, min(k, 4), k + 1, 0.05 + 0.002 * k, draft_seconds * k)
    assert 0 < costly.next_k() < cheap.next_k()


def test_fixed_draft_length():
    c = DraftLengthController(k_init=3, adaptive=False)
    feed(c, 10, 3, 0, lambda n: 0.05 * n)
    assert c.next_k() == 3


def test_cost_interpolates_between_measured_sizes():
    c = DraftLengthController()
    c.forward_seconds = {1: 1.0, 5: 3.0}
    assert c.cost(3) == 2.0 and c.cost(9) == 3.0 and c.cost(1) == 1.0


def test_plain_decoding_retries_a_draft_after_a_while():
    from leapdecode.controller import REPROBE_STEPS

    c = DraftLengthController(k_init=4, k_max=8)
    c.update(0, 0, 1, 0.05)
    c.update(4, 0, 5, 0.05, 10.0)  # after a plain step: catch-up included, not timed
    c.update(4, 0, 5, 0.05, 10.0)  # very slow, fully rejected drafts: drafting looks hopeless
    ks = []
    for _ in range(REPROBE_STEPS + 1):
        ks.append(c.next_k())
        c.update(0, 0, 1, 0.05)
    assert ks[0] == 0 and 4 in ks  # plain steps first, then one probe with k_init refreshes the estimates


def test_a_draft_after_plain_steps_is_not_timed():
    """Its time includes the draft model's catch-up over the tokens it missed, which says nothing of a draft token."""
    c = DraftLengthController(k_init=4)
    c.update(0, 0, 1, 0.05)
    c.update(4, 4, 5, 0.06, 2.0)  # catch-up of a long plain stretch
    assert c.draft_seconds is None
    c.update(4, 4, 5, 0.06, 0.04)  # a draft that follows a draft: 10 ms per token
    assert c.draft_seconds == 0.01


# ------------------------------------------------------------------ exact rules (mutation testing's survivors)


def test_step_costs_ignore_empty_measurements_and_average_with_decay():
    from leapdecode.controller import COST_DECAY, StepCost

    costs = StepCost()
    costs.record(0, 1.0)  # no rows
    costs.record(2, 0.0)  # no time
    assert not costs and 0 not in costs and 2 not in costs
    costs.record(4, 1.0)
    costs.record(4, 1.4)
    assert costs.seconds == {4: COST_DECAY * 1.0 + (1 - COST_DECAY) * 1.4}


def test_a_slow_step_moves_its_size_s_cost_by_a_clipped_share_and_a_real_rise_still_comes_through():
    """A step's time has one-sided noise: a sample counts for at most COST_SPIKE times the size's estimate, so one
    stall (here ten times a step) cannot double a size's cost and price every draft out; a lasting rise is followed."""
    from leapdecode.controller import COST_DECAY, COST_SPIKE, StepCost

    costs = StepCost()
    costs.record(2, 0.005)
    costs.record(2, 0.050)  # a stall
    assert costs.seconds[2] == COST_DECAY * 0.005 + (1 - COST_DECAY) * COST_SPIKE * 0.005
    assert costs.seconds[2] < 1.2 * 0.005
    costs.record(2, 0.004)  # faster samples are never clipped
    assert (
        costs.seconds[2]
        == COST_DECAY * (COST_DECAY * 0.005 + (1 - COST_DECAY) * COST_SPIKE * 0.005) + (1 - COST_DECAY) * 0.004
    )
    for _ in range(30):  # the machine really got twice as slow: the estimate gets there
        costs.record(2, 0.010)
    assert abs(costs.seconds[2] - 0.010) < 1e-6


def test_a_size_measured_once_in_a_slow_moment_never_looks_dearer_than_larger_sizes():
    """Otherwise the planner avoids that size for good and never measures it again."""
    from leapdecode.controller import StepCost

    costs = StepCost()
    for rows, seconds in ((1, 0.020), (2, 0.097), (4, 0.024), (8, 0.030)):
        costs.record(rows, seconds)
    assert [costs(r) for r in (1, 2, 3, 4, 6, 8, 12)] == [0.020, 0.024, 0.024, 0.024, 0.027, 0.030, 0.030]
    assert costs.seconds[2] == 0.097  # the measurement itself is kept
    costs.record(3, 0.010)  # a new measurement lowers what larger sizes cap
    assert costs(2) == 0.010 and costs(1) == 0.010


def test_the_plan_charges_drafting_time_and_keeps_only_real_gains():
    import pytest

    from leapdecode.controller import DraftDemand, StepCost, plan_draft_lengths

    flat = StepCost()
    for rows in range(1, 20):
        flat.record(rows, 1.0)

    def brute_force(a, cap, per_token):  # expected tokens per second of k = 0..cap, for one sequence
        rates = [sum(a**i for i in range(k + 1)) / (1.0 + k * per_token) for k in range(cap + 1)]
        return rates.index(max(rates))

    assert brute_force(0.9, 4, 0.6) == 2
    assert plan_draft_lengths([DraftDemand(0.9, 0.6, 4)], flat, 1, 1.0) == [2]  # drafting time counts
    assert plan_draft_lengths([DraftDemand(0.0, 0.0, 4)], flat, 1, 1.0) == [0]  # a draft nobody accepts: none
    assert plan_draft_lengths([DraftDemand(0.9, 0.0, 4)], flat, 1, 1.0, k_min=3) == [4]  # k_min skips, not stops
    with pytest.raises(Exception, match="k_min"):
        DraftLengthController(k_min=3, k_init=2)


def test_a_fixed_controller_demands_its_own_k():
    assert DraftLengthController(k_init=3, adaptive=False).demand(10).cap == 3
    assert DraftLengthController(k_init=3).demand(10).cap == 10


def test_acceptance_and_drafting_time_estimates_exactly():
    from leapdecode.controller import COST_DECAY, DECAY

    c = DraftLengthController()
    c.update(4, 2)
    c.update(4, 4)
    assert (c.accepted, c.rejected) == (2 * DECAY + 4, 1 * DECAY + 0)
    assert c.draft_seconds == 0.0  # drafting time not given: none
    c = DraftLengthController()
    for seconds in (0.1, 0.2, 0.4):  # one-token drafts; the first follows no draft, so it is not timed
        c.update(1, 1, draft_seconds=seconds)
    assert abs(c.draft_seconds - (COST_DECAY * 0.2 + (1 - COST_DECAY) * 0.4)) < 1e-12


def test_best_k_respects_k_min():
    c = DraftLengthController(k_min=3, k_init=3)
    c.forward_seconds = {1: 1.0, 2: 1.0, 3: 2.0, 4: 3.0, 5: 4.0}  # one draft row is free, three are not worth it
    assert c.best_k() == 0
    assert DraftLengthController(k_min=1, k_init=3, costs=c.costs).best_k() == 1


def test_plain_steps_are_counted_exactly_and_reset_by_a_draft():
    from leapdecode.controller import REPROBE_STEPS

    c = DraftLengthController(k_init=4)
    c.forward_seconds = {1: 1.0, **{rows: 100.0 for rows in range(2, 18)}}  # drafting never pays
    for step in range(1, REPROBE_STEPS):
        c.update(0, 0, 1, 1.0)
        assert (c.k, c.plain_steps) == (0, step)
    c.update(0, 0, 1, 1.0)
    assert (c.k, c.plain_steps) == (4, 0)  # the REPROBE_STEPS-th plain step in a row: try drafting again
    c.update(0, 0, 1, 1.0)
    assert (c.k, c.plain_steps) == (0, 1)
    c.forward_seconds = dict.fromkeys(range(1, 18), 1.0)  # now rows are free: a draft resets the count
    c.update(0, 0, 1, 1.0)
    assert c.k > 0 and c.plain_steps == 0


def test_a_draft_made_ahead_is_verified_on_a_reprobe_though_its_costs_rule_it_out():
    """Drafters that draft ahead (the head, prompt lookup) let `choose` cut their draft and `floor` stop it early: an
    inflated cost of two rows (one slow first sample, never timed again) ruled every draft out for good. A reprobe
    verifies up to k_init of the draft with no floor, once per REPROBE_STEPS plain steps, then the estimates rule
    again."""
    from leapdecode.controller import REPROBE_STEPS

    c = DraftLengthController(k_init=3)
    c.forward_seconds = {1: 1.0, 2: 3.0}  # two rows look three times dearer than one
    chain = (0.6, 0.3, 0.12, 0.04, 0.01)  # the chance that its first j + 1 tokens are all accepted
    assert c.floor() >= 1.0 and c.choose(chain) == 0  # no draft can pay: nothing would ever re-time two rows
    for _ in range(REPROBE_STEPS - 1):
        c.update(0, 0, 1, 1.0)
        assert c.floor() >= 1.0 and c.choose(chain) == 0
    c.update(0, 0, 1, 1.0)  # the REPROBE_STEPS-th plain step in a row
    assert (c.floor(), c.choose(chain), c.choose(chain[:2])) == (0.0, 3, 2)
    c.update(3, 3, 4, 1.2)  # the reprobe's forward of 4 rows is timed; the estimates rule the next step again
    assert c.floor() > 0.0 and not c.reprobing
    assert c.choose(chain) > 0  # 4 rows timed at 1.2 s: the envelope caps two rows' cost there, drafts pay again


def test_a_fixed_draft_length_never_reprobes():
    c = DraftLengthController(k_init=2, adaptive=False)
    for _ in range(100):
        c.update(0, 0, 1, 1.0)
    assert not c.reprobing and c.choose((0.1, 0.1, 0.1)) == 3
