"""Drafts weighed by measured acceptance: the calibration learns per bin from every step's outcome, the head's drafts
carry its estimates and stop under the floor, and the planner cuts a draft made first where a row stops paying."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_head, tiny_model

from leapdecode.controller import DraftDemand, DraftLengthController, StepCost, plan_draft_lengths
from leapdecode.drafters import make_drafter
from leapdecode.drafters.base import Draft, Drafter
from leapdecode.drafters.calibration import EXPLORE_EVERY, PRIOR_WEIGHT, AcceptanceCalibration, cumulative
from leapdecode.sampling import SamplingConfig
from leapdecode.sequence import SequenceState

G = ("head", True)


def test_a_proposal_is_scored_one_token_past_what_was_verified():
    cal = AcceptanceCalibration()
    # proposed 5 6 7; the step produced 5 (accepted) then 9: 6 was wrong, and after a miss nothing is scored
    cal.record([(G, 0), (G, 1), (G, 2)], [5, 6, 7], [5, 9, 7])
    assert (cal.seen[(G, 0)], cal.hits[(G, 0)]) == (1, 1)
    assert (cal.seen[(G, 1)], cal.hits[(G, 1)]) == (1, 0)
    assert (G, 2) not in cal.seen
    assert (cal.seen[G], cal.hits[G]) == (2, 1)
    # a plain step (nothing drafted) still scores the proposal's first token against the target's token
    cal.record([(G, 1)], [4], [4])
    assert cal.rate(G, 1, prior=0.5) == pytest.approx((1 + 0.5 * PRIOR_WEIGHT) / (2 + PRIOR_WEIGHT))
    assert cal.mean(G, prior=0.5) == pytest.approx((2 + 0.5 * PRIOR_WEIGHT) / (3 + PRIOR_WEIGHT))
    assert cal.rate(G, 7, prior=0.3) == pytest.approx(0.3)  # no evidence: the prior
    assert cumulative([0.5, 0.5, 0.8]) == pytest.approx((0.5, 0.25, 0.2))


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", seed=5)


def _rounds(drafter, context, agree: bool, rounds: int = 30) -> list[int]:
    """Propose, then tell the drafter what the step produced: its own tokens (agree) or others."""
    lengths = []
    for _ in range(rounds):
        drafter.see_hidden(torch.randn(drafter.head.config.hidden_size, generator=torch.Generator().manual_seed(1)))
        lengths.append(len(drafter.propose(context, 4).tokens))
        proposed = drafter.proposal[0] if drafter.proposal else [0]  # None: not even one head step could pay
        produced = list(proposed) if agree else [(t + 1) % 90 for t in proposed[:2]]
        drafter.observe(context + produced, len(produced))
    return lengths


@pytest.mark.parametrize("agree", [True, False])
def test_the_head_learns_how_often_its_drafts_are_accepted(target, agree):
    """A head whose tokens are never the target's stops drafting under a floor; one that is always right drafts to
    its cap. Neither was told: both learn it from the steps' outcomes (greedy and sampled counts kept apart)."""
    head, _ = tiny_head(target, trained=False, seed=3)
    drafter = make_drafter("head", head=head, lookup_ngram=0, confidence=0.0)
    drafter.start([3, 4, 5], None)
    drafter.floor = 0.3
    lengths = _rounds(drafter, [3, 4, 5], agree)
    assert lengths[-1] == (4 if agree else 0), lengths
    estimates = drafter.propose([3, 4, 5], 4).estimates or ()
    assert all(e > 0.9 for e in estimates) if agree else estimates == ()
    sampled = make_drafter("head", head=head, lookup_ngram=0, confidence=0.0)
    sampled.start([3, 4, 5], SamplingConfig(temperature=1.0))
    assert all(key[0][1] is True for key in head.acceptance.seen if isinstance(key[0], tuple))
    assert not any(key == ("head", False) for key in head.acceptance.seen), "sampled requests learnt from greedy ones"


