"""The batched engine: continuous batching with speculative decoding that stays lossless per sequence.

Each `step()` runs ONE forward over a flat batch of rows from every running sequence: a decoding sequence brings its
last token plus its draft, a sequence still reading its prompt brings the next chunk of it (SARATHI's chunked
prefill, so streams keep flowing while a long prompt is read), at most `max_batch_tokens` rows in all. Every linear
layer thus runs one GEMM over all rows; attention stays per sequence (kv_slots.FlatBatch). Requests join and leave
between steps. Per sequence, the step rule is the single-request one (leapdecode.sequence.SequenceState: same
drafters, verification, sampling and stats), so greedy output is that sequence's plain greedy output whatever else
shares the step, and seeded sampling with a model-free drafter draws the same tokens as plain sampling.

How much each sequence drafts is planned per step for the whole batch (controller.plan_draft_lengths): the measured
cost of a forward over R rows against each sequence's acceptance, so that under load, where extra rows are no longer
nearly free, drafts shrink (to zero if they stop paying) instead of costing throughput.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from typing import Callable, Iterator

import torch

from ..api import GenerationResult, drafter_factory, encode_prompt, resolve_model
from ..controller import DraftDemand, DraftLengthController, StepCost, plan_draft_lengths
from ..drafters import Drafter
from ..errors import LeapDecodeError, require
from ..kv.prefix_cache import PrefixCache
from ..kv.slots import FlatBatch, Segment, SequenceKV
from ..runner import final_norm_output, model_kernels, prepare_model
from ..sampling import SamplingConfig
from ..sequence import SequenceState
from ..stats import GenerationStats
from .request import FINISH_REASONS, REQUEST_OPTIONS, Acceptance, Request, RequestOutput, stop_strings
from .text import TextStream

MIN_CHUNK = 16  # prompt rows a step takes at least while streams decode


class Engine:
    """Many requests, one forward per step. `model` is what `leapdecode.generate` takes (packaged name, directory,
    GGUF file, or a loaded HF model with `tokenizer=`); `drafter` a drafter name or "auto" (each request gets its own
    drafter and draft-length controller). `add_request`/`cancel` may be called from any thread; `step` from one."""

    def __init__(
        self,
        model,
        *,
        tokenizer=None,
        drafter: str = "none",
        draft_model=None,
        draft_dtype: str = "int8",
        dtype: str = "float32",
        max_batch_tokens: int = 256,
        max_sequences: int = 32,
        prefix_cache_tokens: int = 8192,
        draft_length: int = 4,
        max_draft_length: int = 16,
        adaptive_draft_length: bool = True,
        packed_weights: bool = True,
        drafter_options: dict | None = None,
        max_decode_slowdown: float = 2.0,
    ):
        require(
            isinstance(max_batch_tokens, int) and max_batch_tokens >= 1,
            f"max_batch_tokens must be a positive integer, got {max_batch_tokens}",
        )
        require(
            isinstance(max_sequences, int) and max_sequences >= 1,
            f"max_sequences must be a positive integer, got {max_sequences}",
        )
        require(
            isinstance(prefix_cache_tokens, int) and prefix_cache_tokens >= 0,
            f"prefix_cache_tokens must be >= 0, got {prefix_cache_tokens}",
        )
        if isinstance(drafter, Drafter):
            raise LeapDecodeError("the Engine makes one drafter per request: pass a drafter name, not an instance")
        self.target = resolve_model(model, tokenizer, dtype)
        self.model = self.target.model
        self._make_drafter = drafter_factory(drafter, self.target, draft_model, draft_dtype, **(drafter_options or {}))
        self.drafter_name = self._make_drafter().name
        self._controller = dict(
            k_init=min(draft_length, max_draft_length), k_max=max_draft_length, adaptive=adaptive_draft_length
        )
        DraftLengthController(**self._controller)  # bad lengths fail here
        require(max_decode_slowdown >= 1, f"max_decode_slowdown must be >= 1, got {max_decode_slowdown}")
        self.max_batch_tokens, self.max_sequences = max_batch_tokens, max_sequences
        self.max_decode_slowdown = max_decode_slowdown
        self.packed_weights = packed_weights
        self.decoder = prepare_model(self.model, packed_weights)
        self.costs = StepCost()  # seconds of a step over R rows, shared by every sequence's planning
        self.acceptance = Acceptance()  # what drafts of earlier requests achieved: the prior of new ones
        self.prefix_cache = PrefixCache(prefix_cache_tokens)
        self._ids = itertools.count()
        self._lock = threading.Lock()  # guards _incoming and _cancels (touched by other threads)
        self._tokenizer_lock = threading.Lock()  # a fast tokenizer is not safe to share between threads
        self._step_lock = threading.Lock()  # held by a step; cancel() frees at once when no step runs
        self._incoming: deque[Request] = deque()
        self._cancels: set[int] = set()
        self._waiting: deque[Request] = deque()
        self._running: list[Request] = []
        self._requests: dict[int, Request] = {}
        self.counters = dict.fromkeys(
            (
                "steps",
                "prompt_tokens",
                "generation_tokens",
                "spec_decode_num_drafts",
                "spec_decode_num_draft_tokens",
                "spec_decode_num_accepted_tokens",
            ),
            0,
        )

    @property
    def name(self) -> str:
        return self.target.name

    @property
    def tokenizer(self):
        return self.target.tokenizer

    @property
    def context_length(self) -> int:
        return self.target.context_length

    @property
    def has_work(self) -> bool:
        return bool(self._running or self._waiting or self._incoming or self._cancels)

    # ---- requests in and out -------------------------------------------------------------------------------------

    def add_request(
        self,
        prompt,
        *,
        max_new_tokens: int = 128,
        temperature: float = 0.0,
        top_p: float = 1.0,
        top_k: int = 0,
        seed: int | None = None,
        stop=None,
        raw: bool = False,
        on_output: Callable[[RequestOutput], None] | None = None,
    ) -> int:
        """Queue a request (a string, chat messages or token ids, as `generate` takes); return its id. Bad input
        raises LeapDecodeError at once and leaves the engine as it was."""
        require(
            type(max_new_tokens) is int and max_new_tokens > 0,
            f"max_new_tokens must be a positive integer, got {max_new_tokens!r}",
        )
        require(
            isinstance(temperature, (int, float)) and isinstance(top_p, (int, float)) and type(top_k) is int,
            "temperature and top_p must be numbers, top_k an integer",
        )
        require(seed is None or type(seed) is int, f"seed must be an integer, got {seed!r}")
        sampling = SamplingConfig(temperature=float(temperature), top_k=top_k, top_p=float(top_p), seed=seed)
        stops = stop_strings(stop)
        with self._tokenizer_lock:
            prompt_ids = encode_prompt(self.tokenizer, prompt, raw)
        require(
            len(prompt_ids) < self.context_length,
            f"the prompt has {len(prompt_ids)} tokens but {self.name} has a context of {self.context_length}",
        )
        params = dict(sampling=sampling, max_new_tokens=max_new_tokens)
        with self._lock:
            text = TextStream(self.tokenizer, stops, self._tokenizer_lock)
            request = Request(next(self._ids), prompt_ids, params, text, on_output)
            self._requests[request.id] = request
            self._incoming.append(request)
        return request.id

    def cancel(self, request_id: int) -> None:
        """Stop a request; its KV is freed now if no step is running, else when the running step ends."""
        with self._lock:
            if request_id in self._requests:
                self._cancels.add(request_id)
        if self._step_lock.acquire(blocking=False):
            try:
                self._apply_cancels([])
            finally:
                self._step_lock.release()

    def stream(self, request_id: int) -> Iterator[RequestOutput]:
        """The outputs of one request as they come, stepping the engine (every request in it) as needed."""
        request = self._requests.get(request_id)
        require(request is not None and request.on_output is None, f"no streamable request {request_id}")
        while True:
            while request.outputs:
                out = request.outputs.popleft()
                yield out
                if out.finished:
                    return
            self.step()

    def generate_many(self, prompts, **options) -> list[GenerationResult]:
        """Decode all prompts together; one GenerationResult per prompt, in order. Takes `generate`'s per-request
        arguments (max_new_tokens, temperature, top_p, top_k, seed, stop, raw)."""
        unknown = sorted(set(options) - set(REQUEST_OPTIONS))
        require(
            not unknown,
            f"generate_many does not take {', '.join(unknown)} (the model and drafter are the "
            f"Engine's); it takes {', '.join(REQUEST_OPTIONS)}",
        )
        finals: dict[int, RequestOutput] = {}
        requests = []
        try:
            for prompt in prompts:
                rid = self.add_request(
                    prompt, **options, on_output=lambda o: finals.update({o.request_id: o}) if o.finished else None
                )
                requests.append(self._requests[rid])
        except LeapDecodeError:
            for request in requests:
                self.cancel(request.id)
            raise
        while len(finals) < len(requests):
            self.step()
        return [
            GenerationResult(
                text=r.text.text,
                token_ids=list(r.seq.out),
                prompt_ids=r.prompt_ids,
                stats=finals[r.id].stats,
                model=self.name,
                drafter=self.drafter_name,
            )
            for r in requests
        ]

    def metrics(self) -> dict:
        """Counters and sizes; safe to call from another thread while a step runs (a snapshot of the lists)."""
        slots = [kv for kv in (r.kv for r in list(self._running)) if kv is not None]
        return {
            "running": len(slots),
            "waiting": len(self._waiting) + len(self._incoming),
            "kv_tokens": sum(kv.length for kv in slots),
            "kv_bytes": sum(kv.nbytes for kv in slots),
            "prefix_cache_tokens": self.prefix_cache.tokens,
            "prefix_cache_bytes": self.prefix_cache.nbytes,
            **self.counters,
        }

    # ---- one step ------------------------------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Admit waiting requests, run one forward over every running sequence's rows, emit what it produced."""
        with self._step_lock:
            outputs: list[RequestOutput] = []
            self._apply_cancels(outputs)
            self._admit()
            if not self._running:
                return outputs
            start = time.perf_counter()
            ids, segments, kept = self._plan()
            self._forward(ids, segments, kept, outputs)
            # the whole step, drafting and verification included: what a draft row really costs at this load
            self.costs.record(len(ids), time.perf_counter() - start)
            self.counters["steps"] += 1
            return outputs

    def _admit(self) -> None:
        with self._lock:
            self._waiting.extend(self._incoming)
            self._incoming.clear()
        while self._waiting and len(self._running) < self.max_sequences:
            request = self._waiting.popleft()
            controller = DraftLengthController(costs=self.costs, **self._controller)
            controller.accepted, controller.rejected = self.acceptance.prior()
            request.seq = SequenceState(
                request.prompt_ids,
                self._make_drafter(),
                controller=controller,
                eos_ids=set(self.target.eos_token_ids),
                context_length=self.context_length,
                **request.params,
            )
            request.seq.start = request.arrival  # time to first token counts the wait
            request.kv = SequenceKV(self.model.config.num_hidden_layers)
            cached = self.prefix_cache.lookup(request.prompt_ids)
            if cached is not None:
                request.kv.load(*cached)
            self.counters["prompt_tokens"] += len(request.prompt_ids)
            self._running.append(request)

    def _plan(self) -> tuple[list[int], list[Segment], list[tuple[Request, int]]]:
        """This step's rows: decodes (last token + draft) first, then prompt chunks in the rows left. Returns the
        rows' token ids, the segments, and for each request that gets logits (request, its first kept row)."""
        budget = self.max_batch_tokens
        decoding = [r for r in self._running if r.decoding][:budget]
        if len(decoding) == budget:  # more streams than rows: the ones served now go to the back of the line
            self._running = [r for r in self._running if r not in decoding] + decoding
        # a prompt still being read yields no token until it is read, so it goes before drafts: beside a prompt
        # chunk a draft only makes the step dearer and the waiting request later, a throughput loss under load
        reading = any(not r.decoding for r in self._running)
        draft_lengths = [0] * len(decoding) if reading else self._draft_lengths(decoding, budget)
        ids, segments, kept = [], [], []
        for request, k in zip(decoding, draft_lengths):
            kept.append((request, len(ids)))
            rows = request.seq.propose(k)
            segments.append(Segment(request.kv, len(ids), len(rows), request.kv.length))
            ids += rows
        budget = self._prefill_budget(len(ids), budget) if decoding else budget
        for request in self._running:
            if request.decoding or len(ids) >= budget:
                continue
            done = request.kv.length
            n = min(len(request.prompt_ids) - done, budget - len(ids))
            segments.append(Segment(request.kv, len(ids), n, done))
            ids += request.prompt_ids[done : done + n]
            if done + n == len(request.prompt_ids):
                kept.append((request, len(ids) - 1))
        return ids, segments, kept

    def _prefill_budget(self, decode_rows: int, budget: int) -> int:
        """Rows a step may hold while streams decode: prompt chunks only up to where the measured step cost reaches
        max_decode_slowdown times a decode-only step (SARATHI: prefill rides along without stalling the streams);
        at least MIN_CHUNK prompt rows, so a long prompt always advances."""
        if not self.costs:
            return budget
        limit = self.max_decode_slowdown * self.costs(decode_rows)
        low, high = decode_rows + MIN_CHUNK, budget
        while low < high:  # the largest row count whose cost stays within the limit
            mid = (low + high + 1) // 2
            low, high = (mid, high) if self.costs(mid) <= limit else (low, mid - 1)
        return min(budget, low)

    def _draft_lengths(self, decoding: list[Request], row_budget: int) -> list[int]:
        if not self._controller["adaptive"]:
            return [r.seq.controller.demand(r.seq.room).cap for r in decoding]
        if not self.costs:  # nothing measured yet: a plain step first
            return [0] * len(decoding)
        # drafting time is inside the measured step cost (see step), so it is not charged again per draft token
        demands = [
            DraftDemand(d.acceptance, 0.0, d.cap) for d in (r.seq.controller.demand(r.seq.room) for r in decoding)
        ]
        # costs beyond the largest measured step are guessed flat (optimistic): explore at most twice as far
        explored = max(self.costs.seconds)
        row_budget = min(row_budget, max(2 * explored, len(decoding) + 1))
        return plan_draft_lengths(
            demands, self.costs, base_rows=len(decoding), base_tokens=float(len(decoding)), row_budget=row_budget
        )

    def _forward(self, ids: list[int], segments: list[Segment], kept, outputs: list[RequestOutput]) -> None:
        """One forward over the flat batch; then each request that got logits takes its step."""
        positions = [p for s in segments for p in range(s.past, s.past + s.n)]
        counts = [1 + len(r.seq.draft.tokens) if r.decoding else 1 for r, _ in kept]
        device = self.model.device
        keep = torch.tensor(
            [first + i for (_, first), n in zip(kept, counts) for i in range(n)], dtype=torch.long, device=device
        )
        greedy = all(r.seq.sampling.greedy for r, _ in kept)
        hidden_needed = any(r.seq.drafter.needs_hidden for r, _ in kept)
        ids_t, positions_t = torch.tensor(ids, device=device), torch.tensor(positions, device=device)
        batch = FlatBatch(segments)
        with torch.inference_mode(), model_kernels(self.model, self.packed_weights, greedy, batch):
            if self.decoder is not None:
                logits, hidden = self.decoder(ids_t, positions_t, batch.attend, keep)
            else:
                with final_norm_output(self.model, hidden_needed) as captured:
                    logits = self.model(
                        input_ids=ids_t[None], use_cache=False, position_ids=positions_t[None], logits_to_keep=keep
                    ).logits[0]
                hidden = captured[-1][0, keep] if captured else None
        for s in segments:
            s.kv.length = s.past + s.n
        at = 0
        for (request, _), n in zip(kept, counts):
            if not request.decoding:
                self.prefix_cache.insert(request.prompt_ids, request.kv)
            self._accept(request, logits[at : at + n], None if hidden is None else hidden[at : at + n], outputs)
            at += n

    def _accept(self, request: Request, logits, hidden, outputs: list[RequestOutput]) -> None:
        seq = request.seq
        drafted = len(seq.draft.tokens)
        new, rejected = seq.accept(logits, hidden)
        request.kv.truncate(request.kv.length - rejected)
        if drafted:
            self.acceptance.update(drafted - rejected, rejected > 0)
            self.counters["spec_decode_num_drafts"] += 1
            self.counters["spec_decode_num_draft_tokens"] += drafted
            self.counters["spec_decode_num_accepted_tokens"] += drafted - rejected
        used = request.text.push(new)
        if request.text.stopped:  # a stop string ended the request at this step's token number `used`
            del seq.out[len(seq.out) - len(new) + used :]
            new = new[:used]
            seq.stats.stop_reason = "stop"
        self.counters["generation_tokens"] += len(new)
        finished = seq.finished
        self._emit(
            request,
            RequestOutput(
                request.id,
                new,
                request.text.release(final=finished),
                finished,
                FINISH_REASONS[seq.stats.stop_reason] if finished else None,
                len(request.prompt_ids),
                seq.finish() if finished else None,
            ),
            outputs,
        )
        if finished:
            self._release(request)

    # ---- bookkeeping ---------------------------------------------------------------------------------------------

    def _apply_cancels(self, outputs: list[RequestOutput]) -> None:
        with self._lock:
            cancels, self._cancels = self._cancels, set()
            self._waiting.extend(self._incoming)
            self._incoming.clear()
        for rid in cancels:
            request = self._requests.get(rid)
            if request is None:
                continue
            if request in self._waiting:
                self._waiting.remove(request)
            stats = (
                request.seq.finish("cancelled")
                if request.seq
                else GenerationStats(prompt_tokens=len(request.prompt_ids), stop_reason="cancelled")
            )
            self._emit(request, RequestOutput(rid, [], "", True, "cancelled", len(request.prompt_ids), stats), outputs)
            self._release(request)

    def _release(self, request: Request) -> None:
        request.kv = None
        if request in self._running:
            self._running.remove(request)
        self._requests.pop(request.id, None)

    def _emit(self, request: Request, out: RequestOutput, outputs: list[RequestOutput]) -> None:
        outputs.append(out)
        if request.on_output is not None:
            request.on_output(out)
        else:
            request.outputs.append(out)
