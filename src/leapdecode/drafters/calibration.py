"""How likely a drafter's token is to be accepted, learnt online from the target's own answers.

A draft head's top-1 probability ranks its guesses but is not their acceptance rate: it was trained on its own kind of
text and is overconfident on other text, and how often a copied span continues depends on the workload. So a
drafter that estimates acceptance sorts each draft token into a bin (the head's probability, or the position inside a
copy) and keeps, per bin, how often such a token turned out to be the target's next token, given the tokens before it
were. The planner then weighs each token by that measured rate against the measured cost of one more verified row.

Learning costs nothing extra: after every step the drafter compares what it proposed (all of it, including tokens the
planner cut or that fell below the floor) with the tokens the step produced. Position j of a proposal is a sample
whenever the step produced more than j tokens and the proposal's earlier tokens matched them: the step's last token
is the target's own choice, so a proposal is scored one token past what was verified, and a step that drafts nothing
still scores its first token. Greedy and sampled requests keep separate counts (their acceptance differs).

A drafter that skips drafting because a group's mean is under its floor drafts anyway once in EXPLORE_EVERY skips
(`explore`), its token scored and not verified, so that a mean that fell under the floor can rise again.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from .base import Draft

PRIOR_WEIGHT = 2.0  # the prior is worth this many samples of a bin
EXPLORE_EVERY = 32  # skips of a group (its mean under the floor) between two drafts made to score it anyway


class AcceptanceCalibration:
    """Per bin of a group (e.g. the head's greedy drafts): accepted and scored counts, starting from a prior rate (the
    drafter's own claim) worth PRIOR_WEIGHT samples; and the same counts over each whole group."""

    def __init__(self) -> None:
        self.hits: dict[Hashable, float] = {}
        self.seen: dict[Hashable, float] = {}
        self.skipped: dict[Hashable, int] = {}

    def rate(self, group: Hashable, bin: Hashable, prior: float) -> float:
        """P(a token of this bin is accepted | the draft's earlier tokens were)."""
        return self._rate((group, bin), prior)

    def mean(self, group: Hashable, prior: float) -> float:
        """The same over every bin of the group: what the next token of a draft may expect before it is drafted."""
        return self._rate(group, prior)

    def _rate(self, key: Hashable, prior: float) -> float:
        return (self.hits.get(key, 0.0) + prior * PRIOR_WEIGHT) / (self.seen.get(key, 0.0) + PRIOR_WEIGHT)

    def record(self, keys: Sequence[tuple], proposed: Sequence[int], produced: Sequence[int]) -> None:
        """Score a proposal (its tokens and their (group, bin) keys) against the tokens the step produced."""
        for key, guess, truth in zip(keys, proposed, produced):
            hit = guess == truth
            for counted in (key, key[0]):
                self.seen[counted] = self.seen.get(counted, 0.0) + 1
                self.hits[counted] = self.hits.get(counted, 0.0) + hit
            if not hit:
                return

    def explore(self, group: Hashable) -> bool:
        """Called by a drafter each time it skips drafting because `group`'s mean is under its floor: True once in
        EXPLORE_EVERY calls, when it should draft anyway so the group's mean is measured again (else a mean that fell
        under the floor, e.g. on other text, would never be revised)."""
        count = self.skipped.get(group, 0) + 1
        self.skipped[group] = count % EXPLORE_EVERY
        return count == EXPLORE_EVERY


def cumulative(rates: Sequence[float]) -> tuple[float, ...]:
    """P(the first j + 1 tokens are all accepted), for each j, from the per-token conditional rates."""
    out, running = [], 1.0
    for rate in rates:
        running *= rate
        out.append(running)
    return tuple(out)


def score(calibration: AcceptanceCalibration, proposal: tuple[list[int], list] | None, produced: list[int]) -> None:
    """A drafter's observe: score its last proposal (tokens, keys), if it made one, against the step's tokens."""
    if proposal is not None:
        tokens, keys = proposal
        calibration.record(keys, tokens, produced)


def estimated_draft(
    calibration: AcceptanceCalibration, copied: list[int], keys: list[tuple], prior: float, floor: float
) -> tuple[Draft, tuple[list[int], list]]:
    """A copied span as a draft: each token with its bin's estimated acceptance, cut where the probability that all
    of it is accepted falls under `floor`; and the whole span with its keys, to be scored (`score`) after the step."""
    tokens, estimates, running = [], [], 1.0
    for token, (group, where) in zip(copied, keys):
        rate = calibration.rate(group, where, prior)
        running *= rate
        if running < floor:
            break
        tokens.append(token)
        estimates.append(rate)
    return Draft(tokens, estimates=tuple(estimates)), (copied, keys)