def test_the_head_takes_no_step_whose_token_could_not_be_drafted(target):
    """Before each further head step the draft's probability times the head's mean acceptance must reach the floor:
    otherwise the step would only make a token nobody verifies."""
    head, _ = tiny_head(target, trained=False, seed=6)
    cal = head.acceptance = AcceptanceCalibration()
    for where in range(20):  # every bin right half the time, the group's mean low (counts set by hand)
        cal.seen[(G, where)], cal.hits[(G, where)] = 100.0, 50.0
    cal.seen[G], cal.hits[G] = 1000.0, 100.0
    drafter = make_drafter("head", head=head, lookup_ngram=0, confidence=0.0)
    drafter.start([3, 4, 5], None)
    drafter.see_hidden(torch.ones(head.config.hidden_size))
    assert len(drafter.propose([3, 4, 5], 4).tokens) == 4  # floor 0: every step may pay
    drafter.floor = 0.08  # the first step may (1 x 0.1), the second not (0.5 x 0.1)
    assert len(drafter.propose([3, 4, 5], 4).tokens) == 1 and len(drafter.proposal[0]) == 1
    drafter.floor = 0.3  # not even the first (a heavy load): no head step at all
    assert drafter.propose([3, 4, 5], 4).tokens == [] and drafter.proposal is None


def test_a_head_whose_mean_fell_under_the_floor_is_measured_again(target):
    """A head skipped for its low mean takes one scored (not drafted) step in EXPLORE_EVERY, so its mean rises again
    once its tokens are right, and it drafts again."""
    head, _ = tiny_head(target, trained=False, seed=6)
    cal = head.acceptance = AcceptanceCalibration()
    cal.seen[G], cal.hits[G] = 50.0, 0.0  # the head has been wrong for a while
    drafter = make_drafter("head", head=head, lookup_ngram=0, confidence=0.0)
    context = [3, 4, 5]
    drafter.start(context, None)
    drafter.floor = 0.2
    scored, first_draft = [], None
    for step in range(40 * EXPLORE_EVERY):
        drafter.see_hidden(torch.ones(head.config.hidden_size))
        draft = drafter.propose(context, 4)
        if draft.tokens and first_draft is None:
            first_draft = step
        proposed = drafter.proposal[0] if drafter.proposal else None
        if proposed is not None:
            scored.append(step)
        produced = list(proposed[:1]) if proposed else [7]  # the target agrees with the head's first token
        drafter.observe(context + produced, len(produced))
    assert scored[:2] == [EXPLORE_EVERY - 1, 2 * EXPLORE_EVERY - 1]  # one scored step in EXPLORE_EVERY
    assert first_draft is not None and cal.mean(G, 0.5) > 0.2  # ...until the mean passes the floor: drafts again


def test_prompt_lookup_learns_where_copies_go_on():
    """A lookup drafter whose copies are always right learns to draft them whole; one whose copies break after a
    token learns to keep one (under a floor), with no change to which tokens it copies."""
    context = [1, 2, 3, 4, 5, 6, 1, 2]  # the last two tokens occurred before: the copy is 3 4 5 6
    for right, expected in ((4, [3, 4, 5, 6]), (1, [3])):
        drafter = make_drafter("prompt-lookup")
        drafter.start(context, None)
        for _ in range(20):
            copy = drafter.propose(context, 4)
            produced = copy.tokens[:right] + [99] if right < 4 else copy.tokens
            drafter.observe(context + produced, len(produced))
        drafter.floor = 0.3
        assert drafter.propose(context, 4).tokens == expected


def test_a_copy_is_drafted_as_it_is_with_its_estimates(target):
    head, _ = tiny_head(target, trained=False, seed=4)
    drafter = make_drafter("head", head=head, lookup_ngram=2, confidence=0.0)
    context = [7, 8, 9, 10, 11, 7, 8]  # the last two tokens occurred before: the copy is 9 10 11 7
    drafter.start(context, None)
    drafter.see_hidden(torch.zeros(head.config.hidden_size))
    draft = drafter.propose(context, 4)
    assert draft.tokens == [9, 10, 11, 7] and len(draft.estimates) == 4
    drafter.floor = 0.2  # prior 0.5 a token: 0.5, 0.25, then under the floor
    assert drafter.propose(context, 4).tokens == [9, 10]
    assert drafter.lookup.proposal[0] == [9, 10, 11, 7], "the whole copy is scored, not only what was drafted"
    drafter.observe(context + [9, 10, 12], 3)  # 9 and 10 accepted, 11 not: the bins of positions 0-2 are scored
    seen = {where: count for (group, where), count in head.acceptance.seen.items() if group == ("copy", True)}
    assert seen == {(2, 0): 1, (2, 1): 1, (2, 2): 1}


