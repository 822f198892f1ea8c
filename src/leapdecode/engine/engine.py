"""The batched engine: continuous batching with speculative decoding that stays lossless per sequence.

`step()` is vLLM v1's EngineCore step in three parts: the scheduler plans the step (scheduler.StepPlan: each running
decode brings its last token and its draft, prompts being read bring a chunk), the executor runs it as ONE forward
over a flat batch and takes each sequence's step by the single-request rule (sequence.SequenceState: same drafters,
verification, sampling and stats), and the output processor turns accepted tokens into text, stop decisions and
outputs. Requests join and leave between steps. Greedy output is each request's plain greedy output whatever else
shares the step, and seeded sampling with a model-free drafter draws the same tokens as plain sampling.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import threading
import time
from typing import Callable, Iterator

from ..drafters import Drafter
from ..drafters.factory import drafter_factory
from ..errors import LeapDecodeError, require
from ..forward import rows_alone
from ..host import available_memory
from ..models.resolve import resolve_model
from ..params import REQUEST_OPTIONS, DraftConfig, RequestParams, prediction_ids
from ..prompt import encode_prompt, with_chat_template
from ..stats import GenerationResult
from ..structured import Grammar, grammar_for
from ..text import TextStream
from .executor import Accepted, Executor
from .output import cancelled_output, failed_output, request_output
from .request import Request, RequestOutput
from .scheduler import Scheduler, SchedulerConfig

COUNTERS = (
    "steps",
    "step_failures",
    "request_failures",
    "prompt_tokens",
    "generation_tokens",
    "spec_decode_num_drafts",
    "spec_decode_num_draft_tokens",
    "spec_decode_num_accepted_tokens",
    "step_seconds",  # steps that ran a forward: all of each, and its forward alone (what the rest costs)
    "forward_seconds",
)
SCHEDULER_OPTIONS = tuple(SchedulerConfig.__dataclass_fields__)
log = logging.getLogger("leapdecode.engine")


def kv_bytes_per_token(model) -> int:
    """Bytes of keys and values one token holds in every layer of the model."""
    config = model.config
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    element = next(model.parameters()).element_size()
    return config.num_hidden_layers * 2 * heads * head_dim * element


def default_kv_cache_bytes() -> int:
    """Half the memory the OS could give now (4 GiB where that is unknown)."""
    return (available_memory() or 8 * 2**30) // 2


DRAFT_OPTIONS = tuple(DraftConfig.__dataclass_fields__)


class Engine:
    """Many requests, one forward per step. `model` is what `leapdecode.generate` takes (packaged name, directory,
    GGUF file, or a loaded HF model with `tokenizer=`); `drafter` a drafter name or "auto" (each request gets its own
    drafter and draft-length controller). Scheduler settings (SchedulerConfig: max_batch_tokens, max_sequences,
    prefix_cache_tokens, max_decode_slowdown) and draft-length settings (DraftConfig: draft_length,
    max_draft_length, adaptive_draft_length) come as those objects or as their fields by keyword. `chat_template`:
    chat messages are rendered with this template instead of the tokenizer's own (vLLM's `--chat-template`).
    `add_request`/`cancel` may be called from any thread; `step` from one."""

    def __init__(
        self,
        model,
        *,
        tokenizer=None,
        drafter: str = "none",
        draft_model=None,
        draft_dtype: str = "int8",
        dtype: str = "float32",
        packed_weights: bool = True,
        drafter_options: dict | None = None,
        scheduler: SchedulerConfig | None = None,
        draft: DraftConfig | None = None,
        chat_template: str | None = None,
        **options,
    ):
        unknown = sorted(set(options) - set(SCHEDULER_OPTIONS) - set(DRAFT_OPTIONS))
        require(not unknown, f"Engine has no option {', '.join(unknown)}")
        scheduler = scheduler or SchedulerConfig(**{k: v for k, v in options.items() if k in SCHEDULER_OPTIONS})
        draft = draft or DraftConfig(**{k: v for k, v in options.items() if k in DRAFT_OPTIONS})
        if isinstance(drafter, Drafter):
            raise LeapDecodeError("the Engine makes one drafter per request: pass a drafter name, not an instance")
        self.target = resolve_model(model, tokenizer, dtype)
        if chat_template is not None:  # a tokenizer of its own: the model loaded once per process stays as it is
            templated = with_chat_template(self.target.tokenizer, chat_template)
            self.target = dataclasses.replace(self.target, tokenizer=templated)
        self.model = self.target.model
        make_drafter = drafter_factory(drafter, self.target, draft_model, draft_dtype, **(drafter_options or {}))
        probe = make_drafter()
        self.drafter_name = probe.name
        sequence_options = dict(eos_ids=set(self.target.eos_token_ids), context_length=self.context_length)
        self.kv_token_bytes = kv_bytes_per_token(self.model)
        self.kv_cache_bytes = scheduler.kv_cache_bytes or default_kv_cache_bytes()
        kv_tokens = self.kv_cache_bytes // self.kv_token_bytes
        layers = self.model.config.num_hidden_layers
        self.scheduler = Scheduler(
            scheduler,
            draft,
            make_drafter,
            sequence_options,
            layers,
            kv_tokens,
            whole_prompts=rows_alone(self.model),
            tiers=probe.tiers,
        )
        self.executor = Executor(self.model, packed_weights, self.scheduler.prefix_cache)
        self._seen_rows: set[int] = set()  # row counts stepped at least once (see step)
        self._ids = itertools.count()
        self._lock = threading.Lock()  # guards _cancels and _requests (touched by other threads)
        self._tokenizer_lock = threading.Lock()  # a fast tokenizer is not safe to share between threads
        self._step_lock = threading.Lock()  # held by a step; cancel() frees at once when no step runs
        self._cancels: set[int] = set()
        self._requests: dict[int, Request] = {}
        self.counters = dict.fromkeys(COUNTERS, 0)

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
    def max_sequences(self) -> int:
        return self.scheduler.config.max_sequences

    @property
    def prefix_cache(self):
        return self.scheduler.prefix_cache

    @property
    def has_work(self) -> bool:
        s = self.scheduler
        return bool(s.running or s.waiting or s.incoming or self._cancels)

    # ---- requests in and out -------------------------------------------------------------------------------------

    def add_request(
        self,
        prompt,
        params: RequestParams | None = None,
        *,
        on_output: Callable[[RequestOutput], None] | None = None,
        grammar: Grammar | None = None,
        priority: int = 0,
        **options,
    ) -> int:
        """Queue a request (a string, chat messages or token ids, as `generate` takes) with its RequestParams (or
        their fields by keyword); return its id. Bad input raises LeapDecodeError at once and leaves the engine as it
        was. `grammar`: params.structured_output already compiled for this model (structured.grammar_for; the
        server compiles it off its event loop), else it is compiled here. `priority` (vLLM's): under the scheduler's
        "priority" policy, lower is admitted first and preempted last; under "fcfs" only 0 is taken."""
        require(
            type(priority) is int and (priority == 0 or self.scheduler.config.policy == "priority"),
            f"priority must be an integer, and other than 0 only under the priority scheduling policy; got {priority!r}",
        )
        params = RequestParams.of(params, **options)
        with self._tokenizer_lock:
            prompt_ids = encode_prompt(self.tokenizer, prompt, params.raw)
            params.prepare(self.tokenizer)
            prediction = prediction_ids(self.tokenizer, params.prediction)
            if grammar is None:
                grammar = grammar_for(params.structured_output, self.target)
        require(
            len(prompt_ids) < self.context_length,
            f"the prompt has {len(prompt_ids)} tokens but {self.name} has a context of {self.context_length}",
        )
        text = TextStream(
            self.tokenizer,
            params.stop,
            self._tokenizer_lock,
            params.include_stop_str_in_output,
            params.skip_special_tokens,
        )
        with self._lock:
            request = Request(next(self._ids), prompt_ids, params, text, on_output, grammar, priority, prediction)
            self._requests[request.id] = request
        with self.scheduler.lock:
            self.scheduler.incoming.append(request)
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

    def generate_many(self, prompts, params: RequestParams | None = None, **options) -> list[GenerationResult]:
        """Decode all prompts together; one GenerationResult per prompt, in order. Takes one RequestParams for all,
        or its fields by keyword (max_new_tokens, temperature, top_p, top_k, seed, stop, raw)."""
        unknown = sorted(set(options) - set(REQUEST_OPTIONS))
        require(
            not unknown,
            f"generate_many does not take {', '.join(unknown)} (the model and drafter are the "
            f"Engine's); it takes {', '.join(REQUEST_OPTIONS)}",
        )
        params = RequestParams.of(params, **options)
        finals: dict[int, RequestOutput] = {}
        requests = []
        try:
            for prompt in prompts:
                rid = self.add_request(
                    prompt, params, on_output=lambda o: finals.update({o.request_id: o}) if o.finished else None
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
                token_ids=list(r.seq.out) if r.seq else [],
                prompt_ids=r.prompt_ids,
                stats=finals[r.id].stats,
                model=self.name,
                drafter=self.drafter_name,
                logprobs=list(r.seq.logprobs) if r.seq and r.params.logprobs is not None else None,
                prompt_logprobs=[None, *r.prompt_scores] if r.params.prompt_logprobs is not None else None,
                error=finals[r.id].error,
            )
            for r in requests
        ]

    def warm_up(self) -> float:
        """Serve one short request untimed, so that what a process does once (building and loading the native
        kernels, calibrating them on a new host, encoding the weights) happens before the first user's request
        rather than inside it; the counters start from zero after it. Returns the seconds it took.

        Then time a decode-only step of every stream count the engine may run, to start the forward-cost table
        that prompt chunks are sized by (step_size.prefill_rows weighs them against a decode-only step). A forward's
        cost climbs in stairs, so a count not visited yet, read off a line between visited ones or off the nearest
        one, can be far from its cost, and engines that happened to visit other counts would chunk the same load
        differently (vLLM, likewise, runs its step sizes once before serving: its profile run and graph capture)."""
        start = time.perf_counter()
        self.generate_many(["Say hello."], max_new_tokens=4)
        for rows in range(1, self.max_sequences + 1):
            self.scheduler.forward_costs.record(rows, self.executor.time_decode_step(rows, self.scheduler.layers))
        self.counters.update(dict.fromkeys(self.counters, 0))
        return time.perf_counter() - start

    def metrics(self) -> dict:
        """Counters and sizes; safe to call from another thread while a step runs (a snapshot of the lists). Cheap
        (the server snapshots it after every step): bytes are counted from rows, not summed over every tensor."""
        s = self.scheduler
        slots = [kv for kv in (r.kv for r in list(s.running)) if kv is not None]
        return {
            "running": len(slots),
            "waiting": len(s.waiting) + len(s.incoming),
            "kv_tokens": sum(kv.length for kv in slots),
            "kv_bytes": sum(kv.capacity for kv in slots) * self.kv_token_bytes,
            "kv_budget_bytes": s.kv_tokens * self.kv_token_bytes,
            "kv_peak_bytes": s.peak_kv_tokens * self.kv_token_bytes,
            "num_preemptions": s.preemptions,
            "prefix_cache_tokens": s.prefix_cache.tokens,
            "prefix_cache_bytes": s.prefix_cache.tokens * self.kv_token_bytes,
            "speculation": s.gate.report(),
            **self.counters,
        }

    # ---- one step: schedule -> execute -> update -----------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Admit waiting requests, run one forward over every running sequence's rows, emit what it produced.

        A failure that belongs to one request (its drafter raised, its logits are not finite, its verification or
        text failed) ends that request with finish_reason "error" and the others go on; a failure of the forward
        itself cannot be traced to one request and ends every request of the step (counted in step_failures)."""
        with self._step_lock:
            outputs: list[RequestOutput] = []
            self._apply_cancels(outputs)
            start = time.perf_counter()
            plan = self.scheduler.schedule()
            self.counters["prompt_tokens"] = self.scheduler.admitted_prompt_tokens
            if plan is None:
                return outputs
            for request, error in plan.failed:
                self._fail(request, error, outputs)
            if not plan.ids:
                return outputs
            try:
                results = self.executor.execute(plan)
            except Exception as error:
                self.counters["step_failures"] += 1
                in_step = [r for r in self.scheduler.running if any(s.kv is r.kv for s in plan.segments)]
                log.exception("a step failed; its %d request(s) end with an error", len(in_step))
                for request in in_step:
                    self._fail(request, f"the step failed: {type(error).__name__}: {error}", outputs)
                return outputs
            # the whole step, drafting and verification included: what a draft row really costs at this load; but
            # not the first step of a row count, which also prepares that count's kernels (a one-off)
            seconds = time.perf_counter() - start
            self.scheduler.note_peak()
            if len(plan.ids) in self._seen_rows:
                self.scheduler.costs.record(len(plan.ids), seconds)
                self.scheduler.forward_costs.record(len(plan.ids), self.executor.forward_seconds)
                if plan.decode_only:
                    tokens = sum(len(a.new) for a in results if a.error is None)
                    self.scheduler.gate.record(plan.streams, plan.arm, tokens, seconds)
            self._seen_rows.add(len(plan.ids))
            self.counters["steps"] += 1
            for accepted in results:
                self._update(accepted, outputs)
            self.counters["forward_seconds"] += self.executor.forward_seconds
            self.counters["step_seconds"] += time.perf_counter() - start
            return outputs

    def _update(self, accepted: Accepted, outputs: list[RequestOutput]) -> None:
        if accepted.error is not None:
            self._fail(accepted.request, accepted.error, outputs)
            return
        if accepted.drafted:
            self.scheduler.acceptance.update(accepted.drafted - accepted.rejected, accepted.rejected > 0)
            self.counters["spec_decode_num_drafts"] += 1
            self.counters["spec_decode_num_draft_tokens"] += accepted.drafted
            self.counters["spec_decode_num_accepted_tokens"] += accepted.drafted - accepted.rejected
        try:
            out = request_output(accepted)
        except Exception as error:  # detokenizing or a stop string check failed: this request's alone
            self._fail(accepted.request, f"its output failed: {type(error).__name__}: {error}", outputs)
            return
        self.counters["generation_tokens"] += len(out.new_token_ids)
        self._emit(accepted.request, out, outputs)
        if out.finished:
            self.scheduler.remember(accepted.request)
            self._release(accepted.request)

    def _fail(self, request: Request, error: str, outputs: list[RequestOutput]) -> None:
        log.warning("request %d failed: %s", request.id, error)
        self.counters["request_failures"] += 1
        self._emit(request, failed_output(request, error), outputs)
        self._release(request)

    # ---- bookkeeping ---------------------------------------------------------------------------------------------

    def _apply_cancels(self, outputs: list[RequestOutput]) -> None:
        with self._lock:
            cancels, self._cancels = self._cancels, set()
        self.scheduler.take_incoming()
        for rid in cancels:
            request = self._requests.get(rid)
            if request is not None:
                self._emit(request, cancelled_output(request), outputs)
                self._release(request)

    def _release(self, request: Request) -> None:
        request.kv = None
        self.scheduler.remove(request)
        with self._lock:
            self._requests.pop(request.id, None)

    def _emit(self, request: Request, out: RequestOutput, outputs: list[RequestOutput]) -> None:
        outputs.append(out)
        if request.on_output is not None:
            request.on_output(out)
        else:
            request.outputs.append(out)
