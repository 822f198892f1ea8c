"""The executor: runs a StepPlan through the one forward (leapdecode.forward) and takes each sequence's step.

All rows of the step go through the model as one flat batch (kv.slots.FlatBatch: each sequence's rows attend only to
that sequence's own keys/values). Then each request that got logits takes its step by the single-request rule
(sequence.SequenceState.accept: greedy verification or speculative sampling) and its slot forgets the rejected draft
rows. A prompt read to its end leaves its blocks in the prefix cache.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ..forward import ModelForward
from ..kv.prefix_cache import PrefixCache
from ..kv.slots import FlatBatch, Segment, SequenceKV
from ..sequence import token_logprobs
from ..verify import argmax_rows
from .request import Request
from .scheduler import StepPlan


@dataclass
class Accepted:
    """What one request's step produced: its new tokens, how many draft tokens were verified, how many rejected."""

    request: Request
    new: list[int]
    drafted: int
    rejected: int
    error: str | None = None  # this request's step failed (the others' did not)


class Executor:
    def __init__(self, model: torch.nn.Module, packed_weights: bool, prefix_cache: PrefixCache):
        self.forward = ModelForward(model, packed_weights)
        self.prefix_cache = prefix_cache
        self.device = model.device
        self.forward_seconds = 0.0  # the last step's forward alone, without drafting, verification or sampling

    def execute(self, plan: StepPlan) -> list[Accepted]:
        kept = [entry.first + i for entry in plan.logits for i in range(entry.rows)]
        ids, positions = torch.tensor(plan.ids, device=self.device), torch.tensor(plan.positions, device=self.device)
        keep = torch.tensor(kept, dtype=torch.long, device=self.device)
        start = time.perf_counter()
        logits, hidden = self.forward(
            ids, positions, FlatBatch(plan.segments), keep, argmax_only=plan.greedy, hidden=plan.hidden
        )
        self.forward_seconds = time.perf_counter() - start
        results, at = [], 0
        finite = _finite_rows(logits)
        top = argmax_rows(logits) if plan.greedy else None  # every greedy sequence's rows in one call
        for entry in plan.logits:
            request, rows = entry.request, slice(at, at + entry.rows)
            at += entry.rows
            drafted = len(request.seq.draft.tokens)
            if not all(finite[rows]):
                results.append(Accepted(request, [], drafted, drafted, "the model produced non-finite logits"))
                continue
            if entry.scored is not None:  # prompt rows: their next prompt tokens' logprobs, no step
                following = request.prompt_ids[entry.scored + 1 : entry.scored + 1 + entry.rows]
                request.prompt_scores += token_logprobs(logits[rows], following, request.params.prompt_logprobs)
                continue
            if entry.read_to_end:
                self.prefix_cache.insert(request.prompt_ids, request.kv)
            try:  # verification, sampling and the drafter's observe: a failure here is this request's alone
                new, rejected = request.seq.accept(
                    logits[rows], None if hidden is None else hidden[rows], argmax=None if top is None else top[rows]
                )
            except Exception as error:
                results.append(Accepted(request, [], drafted, drafted, f"{type(error).__name__}: {error}"))
                continue
            request.kv.truncate(request.kv.length - rejected)
            results.append(Accepted(request, new, drafted, rejected))
        return results

    def time_decode_step(self, rows: int, layers: int) -> float:
        """Seconds of one greedy forward shaped as a decode-only step of `rows` streams (one row each, every row's
        logits kept), run on throwaway KV slots with no past: what the engine's warm-up starts its step costs with.
        Steps over long pasts cost more; the counts the engine visits are measured again as it runs."""
        segments = [Segment(SequenceKV(layers), i, 1, 0) for i in range(rows)]
        zeros = torch.zeros(rows, dtype=torch.long, device=self.device)
        keep = torch.arange(rows, device=self.device)
        start = time.perf_counter()
        self.forward(zeros, zeros, FlatBatch(segments), keep, argmax_only=True)
        return time.perf_counter() - start


def _finite_rows(logits: torch.Tensor) -> list[bool]:
    """Whether each row of logits is all finite. A NaN or an infinity makes its row's sum non-finite, so a finite sum
    settles a row in one pass of additions, with no mask of the whole vocabulary; only rows whose sum is not finite
    (a fault, or finite values whose sum overflowed) are checked value by value."""
    finite = torch.isfinite(logits.sum(-1))
    if not bool(finite.all()):
        finite = torch.isfinite(logits).all(dim=-1)
    return finite.tolist()
