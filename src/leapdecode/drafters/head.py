"""Draft-head drafter: a trained head (see leapdecode.heads) drafts from the target's own last feature.

After each verification the decode loop hands over the target's final-norm hidden state at the position that produced
the step's last token; the head rolls it forward one token at a time, proposing its top-1 token each step. The head
scores the tokens it was trained on plus every token of the current prompt and output (names, numbers and code
identifiers a request copies are often rare elsewhere). The head has no attention, so it cannot copy long spans; with
`lookup_ngram` n > 0 (default 2), when the last n or more tokens occurred earlier in the request the draft is what
followed them (prompt lookup) instead. Every token carries an estimate of its acceptance, learnt online per bin of the
head's probability or of the position in a copy (drafters.calibration: the head's own probability is overconfident
away from its training text), so the planner can cut the draft where one more verified row stops paying; the head
stops early once the estimated probability that the whole draft is accepted falls under the caller's `floor` (or
`confidence`, whichever is higher: EAGLE-2's observation that the draft's confidence tracks acceptance). Drafting
costs a few small matrix products per token and no KV cache, so a rejected draft leaves nothing to undo.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from ..errors import require
from ..kernels import install_packed_linear, packed_kernels
from .base import EMPTY, Draft, Drafter
from .calibration import AcceptanceCalibration, score
from .prompt_lookup import PromptLookupDrafter

HEAD_PRIOR = 0.5  # a head token's acceptance before its probability is known


class HeadDrafter(Drafter):
    name = "head"
    needs_hidden = True
    estimates_acceptance = True

    def __init__(self, head, lookup_ngram: int = 2, confidence: float = 0.1):
        require(0 <= lookup_ngram <= 3, f"head lookup_ngram must be in 0..3 (0 = no lookup), got {lookup_ngram}")
        require(0 <= confidence < 1, f"head confidence threshold must be in [0, 1), got {confidence}")
        self.head = head
        self.confidence, self.lookup_ngram = confidence, lookup_ngram
        install_packed_linear(head)
        if getattr(head, "acceptance", None) is None:  # shared by every request the head drafts for
            head.acceptance = AcceptanceCalibration()
        self.calibration: AcceptanceCalibration = head.acceptance
        self.lookup = (
            PromptLookupDrafter(max_ngram=3, min_ngram=lookup_ngram, calibration=self.calibration)
            if lookup_ngram
            else None
        )
        self.feature: torch.Tensor | None = None
        self.start([], None)

    def start(self, prompt_ids, sampling) -> None:
        self.feature = None
        self.greedy = sampling is None or sampling.greedy
        self.proposal: tuple[list[int], list] | None = None  # the head's last proposal, whole: tokens and their bins
        if self.lookup:
            self.lookup.start(prompt_ids, sampling)
        self.known = set(self.head.vocab_list)
        self.extra_ids: list[int] = []  # request tokens outside vocab_ids
        # the output-head rows of the first extra_ids: gathered when a draft needs them (extra_weight)
        self._extra_weight = self.head.out_weight[:0]
        self._add(prompt_ids)

    def observe(self, context: list[int], n_new: int) -> None:
        self._add(context[-n_new:])
        if self.lookup:
            self.lookup.observe(context, n_new)
        score(self.calibration, self.proposal, context[-n_new:])
        self.proposal = None

    def _estimate(self, probability: float) -> tuple[tuple, float]:
        """A head token's calibration key (its probability in twentieths) and its estimated acceptance (its
        probability itself before any evidence)."""
        where = min(int(probability * 20), 19)
        return (self.group, where), self.calibration.rate(self.group, where, probability)

    def _worth_a_step(self, probability: float) -> bool:
        """Whether a draft whose tokens so far are all accepted with `probability` may expect its next head token
        to stay above the floor (else the head's step would be spent on a token nobody verifies)."""
        return probability * self.calibration.mean(self.group, HEAD_PRIOR) >= self.stop_below

    @property
    def group(self) -> tuple:
        """The calibration group of this request's head tokens (greedy and sampled requests learn apart)."""
        return ("head", self.greedy)

    @property
    def tiers(self) -> tuple[str, ...]:
        return ("copies", "head") if self.lookup else ("head",)

    @property
    def stop_below(self) -> float:
        return max(self.confidence, self.floor)

    def see_hidden(self, feature: torch.Tensor | None) -> None:
        self.feature = feature

    def _add(self, tokens: list[int]) -> None:
        new = sorted(set(tokens) - self.known)
        if new:
            self.known.update(new)
            self.extra_ids += new

    @property
    def extra_weight(self) -> torch.Tensor:
        """The output-head rows of extra_ids, gathered only when a draft needs them: most steps under load draft
        nothing, and a step that only observes new tokens should cost nothing (no copy of a growing matrix)."""
        have = len(self._extra_weight)
        if have < len(self.extra_ids):
            self._extra_weight = torch.cat([self._extra_weight, self.head.rows(self.extra_ids[have:])])
        return self._extra_weight

    def propose(self, context: list[int], k: int) -> Draft:
        return self.propose_many([self], [context], [k])[0]

    @classmethod
    @torch.inference_mode()
    def propose_many(cls, drafters: list[HeadDrafter], contexts: list[list[int]], ks: list[int]) -> list[Draft]:
        """Each sequence's draft as `propose` makes it alone, the head's steps of all sequences sharing a head run as
        one batch (its weights read once per step, not once per sequence)."""
        drafts: list[Draft] = [EMPTY] * len(drafters)
        rolling = []
        for i, (drafter, context, k) in enumerate(zip(drafters, contexts, ks)):
            drafter.proposal = None
            if k <= 0 or drafter.feature is None:  # e.g. a KV press prefill that bypassed the final norm
                continue
            copies_only = drafter.tiers[drafter.tier] == "copies"
            if drafter.lookup:  # a copy is drafted as it is: rolling the head through it costs a step per token
                drafter.lookup.floor = drafter.stop_below
                # alone, copies start from one matching token (no head step could do better there)
                drafter.lookup.min_ngram = 1 if copies_only else drafter.lookup_ngram
                drafts[i] = drafter.lookup.propose(context, k)
            if copies_only or drafts[i].tokens:
                continue
            # under load the floor may rule out any step; now and then one is taken anyway, only to be scored
            if drafter._worth_a_step(1.0) or drafter.calibration.explore(drafter.group):
                rolling.append(_Rolling(i, drafter, k, drafter.feature, context[-1]))
        for head in {id(r.drafter.head): r.drafter.head for r in rolling}.values():
            _roll(head, [r for r in rolling if r.drafter.head is head], drafts)
        return drafts

    def _top1(self, feature: torch.Tensor, scores: torch.Tensor) -> tuple[int, float]:
        """The most likely token among those the head scores (`scores`: its logits over the head's vocabulary; the
        request's own extra tokens are scored here), and its probability among them."""
        return top1_many([self], feature[None], scores[None])[0]


def top1_many(drafters: list[HeadDrafter], features: torch.Tensor, scores: torch.Tensor) -> list[tuple[int, float]]:
    """`_top1` of each row: the best of its shared vocabulary's scores and of its request's extra tokens (scored here,
    one small product a row that has them; the vocabulary wins a tie, as it comes first), with its probability
    among them all. The per-row reductions run in NumPy on the tensors' memory: at one stream a head step's cost is
    mostly calls, and a NumPy call costs a fraction of a torch one."""
    rows = scores.float().numpy()
    out: list[tuple[int, float]] = []
    for i, (drafter, feature) in enumerate(zip(drafters, features)):
        row, vocab = rows[i], drafter.head.vocab_list
        best = int(row.argmax())
        top, token = float(row[best]), vocab[best]
        extra = None
        if drafter.extra_ids:
            weight = drafter.extra_weight
            extra = (weight @ feature.to(weight.dtype)).float().numpy()
            at = int(extra.argmax())
            if extra[at] > top:
                top, token = float(extra[at]), drafter.extra_ids[at]
        total = np.exp(row - top).sum(dtype=np.float64)
        if extra is not None:
            total += np.exp(extra - top).sum(dtype=np.float64)
        out.append((token, float(1.0 / total)))
    return out


@dataclass
class _Rolling:
    """One sequence's draft in the making: the feature and the token the head steps next; the tokens proposed so far
    with their bins, the estimates of those above the floor, and the probability that all of them are accepted."""

    index: int
    drafter: HeadDrafter
    k: int
    feature: torch.Tensor
    token: int
    tokens: list[int] = field(default_factory=list)
    keys: list = field(default_factory=list)
    estimates: list[float] = field(default_factory=list)
    probability: float = 1.0


def _roll(head, rolling: list[_Rolling], drafts: list[Draft]) -> None:
    """Step the features of sequences sharing `head` together, one drafted token at a time, each sequence stopping at
    its k or where the estimated probability of its whole draft falls under its floor (that last token is still
    proposed, so that the calibration scores it, but not drafted)."""
    with packed_kernels(True):
        while rolling:
            features, scores = head.draft_step(  # the shared vocabulary's rows read once for all
                torch.stack([r.feature for r in rolling]), torch.tensor([r.token for r in rolling], dtype=torch.long)
            )
            going = []
            best = top1_many([r.drafter for r in rolling], features, scores)
            for row, (r, (token, probability)) in enumerate(zip(rolling, best)):
                r.feature = features[row]
                key, rate = r.drafter._estimate(probability)
                r.token = token
                r.tokens.append(r.token)
                r.keys.append(key)
                r.probability *= rate
                if r.probability < r.drafter.stop_below:
                    continue
                r.estimates.append(rate)
                if len(r.tokens) < r.k and r.drafter._worth_a_step(r.probability):
                    going.append(r)
            for r in rolling:
                r.drafter.proposal = (r.tokens, r.keys)
                drafts[r.index] = Draft(r.tokens[: len(r.estimates)], estimates=tuple(r.estimates))
            rolling = going
