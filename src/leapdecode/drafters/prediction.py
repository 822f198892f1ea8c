"""OpenAI's Predicted Outputs: a request brings text its answer will largely repeat (a file to edit, a document to
revise), and its drafts copy that text.

While the output follows the prediction, the draft is the prediction's next tokens. Where the output leaves it (an
edit), the drafter looks for the output's last few tokens in the prediction, preferring the first place at or after
where it left (an edit moves forward through the text), and copies on from there; until it finds one, the request's
own drafter drafts. Every draft token carries an estimate of its acceptance learnt online (drafters.calibration: per
position in a copy of the prediction, or in the own drafter's draft), so the planner verifies as much as pays. The
target verifies every token: the output is the one the request gives without a prediction, only faster.

`followed` counts the output tokens that continued the prediction (whether or not they were drafted), OpenAI's
`accepted_prediction_tokens`; the rest of the prediction is its `rejected_prediction_tokens`.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

from .base import EMPTY, Draft, Drafter
from .calibration import AcceptanceCalibration, estimated_draft, score

PRIOR = 0.8  # a prediction token's acceptance before any evidence: the caller says the answer repeats the text
MIN_NGRAM, MAX_NGRAM = 2, 6  # output tokens matched to find the place in the prediction again (longest first)
MAX_POSITION = 7  # positions in a copy past it share one bin


class PredictionDrafter(Drafter):
    estimates_acceptance = True

    def __init__(self, prediction: Sequence[int], inner: Drafter):
        self.prediction = list(prediction)
        self.inner = inner
        self.name = inner.name
        self.needs_hidden = inner.needs_hidden
        self.tiers = inner.tiers
        self.calibration = getattr(inner, "calibration", None) or AcceptanceCalibration()
        self.places: dict[tuple[int, ...], list[int]] = {}  # n-gram of the prediction -> where what follows starts
        for n in range(MIN_NGRAM, MAX_NGRAM + 1):
            for end in range(n, len(self.prediction)):
                self.places.setdefault(tuple(self.prediction[end - n : end]), []).append(end)
        self.start([], None)

    # what the caller sets before drafting (the gate's tier, the planner's floor) is the wrapped drafter's too
    tier = property(lambda self: self.inner.tier, lambda self, value: setattr(self.inner, "tier", value))
    floor = property(lambda self: self.inner.floor, lambda self, value: setattr(self.inner, "floor", value))

    def start(self, prompt_ids, sampling) -> None:
        self.inner.start(prompt_ids, sampling)
        self.greedy = sampling is None or sampling.greedy
        self.at: int | None = 0  # where the next output token is expected in the prediction (None: it left it)
        self.left = 0  # where the output last left the prediction
        self.proposal: tuple[list[int], list] | None = None  # the last draft, whole, and its bins

    def see_hidden(self, feature) -> None:
        self.inner.see_hidden(feature)

    def observe(self, context: list[int], n_new: int) -> None:
        score(self.calibration, self.proposal, context[-n_new:])
        self.proposal = None
        self.at, self.left, _ = self._follow(context, len(context) - n_new, self.at, self.left)
        self.inner.observe(context, n_new)

    def followed(self, context: list[int], prompt_length: int) -> int:
        """How many output tokens (context[prompt_length:]) continued the prediction: OpenAI's
        accepted_prediction_tokens, whatever was drafted."""
        return self._follow(context, prompt_length, 0, 0)[2]

    def report(self, stats, context: list[int], prompt_length: int) -> None:
        self.inner.report(stats, context, prompt_length)
        stats.prediction_tokens = len(self.prediction)
        stats.accepted_prediction_tokens = self.followed(context, prompt_length)

    def _follow(self, context: list[int], first: int, at: int | None, left: int) -> tuple[int | None, int, int]:
        """The place in the prediction (at, left) after context[first:], from the place before it; and how many of
        those tokens continued the prediction from where the output stood in it."""
        followed = 0
        for i in range(first, len(context)):
            if at is not None and at < len(self.prediction) and self.prediction[at] == context[i]:
                at, followed = at + 1, followed + 1
            else:
                left = left if at is None else at
                at = self._place(context[max(0, i + 1 - MAX_NGRAM) : i + 1], left)
        return at, left, followed

    def _place(self, tail: list[int], left: int) -> int | None:
        """Where the prediction goes on after the context's last tokens (`tail`): after the longest n-gram of them
        that occurs in it, its first occurrence at or after where the output left the prediction, else its last one."""
        for n in range(min(MAX_NGRAM, len(tail)), MIN_NGRAM - 1, -1):
            ends = self.places.get(tuple(tail[-n:]))
            if ends:
                i = bisect_left(ends, left)
                return ends[i] if i < len(ends) else ends[-1]
        return None

    def _copy(self, k: int) -> Draft:
        """The prediction's next k tokens as a draft (EMPTY where the output is not following it)."""
        if self.at is None or k <= 0 or self.at >= len(self.prediction):
            return EMPTY
        copied = self.prediction[self.at : self.at + k]
        group = ("prediction", self.greedy)
        keys = [(group, min(j, MAX_POSITION)) for j in range(len(copied))]
        draft, self.proposal = estimated_draft(self.calibration, copied, keys, PRIOR, self.floor)
        return draft

    def _own(self, draft: Draft) -> Draft:
        """The own drafter's draft, with estimates of its own where it makes none (per position, learnt like a
        copy's), so the planner weighs every draft of this request alike."""
        if draft.estimates is not None or not draft.tokens:
            return draft
        group = ("prediction-own", self.greedy)
        keys = [(group, min(j, MAX_POSITION)) for j in range(len(draft.tokens))]
        weighed, self.proposal = estimated_draft(self.calibration, draft.tokens, keys, 0.5, self.floor)
        return Draft(
            weighed.tokens, None if draft.probs is None else draft.probs[: len(weighed.tokens)], weighed.estimates
        )

    def propose(self, context: list[int], k: int) -> Draft:
        return self.propose_many([self], [context], [k])[0]

    @classmethod
    def propose_many(cls, drafters: list[PredictionDrafter], contexts: list[list[int]], ks: list[int]) -> list[Draft]:
        """Each request's copy of its prediction; the others' own drafters draft together, a class at a time."""
        drafts = [d._copy(k) for d, k in zip(drafters, ks)]
        rest: dict[type, list[int]] = {}
        for i, (draft, k) in enumerate(zip(drafts, ks)):
            if not draft.tokens and k > 0:
                rest.setdefault(type(drafters[i].inner), []).append(i)
        for inner_class, members in rest.items():
            made = inner_class.propose_many(
                [drafters[i].inner for i in members], [contexts[i] for i in members], [ks[i] for i in members]
            )
            for i, draft in zip(members, made):
                drafts[i] = drafters[i]._own(draft)
        return drafts


def with_prediction(drafter: Drafter, prediction: Sequence[int]) -> Drafter:
    """The request's drafter, drafting from its prediction first where it has one."""
    return PredictionDrafter(prediction, drafter) if prediction else drafter
