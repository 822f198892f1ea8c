"""Drafter 'select': per request it follows the candidate whose drafts the target would have accepted most, and the
choice never changes the output."""

from __future__ import annotations

import pytest
from tiny_hf import make_tiny_hf_dir

from leapdecode import generate
from leapdecode.api import resolve_model
from leapdecode.drafters import Draft, Drafter, SelectDrafter


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
    result = generate(tiny_target, prompt, drafter=select, max_new_tokens=40, draft_length=4, max_draft_length=4)
    assert result.token_ids == reference
    assert select.leader is right and select.matched[1] > select.matched[0]
    assert wrong.proposals == 3 < right.proposals  # asked during the trial only
    assert result.stats.forward_passes < len(reference) / 2  # the right drafts were the ones verified


def test_select_keeps_the_first_candidate_on_ties_and_after_no_trial(tiny_target):
    a, b = Fixed(None), Fixed(None)
    select = SelectDrafter([a, b], trial_steps=0)
    generate(tiny_target, [5, 6, 7], drafter=select, max_new_tokens=8)
    assert select.leader is a and b.proposals == 0
