"""The scheduler: which requests run, and what rows each brings to the next step (a typed StepPlan).

Running decodes come first (each: its last token plus a draft), then chunks of prompts being read (SARATHI's chunked
prefill: streams keep flowing while a long prompt is read), then new requests, all under `max_batch_tokens` rows.
A prompt still being read yields no token until it is read, so while one is read nobody drafts: beside a prompt
chunk a draft only makes the step dearer and the waiting request later. Otherwise draft lengths are planned for the
whole batch (controller.plan_draft_lengths): the measured cost of a step over R rows against each sequence's
acceptance, so that under load, where extra rows are no longer nearly free, drafts shrink, to zero if they stop paying.
A step with neither drafts nor prompt rows serves as many streams as give the most tokens a second
(step_size.streams_served: past a stair in the forward's cost, fewer streams a step, in turns).
"""

from __future__ import annotations

import math
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from ..controller import REPROBE_STEPS, DraftDemand, DraftLengthController, StepCost, plan_draft_lengths, row_floor
from ..drafters import Drafter
from ..drafters.prediction import with_prediction
from ..errors import require
from ..kv.prefix_cache import PrefixCache
from ..kv.slots import Segment, SequenceKV, room_for
from ..params import DraftConfig
from ..sequence import SequenceState, draft_ahead, propose_together
from .gate import SpeculationGate
from .request import Acceptance, Request
from .step_size import MIN_CHUNK, prefill_rows, streams_served

POLICIES = ("fcfs", "priority")


@dataclass(frozen=True)
class SchedulerConfig:
    """`max_batch_tokens`: rows per step; `max_sequences`: requests decoded at once (more wait);
    `prefix_cache_tokens`: prompt-prefix KV kept for reuse; `max_decode_slowdown`: how much dearer than a decode-only
    step a step may get from the prompt chunks riding along (inf, the default: prompt chunks fill the step's row
    budget beside the streams, as vLLM's and OpenVINO GenAI's chunked prefill do, which reads prompts in fewer steps,
    each step's fixed cost shared by more rows: more throughput and sooner first tokens; a finite bound, 2 say, keeps
    every stream's next token within that many decode steps' time, at the price of prompts read in more, smaller
    steps); `kv_cache_bytes`: the most bytes of keys/values the engine holds (running requests' slots and the prefix
    cache together; None: half the memory available when the engine starts); `policy`: "fcfs" (requests are
    admitted in arrival order; the newest admitted is preempted first) or "priority" (vLLM's priority scheduling:
    requests are admitted, and preempted last, in order of their priority, lower first, then arrival)."""

    max_batch_tokens: int = 256
    max_sequences: int = 32
    prefix_cache_tokens: int = 8192
    max_decode_slowdown: float = math.inf
    kv_cache_bytes: int | None = None
    policy: str = "fcfs"

    def __post_init__(self) -> None:
        for name in ("max_batch_tokens", "max_sequences"):
            value = getattr(self, name)
            require(type(value) is int and value >= 1, f"{name} must be a positive integer, got {value!r}")
        require(
            type(self.prefix_cache_tokens) is int and self.prefix_cache_tokens >= 0,
            f"prefix_cache_tokens must be >= 0, got {self.prefix_cache_tokens!r}",
        )
        require(self.max_decode_slowdown >= 1, f"max_decode_slowdown must be >= 1, got {self.max_decode_slowdown}")
        require(
            self.kv_cache_bytes is None or (type(self.kv_cache_bytes) is int and self.kv_cache_bytes > 0),
            f"kv_cache_bytes must be a positive integer, got {self.kv_cache_bytes!r}",
        )
        require(self.policy in POLICIES, f"policy must be one of {', '.join(POLICIES)}, got {self.policy!r}")


@dataclass
class Logits:
    """A request that gets logits from this step: `rows` of them from flat row `first` on (a decode: 1 + its draft;
    the end of a prompt: 1)."""

    request: Request
    first: int
    rows: int
    read_to_end: bool = False  # the last row of what it had to read: its prompt's blocks go to the prefix cache
    scored: int | None = None  # prompt rows scored, not a step (RequestParams.prompt_logprobs): the first's position


