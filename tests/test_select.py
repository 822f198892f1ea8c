"""Drafter 'select': per request it follows the candidate whose drafts the target would have accepted most, and the
choice never changes the output."""

from __future__ import annotations

import pytest
from tiny_hf import make_tiny_hf_dir

from leapdecode import generate
from leapdecode.drafters import Draft, Drafter, SelectDrafter
from leapdecode.models import resolve_model


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory):
    return resolve_model(str(make_tiny_hf_dir(tmp_path_factory.mktemp("select") / "tiny", context=160)))


class Fixed(Drafter):
    """Proposes from a fixed continuation (right) or a constant token (wrong); counts its proposals."""

    def __init__(self, continuation: list[int] | None, prompt_length: int = 0):
        self.continuation, self.prompt_length, self.proposals = continuation, prompt_length, 0

    def propose(self, context, k):
        self.proposals += 1
        if self.continuation is None:
            return Draft([3] * k)
        done = len(context) - self.prompt_length
        return Draft(self.continuation[done : done + k])


def test_select_follows_the_candidate_that_matches_and_stops_asking_the_others(tiny_target):
    prompt = list(range(5, 25))
    reference = generate(tiny_target, prompt, drafter="none", max_new_tokens=40).token_ids
    wrong, right = Fixed(None), Fixed(reference, len(prompt))
    select = SelectDrafter([wrong, right], trial_steps=3)  # the wrong one is listed first: ties would pick it
    result = generate(
        tiny_target,
        prompt,
        drafter=select,
        max_new_tokens=40,
        draft_length=4,
        max_draft_length=4,
        adaptive_draft_length=False,
    )
    assert result.token_ids == reference
    assert select.leader is right and select.matched[1] > select.matched[0]
    assert wrong.proposals == 3 < right.proposals  # asked during the trial only
    assert result.stats.forward_passes < len(reference) / 2  # the right drafts were the ones verified


def test_select_keeps_the_first_candidate_on_ties_and_after_no_trial(tiny_target):
    a, b = Fixed(None), Fixed(None)
    select = SelectDrafter([a, b], trial_steps=0)
    generate(tiny_target, [5, 6, 7], drafter=select, max_new_tokens=8)
    assert select.leader is a and b.proposals == 0


class Recorded(Drafter):
    """Drafts `right` tokens of the reference, then wrong ones; records (position, draft) of every proposal."""

    def __init__(self, reference, right):
        self.reference, self.right, self.proposals = reference, right, []

    def propose(self, context, k):
        p = len(context)
        tokens = (self.reference[p : p + self.right(p)] + [3] * k)[:k]
        self.proposals.append((p, tokens))
        return Draft(tokens)


def test_select_scores_each_draft_by_what_the_target_would_have_accepted_not_by_the_verified_step_alone():
    """A candidate that is not verified is credited with every token of its draft that the target produces at those
    positions, learnt over the following steps: scoring against one step's new tokens alone would cap it at the
    leader's acceptance (here 2 + 1 tokens while it drafts 6 right) and keep the leader."""
    reference = list(range(100, 300))
    prompt = reference[:9]
    two = Recorded(reference, lambda p: 2)
    six = Recorded(reference, lambda p: 6 if p % 2 else 0)  # right from odd positions
    select = SelectDrafter([two, six], trial_steps=6)
    select.start(prompt, None)
    context = list(prompt)
    for _ in range(12):  # the trial, then steps that finish scoring its last drafts
        draft = select.propose(context, 6)
        accepted = _prefix(draft.tokens, reference[len(context) :])
        context = reference[: len(context) + accepted + 1]
        select.observe(context, accepted + 1)
    for i, candidate in enumerate((two, six)):
        trial = candidate.proposals[:6]
        assert select.matched[i] == sum(_prefix(tokens, reference[p:]) for p, tokens in trial)
    assert select.matched[1] > select.matched[0] and select.leader is six


def _prefix(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n
