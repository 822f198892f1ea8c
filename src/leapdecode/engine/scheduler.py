"""The scheduler: which requests run, and what rows each brings to the next step (a typed StepPlan).

Running decodes come first (each: its last token plus a draft), then chunks of prompts being read (SARATHI's chunked
prefill: streams keep flowing while a long prompt is read), then new requests, all under `max_batch_tokens` rows.
A prompt still being read yields no token until it is read, so while one is read nobody drafts: beside a prompt
chunk a draft only makes the step dearer and the waiting request later. Otherwise draft lengths are planned for the
whole batch (controller.plan_draft_lengths): the measured cost of a step over R rows against each sequence's
acceptance, so that under load, where extra rows are no longer nearly free, drafts shrink, to zero if they stop paying.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from ..controller import DraftDemand, DraftLengthController, StepCost, plan_draft_lengths
from ..drafters import Drafter
from ..errors import require
from ..kv.prefix_cache import PrefixCache
from ..kv.slots import Segment, SequenceKV
from ..params import DraftConfig
from ..sequence import SequenceState
from .request import Acceptance, Request

MIN_CHUNK = 16  # prompt rows a step takes at least while streams decode


@dataclass(frozen=True)
class SchedulerConfig:
    """`max_batch_tokens`: rows per step; `max_sequences`: requests decoded at once (more wait);
    `prefix_cache_tokens`: prompt-prefix KV kept for reuse; `max_decode_slowdown`: how much dearer than a decode-only
    step a step may get from the prompt chunks riding along."""

    max_batch_tokens: int = 256
    max_sequences: int = 32
    prefix_cache_tokens: int = 8192
    max_decode_slowdown: float = 2.0

    def __post_init__(self) -> None:
        for name in ("max_batch_tokens", "max_sequences"):
            value = getattr(self, name)
            require(type(value) is int and value >= 1, f"{name} must be a positive integer, got {value!r}")
        require(
            type(self.prefix_cache_tokens) is int and self.prefix_cache_tokens >= 0,
            f"prefix_cache_tokens must be >= 0, got {self.prefix_cache_tokens!r}",
        )
        require(self.max_decode_slowdown >= 1, f"max_decode_slowdown must be >= 1, got {self.max_decode_slowdown}")


@dataclass
class Logits:
    """A request that gets logits from this step: `rows` of them from flat row `first` on (a decode: 1 + its draft;
    the end of a prompt: 1)."""

    request: Request
    first: int
    rows: int


@dataclass
class StepPlan:
    """One step: the flat rows (token ids and positions), which sequence each run of rows belongs to, and who gets
    logits back. `greedy`: every request reading logits is greedy (the output head may then be argmax-only)."""

    ids: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)
    logits: list[Logits] = field(default_factory=list)

    def add(self, request: Request, tokens: list[int], past: int) -> None:
        self.segments.append(Segment(request.kv, len(self.ids), len(tokens), past))
        self.positions += range(past, past + len(tokens))
        self.ids += tokens

    @property
    def greedy(self) -> bool:
        return all(entry.request.seq.argmax_only for entry in self.logits)

    @property
    def hidden(self) -> bool:
        return any(entry.request.seq.drafter.needs_hidden for entry in self.logits)


class Scheduler:
    """Owns the queues: `incoming` (filled from any thread), `waiting` and `running`. `schedule()` admits, then plans."""

    def __init__(
        self,
        config: SchedulerConfig,
        draft: DraftConfig,
        make_drafter: Callable[[], Drafter],
        sequence_options: dict,
        layers: int,
    ):
        self.config, self.draft, self.make_drafter = config, draft, make_drafter
        self.sequence_options, self.layers = sequence_options, layers
        self.costs = StepCost()  # seconds of a step over R rows, shared by every sequence's planning
        self.acceptance = Acceptance()  # what drafts of earlier requests achieved: the prior of new ones
        self.prefix_cache = PrefixCache(config.prefix_cache_tokens)
        self.lock = threading.Lock()  # guards `incoming` (touched by other threads)
        self.incoming: deque[Request] = deque()
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.admitted_prompt_tokens = 0

    def take_incoming(self) -> None:
        with self.lock:
            self.waiting.extend(self.incoming)
            self.incoming.clear()

    def schedule(self) -> StepPlan | None:
        """Admit waiting requests, then plan the step; None when nothing runs."""
        self._admit()
        return self._plan() if self.running else None

    def remove(self, request: Request) -> None:
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)

    def _admit(self) -> None:
        self.take_incoming()
        while self.waiting and len(self.running) < self.config.max_sequences:
            request = self.waiting.popleft()
            controller = DraftLengthController(costs=self.costs, **self.draft.controller_options())
            controller.accepted, controller.rejected = self.acceptance.prior()
            request.seq = SequenceState(
                request.prompt_ids,
                self.make_drafter(),
                controller=controller,
                sampling=request.params.sampling,
                max_new_tokens=request.params.max_new_tokens,
                **request.params.stop_options(),
                **self.sequence_options,
            )
            request.seq.start = request.arrival  # time to first token counts the wait
            request.kv = SequenceKV(self.layers)
            cached = self.prefix_cache.lookup(request.prompt_ids)
            if cached is not None:
                request.kv.load(*cached)
            self.running.append(request)
            self.admitted_prompt_tokens += len(request.prompt_ids)

    def _plan(self) -> StepPlan:
        budget = self.config.max_batch_tokens
        decoding = [r for r in self.running if r.decoding][:budget]
        if len(decoding) == budget:  # more streams than rows: the ones served now go to the back of the line
            self.running = [r for r in self.running if r not in decoding] + decoding
        reading = any(not r.decoding for r in self.running)
        draft_lengths = [0] * len(decoding) if reading else self._draft_lengths(decoding, budget)
        plan = StepPlan()
        for request, k in zip(decoding, draft_lengths):
            rows = request.seq.propose(k)
            plan.logits.append(Logits(request, len(plan.ids), len(rows)))
            plan.add(request, rows, request.kv.length)
        budget = self._prefill_budget(len(plan.ids), budget) if decoding else budget
        for request in self.running:
            if request.decoding or len(plan.ids) >= budget:
                continue
            done = request.read
            n = min(len(request.prompt_ids) - done, budget - len(plan.ids))
            plan.add(request, request.prompt_ids[done : done + n], done)
            if done + n == len(request.prompt_ids):
                plan.logits.append(Logits(request, len(plan.ids) - 1, 1))
        return plan

    def _prefill_budget(self, decode_rows: int, budget: int) -> int:
        """Rows a step may hold while streams decode: prompt chunks only up to where the measured step cost reaches
        max_decode_slowdown times a decode-only step (SARATHI: prefill rides along without stalling the streams);
        at least MIN_CHUNK prompt rows, so a long prompt always advances."""
        if not self.costs:
            return budget
        limit = self.config.max_decode_slowdown * self.costs(decode_rows)
        low, high = decode_rows + MIN_CHUNK, budget
        while low < high:  # the largest row count whose cost stays within the limit
            mid = (low + high + 1) // 2
            low, high = (mid, high) if self.costs(mid) <= limit else (low, mid - 1)
        return min(budget, low)

    def _draft_lengths(self, decoding: list[Request], row_budget: int) -> list[int]:
        if not self.draft.adaptive_draft_length:
            return [r.seq.controller.demand(r.seq.room).cap for r in decoding]
        if not self.costs:  # nothing measured yet: a plain step first
            return [0] * len(decoding)
        # drafting time is inside the measured step cost (see Engine.step), so it is not charged again per draft token
        demands = [
            DraftDemand(d.acceptance, 0.0, d.cap) for d in (r.seq.controller.demand(r.seq.room) for r in decoding)
        ]
        # costs beyond the largest measured step are guessed flat (optimistic): explore at most twice as far
        explored = max(self.costs.seconds)
        row_budget = min(row_budget, max(2 * explored, len(decoding) + 1))
        return plan_draft_lengths(
            demands, self.costs, base_rows=len(decoding), base_tokens=float(len(decoding)), row_budget=row_budget
        )
