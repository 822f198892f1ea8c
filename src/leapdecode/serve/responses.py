"""What one HTTP completion call becomes: its engine requests' outputs collected into one OpenAI response, or
streamed as OpenAI chunks (server-sent events, `data: [DONE]` last), with usage, finish reasons, per-request
speculative stats (the `leapdecode` object) and the latency metrics observed on the way.

Waiting for outputs is bounded: a request whose first token has not come by its queue deadline, or that is still
running at its request deadline, fails with the admission's timeout error (and is cancelled in the engine); an
engine thread that stopped fails every request at once. A stream's headers go out with its first output, so an error
before it (a timeout, an engine failure) is a real HTTP status, not an event inside a 200 stream."""

from __future__ import annotations

import asyncio
import json
import time
import uuid

from fastapi.responses import StreamingResponse

from ..sequence import TokenLogprobs
from .engine_thread import StepFailure
from .protocol import APIError, ChatCompletionRequest, CompletionRequest, parse, usage

POLL_SECONDS = 0.5  # how often a waiting request looks at the engine thread's health and its deadlines


def _finite(logprob: float | None) -> float | None:
    """JSON has no -inf: a token the model rules out gets vLLM's floor (None: the prompt's first token, unscored)."""
    return None if logprob is None else max(logprob, -9999.0)


async def _get(queue: asyncio.Queue, timeout: float):
    """queue.get() within `timeout` seconds (asyncio.TimeoutError after it). It runs once per streamed chunk, so it
    takes what is there without waiting, and waits under a timer rather than in wait_for's task of its own."""
    try:
        return queue.get_nowait()
    except asyncio.QueueEmpty:
        pass
    if not hasattr(asyncio, "timeout"):  # Python 3.10
        return await asyncio.wait_for(queue.get(), timeout)
    async with asyncio.timeout(timeout):
        return await queue.get()


def _reason(finish_reason: str | None) -> str | None:
    return "abort" if finish_reason == "cancelled" else finish_reason


class SSE(StreamingResponse):
    """Server-sent events that run `on_close` however the response ends (finished, failed, or client gone)."""

    def __init__(self, content, on_close, headers: dict | None = None):
        super().__init__(
            content, media_type="text/event-stream", headers={"cache-control": "no-cache", **(headers or {})}
        )
        self._on_close = on_close

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()


class CompletionCall:
    """One completion or chat completion call: its validated `body`, and its answer collected or streamed."""

    def __init__(self, raw: bytes, chat: bool):
        self.chat = chat
        self.body, self.ignored = parse(ChatCompletionRequest if chat else CompletionRequest, raw)

    async def collect(self, run) -> dict:
        return await run.collect()

    def events(self, run):
        return run.events()