def test_the_planner_cuts_a_draft_made_first_where_a_row_stops_paying():
    costs = StepCost()
    for rows, seconds in {1: 10.0, 2: 12.0, 3: 14.0, 4: 30.0}.items():
        costs.record(rows, seconds)
    chain = cumulative([0.9, 0.7, 0.8])  # 0.9, 0.63, 0.504
    # k = 0: 1/10; 1: 1.9/12; 2: 2.53/14 (best); 3: 3.03/30
    assert plan_draft_lengths([DraftDemand(0.0, 0.0, 3, chain)], costs, 1, 1.0) == [2]
    # chains of two sequences: the draft tokens go where the chains are highest
    two = [DraftDemand(0.0, 0.0, 3, (0.02, 0.01, 0.005)), DraftDemand(0.0, 0.0, 3, (0.95, 0.9, 0.85))]
    flat = StepCost()
    for rows in range(1, 9):
        flat.record(rows, 10.0 + 0.5 * rows)
    assert plan_draft_lengths(two, flat, 2, 2.0) == [0, 3]
    c = DraftLengthController(k_max=8)
    assert c.choose(chain) == 0, "no plain step timed yet: it comes first"
    c.costs = costs
    assert c.choose(chain) == 2 and c.floor() == pytest.approx(0.2)
    c.costs = StepCost()
    c.costs.record(1, 10.0)
    assert c.choose(chain) == 1, "beyond the largest measured forward it explores at most twice as far"
    assert DraftLengthController(k_init=3, adaptive=False).choose(chain) == 3


class _Estimating(Drafter):
    """Drafts 1 2 3 with fixed estimates; records the floor it was given."""

    estimates_acceptance = True

    def propose(self, context, k):
        self.given_floor = self.floor
        return Draft([1, 2, 3][:k], estimates=(0.9, 0.1, 0.9)[:k])


def test_a_request_alone_drafts_first_then_verifies_only_what_pays():
    controller = DraftLengthController(k_init=3, k_max=3)
    for rows, seconds in {1: 10.0, 2: 11.0, 3: 12.0, 4: 13.0}.items():
        controller.costs.record(rows, seconds)
    seq = SequenceState(
        [5, 6],
        _Estimating(),
        sampling=SamplingConfig(),
        controller=controller,
        max_new_tokens=10,
        eos_ids=set(),
        context_length=64,
    )
    rows = seq.propose_alone()
    # 0.9 pays (1.9/11 > 1/10); 0.09 more does not (1.99/12 < 1.9/11)
    assert rows == [6, 1] and seq.draft.tokens == [1] and not seq.ahead
    assert seq.drafter.given_floor == pytest.approx(0.1)
    logits = torch.zeros(2, 8)
    logits[0, 1] = logits[1, 4] = 1.0
    new, rejected = seq.accept(logits)
    assert new == [1, 4] and rejected == 0 and not seq.ahead and seq.draft.tokens == []


def test_the_engine_drafts_first_and_cuts_each_draft_by_its_estimates():
    """In the engine's plan a drafter that estimates acceptance drafts up to its cap under the floor the load sets
    (decodes x the relative cost of one more row); the plan then keeps each draft's tokens while they pay."""
    from types import SimpleNamespace

    from leapdecode.engine.scheduler import Scheduler, SchedulerConfig
    from leapdecode.params import DraftConfig
    from leapdecode.sequence import propose_together

    scheduler = Scheduler(SchedulerConfig(), DraftConfig(), lambda: None, {}, layers=1, kv_tokens=10_000)
    scheduler.gate.choose = lambda n: 1
    for rows, seconds in {2: 10.0, 3: 10.5, 4: 11.0, 5: 11.5, 6: 12.0, 7: 12.5, 8: 13.0}.items():
        scheduler.costs.record(rows, seconds)
    seqs = [
        SequenceState(
            [5, 6],
            _Estimating(),
            sampling=SamplingConfig(),
            controller=DraftLengthController(),
            max_new_tokens=10,
            eos_ids=set(),
            context_length=64,
        )
        for _ in range(2)
    ]
    decoding = [SimpleNamespace(seq=seq) for seq in seqs]
    ks = scheduler._draft_lengths(decoding, 256)
    # chains 0.9, 0.09, 0.081: the two 0.9s pay (2.9/10.5, 3.8/11 > 2/10), a 0.09 no longer does (3.89/11.5)
    assert ks == [1, 1] and scheduler.drafted_ahead
    assert [s.drafter.given_floor for s in seqs] == [pytest.approx(0.1)] * 2
    assert all(s.ahead and s.draft.tokens == [1, 2, 3] for s in seqs)
    assert propose_together(seqs, ks) == [[6, 1], [6, 1]] and not any(s.ahead for s in seqs)