@dataclass
class StepPlan:
    """One step: the flat rows (token ids and positions), which sequence each run of rows belongs to, and who gets
    logits back. `greedy`: every request reading logits is greedy (the output head may then be argmax-only)."""

    ids: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)
    logits: list[Logits] = field(default_factory=list)
    failed: list[tuple[Request, str]] = field(default_factory=list)  # requests whose drafter raised: out of the step
    drafted: int = 0  # draft tokens in the step
    arm: int = 0  # the gate's arm, where drafts were made for the step (the planner may have cut them all)
    decode_only: bool = False  # no prompt chunk in the step: its tokens per second measure decoding at this load
    streams: int = 0  # sequences that could decode in this step, served or left for the next: the gate's load

    def add(self, request: Request, tokens: list[int], past: int) -> None:
        self.segments.append(Segment(request.kv, len(self.ids), len(tokens), past))
        self.positions += range(past, past + len(tokens))
        self.ids += tokens

    @property
    def greedy(self) -> bool:
        return all(entry.request.seq.argmax_only and entry.scored is None for entry in self.logits)

    @property
    def hidden(self) -> bool:
        return any(entry.request.seq.drafter.needs_hidden for entry in self.logits)


class Scheduler:
    """Owns the queues: `incoming` (filled from any thread), `waiting` and `running`. `schedule()` admits, then plans.

    KV memory is bounded: the running requests' slots (their capacity, as allocated) and the prefix cache together
    never hold more than `kv_tokens` rows. A step that would cross the bound frees room, cheapest first: least
    recently used prefix-cache blocks, then the step's prompt chunks and drafts, then the newest running request (the
    lowest priority under the priority policy) is preempted (vLLM's recompute preemption: it gives its KV back, waits
    again, and later reads its whole context again, which gives the same tokens as if it had never stopped)."""

    def __init__(
        self,
        config: SchedulerConfig,
        draft: DraftConfig,
        make_drafter: Callable[[], Drafter],
        sequence_options: dict,
        layers: int,
        kv_tokens: int,
        whole_prompts: bool = False,
        tiers: tuple[str, ...] = Drafter.tiers,
    ):
        self.config, self.draft, self.make_drafter = config, draft, make_drafter
        # each prompt read in one chunk and never after a cached prefix, so its rows get the bits of the request's
        # prefill alone (forward.rows_alone: q4 models); at the cost of SARATHI's chunking and of prefix reuse
        self.whole_prompts = whole_prompts
        self.sequence_options, self.layers, self.kv_tokens = sequence_options, layers, kv_tokens
        self.costs = StepCost()  # seconds of a step over R rows, drafting included: what drafts are planned by
        # seconds of the forward alone over R rows: what prompt chunks are sized by. Drafting time is spent only in
        # steps that draft, so in `costs` the row counts drafted steps happen to visit look dearer than a reading
        # step of as many rows is, and chunk sizes would depend on where the engine happened to draft
        self.forward_costs = StepCost()
        self.acceptance = Acceptance()  # what drafts of earlier requests achieved: the prior of new ones
        # whether drafts have paid at this load, and which of the drafters' tiers, measured
        self.gate = SpeculationGate(tiers)
        self.arm = 0  # the gate's arm for this step's drafts
        # steps in a row on which the gate chose drafts and the plan made none: after REPROBE_STEPS the next such step
        # verifies drafts of up to k_init whatever the cost estimates say (as a request alone does, controller.py),
        # since a size's cost timed once in a slow moment is only timed again by a step that visits it
        self.void_drafting = 0
        self.drafted_ahead = False  # this step's drafters that estimate acceptance drafted (draft_ahead)
        self.prefix_cache = PrefixCache(0 if whole_prompts else min(config.prefix_cache_tokens, kv_tokens // 2))
        self.lock = threading.Lock()  # guards `incoming` (touched by other threads)
        self.incoming: deque[Request] = deque()
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.admitted_prompt_tokens = 0
        self.preemptions = 0
        self._failed_admissions: list[tuple[Request, str]] = []
        self.peak_kv_tokens = 0
        self._admissions = 0

    def take_incoming(self) -> None:
        with self.lock:
            if not self.incoming:
                return
            self.waiting.extend(self.incoming)
            self.incoming.clear()
        if self.config.policy == "priority":
            self.waiting = deque(sorted(self.waiting, key=_rank))

    def schedule(self) -> StepPlan | None:
        """Admit waiting requests, then plan the step; None when nothing runs."""
        self._admit()
        plan = self._plan() if self.running else StepPlan()
        plan.failed += self._failed_admissions
        self._failed_admissions = []
        return plan if plan.ids or plan.failed else None

    def remember(self, request: Request) -> None:
        """A request that finished leaves its output's keys/values in the prefix cache beside its prompt's: a chat's
        next turn repeats both (vLLM caches generated blocks too). Rows past the output (accepted drafts beyond a
        stop) are not kept; the last token, never fed, has none."""
        if request.kv is not None and request.seq is not None:
            self.prefix_cache.insert(request.prompt_ids + request.seq.out, request.kv)

    def remove(self, request: Request) -> None:
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)

    @property
    def kv_in_use(self) -> int:
        """Rows of KV held now: the running slots' capacity and the prefix cache."""
        return sum(r.kv.capacity for r in self.running) + self.prefix_cache.tokens

    def note_peak(self) -> None:
        """Take the KV held now (after a step wrote its rows) into the peak."""
        self.peak_kv_tokens = max(self.peak_kv_tokens, self.kv_in_use)

    def _admit(self) -> None:
        self.take_incoming()
        while self.waiting and len(self.running) < self.config.max_sequences:
            request = self.waiting[0]
            first_chunk = len(request.reading) if self.whole_prompts else min(len(request.reading), MIN_CHUNK)
            first_chunk += self.draft.max_draft_length + 1
            if self.running and self.kv_in_use + room_for(first_chunk) > self.kv_tokens:
                break  # it waits for room; alone it always runs (a request too long for the budget fails in _fit)
            self.waiting.popleft()
            if request.seq is None:
                try:  # making its drafter and starting it on the prompt: a failure here is this request's alone
                    request.seq = self._sequence(request)
                except Exception as error:
                    self._failed_admissions.append((request, f"its drafter failed: {type(error).__name__}: {error}"))
                    continue
                self.admitted_prompt_tokens += len(request.prompt_ids)
            request.kv = SequenceKV(self.layers)
            cached = None if request.scoring else self.prefix_cache.lookup(request.reading)
            if cached is not None:
                request.kv.load(*cached)
            self._admissions += 1
            request.admitted = self._admissions
            self.running.append(request)

    def _sequence(self, request: Request) -> SequenceState:
        # its acceptance estimate feeds the batch plan (_draft_lengths); its own step costs stay empty, so it never
        # plans a single-request k the engine would not read
        controller = DraftLengthController(**self.draft.controller_options())
        controller.accepted, controller.rejected = self.acceptance.prior()
        seq = SequenceState(
            request.prompt_ids,
            with_prediction(self.make_drafter(), request.prediction),
            controller=controller,
            sampling=request.params.sampling,
            max_new_tokens=request.params.max_new_tokens,
            grammar=request.grammar,
            **request.params.state_options(),
            **self.sequence_options,
        )
        seq.start = request.arrival  # time to first token counts the wait
        return seq

    def _plan(self) -> StepPlan:
        budget = self.config.max_batch_tokens
        rest = next((len(r.reading) - r.read for r in self.running if not r.decoding), 0)  # the next prompt's
        reading = rest > 0
        streams = budget - min(MIN_CHUNK, budget // 2) if reading else budget  # a prompt being read always advances
        ready = [r for r in self.running if r.decoding]
        decoding = ready[:streams]
        self.arm, self.drafted_ahead = 0, False
        draft_lengths = [0] * len(decoding) if reading else self._draft_lengths(decoding, budget)
        offered = len(decoding)  # the load the gate chose an arm for
        if not reading and not self.drafted_ahead and not any(draft_lengths):
            decoding = decoding[: self._streams_served(len(decoding))]
            draft_lengths = draft_lengths[: len(decoding)]
        if len(decoding) < len(ready):  # streams left out of the step: the ones served now go to the back of the line
            self.running = [r for r in self.running if r not in decoding] + decoding
        chunks, rows, joining = [], len(decoding) + sum(draft_lengths), sum(not r.decoding for r in self.running)
        row_budget = self._prefill_budget(rows, budget, rest, joining) if decoding else budget
        for request in self.running:
            if not request.decoding and rows < row_budget:
                left = len(request.reading) - request.read
                n = left if self.whole_prompts else min(left, row_budget - rows)
                if chunks and rows + n > row_budget:
                    continue  # a whole prompt that does not fit waits; the first one of a step always goes
                chunks.append((request, n))
                rows += n
        decoding, draft_lengths, chunks = self._fit(decoding, draft_lengths, chunks)
        plan = StepPlan()
        if self._kv_after(decoding, draft_lengths, chunks) > self.kv_tokens:  # one request alone is too long
            plan.failed += [
                (r, "it needs more KV memory than the engine's KV budget (kv_cache_bytes)") for r in self.running
            ]
            return plan
        try:  # drafters of one class draft together (a draft head: one batch for all its sequences)
            proposed = propose_together([r.seq for r in decoding], draft_lengths)
        except Exception:  # noqa: BLE001 - someone's drafter failed: each drafts alone, so the fault is found
            proposed = None
        for i, (request, k) in enumerate(zip(decoding, draft_lengths)):
            try:
                tokens = proposed[i] if proposed is not None else request.seq.propose(k)
            except Exception as error:  # a drafter's fault is its request's alone: it leaves, the step goes on
                plan.failed.append((request, f"the drafter failed: {type(error).__name__}: {error}"))
                continue
            plan.logits.append(Logits(request, len(plan.ids), len(tokens)))
            plan.add(request, tokens, request.kv.length)
            plan.drafted += len(tokens) - 1
        plan.decode_only, plan.streams = not chunks, offered
        plan.arm = self.arm if plan.drafted > 0 or self.drafted_ahead else 0
        for request, n in chunks:
            done = request.read
            if request.scoring:  # rows done.. predict prompt tokens done + 1..: those not scored yet
                first, end = max(done, len(request.prompt_scores)), min(done + n, len(request.prompt_ids) - 1)
                if end > first:
                    plan.logits.append(Logits(request, len(plan.ids) + first - done, end - first, scored=first))
            plan.add(request, request.reading[done : done + n], done)
            if done + n == len(request.reading):
                plan.logits.append(Logits(request, len(plan.ids) - 1, 1, read_to_end=True))
        return plan

    def _fit(self, decoding, draft_lengths, chunks):
        """The step's rows, cut down (and requests preempted) until the KV they need fits the bound."""
        while True:
            need = self._kv_after(decoding, draft_lengths, chunks)
            if need <= self.kv_tokens:
                return decoding, draft_lengths, chunks
            over = need - self.kv_tokens
            if self.prefix_cache.tokens:
                self.prefix_cache.evict(over)
            elif len(chunks) > 1 or (chunks and decoding):
                chunks = chunks[:-1]  # the newest prompt waits: streams go on
            elif any(draft_lengths):
                draft_lengths = [0] * len(draft_lengths)
            elif len(self.running) > 1:
                victim = self.victim()
                self._preempt(victim)
                decoding = [r for r in decoding if r is not victim]
                draft_lengths = draft_lengths[: len(decoding)]
                chunks = [(r, n) for r, n in chunks if r is not victim]
            else:
                return decoding, draft_lengths, chunks  # alone and still too long: _plan fails it

    def _kv_after(self, decoding, draft_lengths, chunks) -> int:
        """KV rows held once the step has run: the slots grown by their rows, and the prefix cache with the blocks of
        prompts read to their end in this step (at most; blocks it already holds are not copied again)."""
        rows = {id(r): 1 + k for r, k in zip(decoding, draft_lengths)} | {id(r): n for r, n in chunks}
        slots = sum(r.kv.capacity_for(r.kv.length + rows.get(id(r), 0)) for r in self.running)
        cache = self.prefix_cache
        blocks = sum(len(r.prompt_ids) // cache.block for r, n in chunks if r.read + n == len(r.reading))
        return slots + min(cache.max_tokens, cache.tokens + blocks * cache.block)

    def victim(self) -> Request:
        """The running request a lack of KV preempts: the newest admitted, or under the priority policy the lowest
        priority, last to arrive."""
        return max(self.running, key=_rank if self.config.policy == "priority" else lambda r: r.admitted)

    def _preempt(self, request: Request) -> None:
        """Give its KV back; it waits at the front of the queue (under the priority policy, at its rank's place) and
        will read its context again."""
        self.running.remove(request)
        request.kv = None
        request.seq.drop_draft()
        request.reading = list(request.seq.context)
        self.preemptions += 1
        if self.config.policy == "priority":  # before the first waiting request that ranks after it
            at = next((i for i, r in enumerate(self.waiting) if _rank(r) > _rank(request)), len(self.waiting))
            self.waiting.insert(at, request)
        else:
            self.waiting.appendleft(request)

    def _prefill_budget(self, decode_rows: int, budget: int, rest: int = 0, joining: int = 0) -> int:
        return prefill_rows(self.forward_costs, decode_rows, budget, rest, self.config.max_decode_slowdown, joining)

    def _streams_served(self, decoding: int) -> int:
        return streams_served(self.costs, decoding)

    def _draft_lengths(self, decoding: list[Request], row_budget: int) -> list[int]:
        if not self.draft.adaptive_draft_length:  # each its fixed k, while the step's rows stay within the budget
            left, lengths = row_budget - len(decoding), []
            for r in decoding:
                lengths.append(min(r.seq.controller.demand(r.seq.room).cap, left))
                left -= lengths[-1]
            return lengths
        self.arm = self.gate.choose(len(decoding)) if self.costs else 0
        if not self.arm:  # nothing measured yet, or drafts have not paid here
            return [0] * len(decoding)
        for r in decoding:
            r.seq.drafter.tier = self.arm - 1
        # drafting time is inside the measured step cost (see Engine.step), so it is not charged again per draft token
        demands = [r.seq.controller.demand(r.seq.room) for r in decoding]
        demands = [
            DraftDemand(d.acceptance, 0.0, d.cap if r.seq.drafter.drafts else 0) for d, r in zip(demands, decoding)
        ]
        ahead = [i for i, r in enumerate(decoding) if r.seq.drafter.estimates_acceptance]
        reprobe = self.void_drafting >= REPROBE_STEPS
        if ahead:  # these draft now, and the plan cuts their drafts by each token's estimated acceptance
            try:
                chains = draft_ahead(
                    [decoding[i].seq for i in ahead],
                    [demands[i].cap for i in ahead],
                    0.0 if reprobe else row_floor(self.costs, len(decoding)),
                )
            except Exception:  # noqa: BLE001 - _plan lets each draft alone, so the fault is found and kept to its request
                chains = []
            for i, chain in zip(ahead, chains):
                demands[i].chain = chain
            self.drafted_ahead = bool(chains)
        # costs beyond the largest measured step are guessed flat (optimistic): explore at most twice as far
        explored = max(self.costs.seconds)
        row_budget = min(row_budget, max(2 * explored, len(decoding) + 1))
        # where no draft is made ahead, no drafts means a plain step that may serve fewer streams (_plan): drafts
        # must beat that step's rate, not only that of all streams served plain
        served = len(decoding) if self.drafted_ahead else self._streams_served(len(decoding))
        lengths = plan_draft_lengths(
            demands,
            self.costs,
            base_rows=len(decoding),
            base_tokens=float(len(decoding)),
            row_budget=row_budget,
            plain_rate=served / self.costs(served),
        )
        if reprobe:
            self.void_drafting, left = 0, row_budget - len(decoding)
            for i, (d, r) in enumerate(zip(demands, decoding)):
                lengths[i] = max(0, min(r.seq.controller.k_init, d.most, left))
                left -= lengths[i]
        else:
            self.void_drafting = 0 if any(lengths) else self.void_drafting + 1
        return lengths


def _rank(request: Request) -> tuple[int, int]:
    """Its place under the priority policy: priority (lower first), then arrival."""
    return request.priority, request.id