class Run:
    """The engine requests of one HTTP call, collected into one response or streamed as chunks."""

    def __init__(self, state, body, chat, jobs, submitted, arrival):
        self.state, self.body, self.chat, self.jobs, self.arrival = state, body, chat, jobs, arrival
        self.queue, self.index = submitted
        self.unfinished = set(self.index)
        self.aborted: set[int] = set()
        self.id = ("chatcmpl-" if chat else "cmpl-") + (body.request_id or uuid.uuid4().hex)
        self.created = int(time.time())
        self.last = [None] * len(jobs)  # time of each choice's previous output with text/tokens
        self.seen = [False] * len(jobs)  # whether each choice had an output (so it left the queue)
        self.tokens = [0] * len(jobs)
        self.stats = [None] * len(jobs)
        self.num_logprobs = body.num_logprobs()  # None: the call asked for no logprobs
        self.logprobs: list[list] = [[] for _ in jobs]  # each choice's TokenLogprobs so far
        self.offsets = [0] * len(jobs)  # completions' text_offset: characters of the choice's tokens so far
        self.failure: APIError | None = None
        self.tools = jobs[0].get("tools") if jobs else None  # serve/tools.ToolChoice: answers read for tool calls
        self.texts = [[] for _ in jobs]  # each choice's text so far, where tool calls hold it back
        self.return_ids = bool(body.return_token_ids)  # vLLM's token ids beside the text
        self.prompt_ids_sent: set[int] = set()
        limits = state.admission.limits
        self.queue_deadline = arrival + limits.queue_timeout if limits.queue_timeout else None
        self.deadline = arrival + limits.request_timeout if limits.request_timeout else None
        self.client_gone = False
        self._iter = None
        self._first = None

    async def start(self) -> None:
        """Wait for the first output (a stream's headers go out with it); APIError if the request failed first."""
        self._iter = self._outputs()
        try:
            self._first = await self._iter.__anext__()
        except StopAsyncIteration:
            self._first = None
        if self.failure is not None:
            raise self.failure

    def cancel_unfinished(self) -> None:
        """Cancel what has not finished (the client went away, or the response ended early); counted as aborts."""
        for rid in list(self.unfinished - self.aborted):
            self.aborted.add(rid)
            self.state.thread.cancel(rid)
            self.state.metrics.finished("abort")

    async def _next(self):
        """The next output, or None after setting `failure` (a deadline passed, or the engine thread stopped)."""
        while True:
            now = time.perf_counter()
            started = all(self.seen)
            deadlines = [d for d in (self.deadline, None if started else self.queue_deadline) if d is not None]
            wait = min([POLL_SECONDS, *(d - now for d in deadlines)])
            if wait > 0:
                try:
                    return await _get(self.queue, wait)
                except asyncio.TimeoutError:
                    pass
            now = time.perf_counter()
            if not self.queue.empty():
                continue
            if self.deadline is not None and now >= self.deadline:
                self.failure = self.state.admission.timeout("request")
            elif not started and self.queue_deadline is not None and now >= self.queue_deadline:
                self.failure = self.state.admission.timeout("queue")
            elif not self.state.thread.alive:
                self.failure = APIError(
                    503, "the engine thread stopped", type="server_error", code="engine_unavailable"
                )
            else:
                continue
            self.cancel_unfinished()
            return None

    async def _outputs(self):
        """(choice index, RequestOutput) until every request finished; timings observed on the way."""
        metrics = self.state.metrics
        while self.unfinished:
            out = await self._next()
            if out is None:
                return
            if isinstance(out, StepFailure):
                self.failure = APIError(out.status, out.message, type="server_error", code=out.code)
                self.unfinished.discard(out.request_id)
                continue
            i = self.index[out.request_id]
            self.seen[i] = True
            now = time.perf_counter()
            if out.new_token_ids:
                (metrics.ttft if self.last[i] is None else metrics.itl).observe(now - (self.last[i] or self.arrival))
                self.last[i] = now
                self.tokens[i] += len(out.new_token_ids)
            if out.finished:
                self.unfinished.discard(out.request_id)
                self.stats[i] = out.stats
                if out.request_id not in self.aborted:
                    metrics.e2e.observe(now - self.arrival)
                    metrics.finished(_reason(out.finish_reason))
            yield i, out

    async def outputs(self):
        """(choice index, RequestOutput) of every output of the call's requests, the first included, in order."""
        if self._iter is None:
            await self.start()
        if self._first is not None:
            yield self._first
            async for item in self._iter:
                yield item

    def token_usage(self) -> dict:
        seen, prompt = set(), 0
        for job in self.jobs:
            if id(job["prompt_ids"]) not in seen:
                seen.add(id(job["prompt_ids"]))
                prompt += len(job["prompt_ids"])
        done = [s for s in self.stats if s is not None]  # a choice's prediction tokens are counted as it finishes
        accepted = sum(s.accepted_prediction_tokens for s in done)
        predicted = any(job["params"].get("prediction") for job in self.jobs)
        prediction = (accepted, sum(s.prediction_tokens for s in done) - accepted) if predicted else None
        return usage(prompt, sum(self.tokens), prediction)

    def spec(self, indices) -> dict:
        stats = [self.stats[i] for i in indices if self.stats[i] is not None]
        new = sum(s.new_tokens for s in stats)
        forwards = sum(s.forward_passes for s in stats)
        drafted = sum(s.drafted_tokens for s in stats)
        accepted = sum(s.accepted_draft_tokens for s in stats)
        return {
            "drafter": self.state.drafter,
            "new_tokens": new,
            "forward_passes": forwards,
            "mean_accepted_tokens": round(new / forwards, 4) if forwards else 0.0,
            "drafted_tokens": drafted,
            "accepted_draft_tokens": accepted,
            "acceptance_rate": round(accepted / drafted, 4) if drafted else 0.0,
        }

    async def logprobs_of(self, i: int, entries) -> dict | None:
        """OpenAI's logprobs object for these output tokens of choice i (chat: `content`; completions: `tokens`,
        `token_logprobs`, `top_logprobs`, `text_offset`), or None when the call asked for none."""
        if self.num_logprobs is None:
            return None
        entries = entries or []
        ids = [e.token for e in entries] + [t for e in entries for t, _ in e.top]
        strings = await self.state.tokenizers.token_strings(ids)
        shown = {t: f"token_id:{t}" for t in ids} if self.body.return_tokens_as_token_ids else strings  # vLLM's
        n = self.num_logprobs
        if self.chat:

            def item(token: int, logprob: float) -> dict:
                text = shown[token]
                return {"token": text, "logprob": _finite(logprob), "bytes": list(text.encode("utf-8"))}

            content = [
                {**item(e.token, e.logprob), "top_logprobs": [item(t, lp) for t, lp in e.top[:n]]} for e in entries
            ]
            return {"content": content, "refusal": None}
        offsets = []
        for e in entries:
            offsets.append(self.offsets[i])
            self.offsets[i] += len(strings[e.token])
        return {
            "tokens": [shown[e.token] for e in entries],
            "token_logprobs": [_finite(e.logprob) for e in entries],
            # vLLM's shape: the chosen token, then the n most likely (a dict: up to n + 1 entries)
            "top_logprobs": [
                None if e.logprob is None else {shown[t]: _finite(lp) for t, lp in ((e.token, e.logprob), *e.top[:n])}
                for e in entries
            ],
            "text_offset": offsets,
        }

    async def prompt_logprobs_of(self, out) -> list | None:
        """vLLM's prompt_logprobs of a choice's first output (None when the call asked for none): None for the first
        prompt token, then per token {token id: {logprob, rank, decoded_token}} for it and the N most likely."""
        n = self.body.prompt_logprobs
        if n is None or not out.prompt_logprobs:
            return None
        entries = out.prompt_logprobs[1:]
        strings = await self.state.tokenizers.token_strings(
            [e.token for e in entries] + [t for e in entries for t, _ in e.top[:n]]
        )

        def item(logprob: float, rank: int | None, token: int) -> dict:
            return {"logprob": _finite(logprob), "rank": rank, "decoded_token": strings[token]}

        return [None] + [
            {str(e.token): item(e.logprob, e.rank, e.token)}
            | {str(t): item(lp, r, t) for r, (t, lp) in enumerate(e.top[:n], start=1) if t != e.token}
            for e in entries
        ]

    def prompt_entries(self, i: int, out) -> list[TokenLogprobs]:
        """An echoed prompt's logprobs, carried by choice i's first output (completions with echo and logprobs): its
        first token has none (logprob None, as vLLM and OpenAI answer it)."""
        if self.chat or not out.prompt_logprobs or not self.jobs[i]["echo"] or self.num_logprobs is None:
            return []
        return [TokenLogprobs(self.jobs[i]["prompt_ids"][0], None), *out.prompt_logprobs[1:]]

    def _head(self, chunk: bool) -> dict:
        kind = ("chat.completion" if self.chat else "text_completion") + (".chunk" if chunk and self.chat else "")
        return {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.state.model_name,
            "system_fingerprint": None,
        }

    async def collect(self) -> dict:
        texts = [[job["echo"]] for job in self.jobs]
        reasons: list = [None] * len(self.jobs)
        ids: list[list[int]] = [[] for _ in self.jobs]
        scores: list = [None] * len(self.jobs)
        stops: list = [None] * len(self.jobs)  # vLLM's stop_reason: the stop string or token id that ended it
        async for i, out in self.outputs():
            texts[i].append(out.text)
            ids[i] += out.new_token_ids
            if out.prompt_logprobs:
                scores[i] = await self.prompt_logprobs_of(out)
            self.logprobs[i] += self.prompt_entries(i, out) + (out.logprobs or [])
            if out.finished:
                reasons[i], stops[i] = _reason(out.finish_reason), out.stop_reason
        if self.failure:
            raise self.failure
        choices = []
        for i, parts in enumerate(texts):
            text = "".join(parts)
            logprobs = await self.logprobs_of(i, self.logprobs[i])
            if self.chat:
                content, calls, reason = self.tool_calls_of(text, reasons[i])
                message = {"role": "assistant", "content": content, "refusal": None}
                if calls:
                    message["tool_calls"] = calls
                choices.append({"index": i, "message": message, "logprobs": logprobs, "finish_reason": reason})
            else:
                choices.append({"index": i, "text": text, "logprobs": logprobs, "finish_reason": reasons[i]})
            choices[-1]["stop_reason"] = stops[i]
            if self.return_ids:
                choices[-1]["token_ids"] = ids[i]
                if not self.chat:
                    choices[-1]["prompt_token_ids"] = self.jobs[i]["prompt_ids"]
            if scores[i] is not None and not self.chat:
                choices[-1]["prompt_logprobs"] = scores[i]
        head = {**self._head(False), "choices": choices}
        if self.return_ids and self.chat:
            head["prompt_token_ids"] = self.jobs[0]["prompt_ids"]
        if scores[0] is not None and self.chat:
            head["prompt_logprobs"] = scores[0]
        return {**head, "usage": self.token_usage(), "leapdecode": self.spec(range(len(self.jobs)))}

    def tool_calls_of(self, text: str, reason: str | None) -> tuple[str | None, list[dict], str | None]:
        """(content, tool_calls, finish_reason) of a finished chat answer: calls only where tools were asked for and
        the answer ended by itself (an answer cut by max_tokens stays text)."""
        if self.tools is None or reason != "stop":
            return text, [], reason
        content, calls = self.tools.parse(text)
        return content, calls, "tool_calls" if calls and self.tools.mode != "named" else reason

    def _chunk(
        self,
        i: int,
        text: str | None,
        reason: str | None,
        role: bool = False,
        logprobs: dict | None = None,
        token_ids: list[int] | None = None,
        prompt_logprobs: list | None = None,
    ) -> dict:
        if self.chat:
            delta = {"role": "assistant", "content": ""} if role else ({} if text is None else {"content": text})
            choice = {"index": i, "delta": delta, "logprobs": logprobs, "finish_reason": reason}
        else:
            choice = {"index": i, "text": text or "", "logprobs": logprobs, "finish_reason": reason}
        chunk = {**self._head(True), "choices": [choice]}
        if prompt_logprobs is not None:  # on the chunk of the choice's first output (chat: on the response)
            (chunk if self.chat else choice)["prompt_logprobs"] = prompt_logprobs
        if self.return_ids:  # vLLM's shape: each delta's ids; the prompt's once (chat: the call's, completions: each
            choice["token_ids"] = list(token_ids or ())  # choice's), on the first chunk that carries it
            first = (0 if self.chat else i) not in self.prompt_ids_sent
            if first:
                (chunk if self.chat else choice)["prompt_token_ids"] = self.jobs[i]["prompt_ids"]
                self.prompt_ids_sent.add(0 if self.chat else i)
        if self.include_usage:
            continuous = self.body.stream_options.continuous_usage_stats
            chunk["usage"] = self.token_usage() if continuous else None
        return chunk

    @property
    def include_usage(self) -> bool:
        return bool(self.body.stream_options and self.body.stream_options.include_usage)

    async def events(self):
        def sse(obj) -> str:
            return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"

        # a completion's echo with logprobs waits for the prompt's logprobs, which come with the choice's first
        # output (a chat's echo is text alone, as vLLM's)
        scored = self.num_logprobs is not None and not self.chat
        deferred = {i for i, job in enumerate(self.jobs) if job["echo"] and scored}
        for i, job in enumerate(self.jobs):
            if self.chat:
                yield sse(self._chunk(i, None, None, role=True))
            if job["echo"] and i not in deferred:
                yield sse(self._chunk(i, job["echo"], None))
        async for i, out in self.outputs():
            if i in deferred:
                deferred.discard(i)
                prompt = await self.logprobs_of(i, self.prompt_entries(i, out))
                yield sse(self._chunk(i, self.jobs[i]["echo"], None, logprobs=prompt))
            # a step's tokens carry their logprobs even when their text is held back (a possible stop string)
            logprobs = await self.logprobs_of(i, out.logprobs) if out.logprobs else None
            first_scores = out.prompt_logprobs and (not self.chat or i == 0)  # chat: one prompt, scored once
            scores = await self.prompt_logprobs_of(out) if first_scores else None
            sent = dict(logprobs=logprobs, token_ids=out.new_token_ids, prompt_logprobs=scores)
            if self.tools is not None:  # the text is read for calls once it is whole: held back until then
                self.texts[i].append(out.text)
            if out.finished:
                reason = _reason(out.finish_reason)
                if self.tools is not None:
                    text, calls, reason = self.tool_calls_of("".join(self.texts[i]), reason)
                    chunk = self._chunk(i, text, reason, **sent)
                    if calls:
                        chunk["choices"][0]["delta"]["tool_calls"] = [{"index": k, **c} for k, c in enumerate(calls)]
                else:
                    chunk = self._chunk(i, out.text or (None if self.chat else ""), reason, **sent)
                chunk["choices"][0]["stop_reason"] = out.stop_reason
                chunk["leapdecode"] = {"index": i, **self.spec([i])}
                yield sse(chunk)
            elif (out.text and self.tools is None) or logprobs or scores or (self.return_ids and out.new_token_ids):
                yield sse(self._chunk(i, out.text if self.tools is None else None, None, **sent))
        if self.failure:
            yield sse(self.failure.body())
        elif self.include_usage:
            yield sse({**self._head(True), "choices": [], "usage": self.token_usage()})
        yield "data: [DONE]\n\n"
