"""One request inside the Engine: its state, what each step hands back for it, and the acceptance prior of new ones."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, replace

from ..controller import DECAY
from ..kv.slots import SequenceKV
from ..params import RequestParams
from ..sequence import SequenceState, TokenLogprobs
from ..stats import GenerationStats
from ..text import TextStream


@dataclass
class RequestOutput:
    """What one step produced for one request. `text` is the new text (never a stop string); the last output of a
    request has `finished`, its `finish_reason` ("stop", "length" or "abort", see params.FINISH_REASONS) and its
    `stats`; a request that failed has finish_reason "error" and the reason in `error`. `logprobs`: one
    TokenLogprobs per new token when the request asked for them (RequestParams.logprobs), else None.
    `prompt_logprobs`: with RequestParams.prompt_logprobs, on the request's first output: None for the prompt's first
    token, then one TokenLogprobs per prompt token. `stop_reason` (vLLM's): on a last output that a stop string or a
    stop token id ended, that string or id (None otherwise, the end of sequence included)."""

    request_id: int
    new_token_ids: list[int]
    text: str
    finished: bool
    finish_reason: str | None
    prompt_tokens: int
    stats: GenerationStats | None = None
    error: str | None = None  # set (with finish_reason "error") when this request failed; others went on
    logprobs: list[TokenLogprobs] | None = None
    prompt_logprobs: list[TokenLogprobs | None] | None = None
    stop_reason: str | int | None = None

    def then(self, later: RequestOutput) -> RequestOutput:
        """This output and the same request's next one as one (a streamed chunk that holds several steps)."""
        logprobs = (
            None if self.logprobs is None and later.logprobs is None else (self.logprobs or []) + (later.logprobs or [])
        )
        return replace(
            later,
            new_token_ids=self.new_token_ids + later.new_token_ids,
            text=self.text + later.text,
            logprobs=logprobs,
            prompt_logprobs=self.prompt_logprobs if self.prompt_logprobs is not None else later.prompt_logprobs,
        )


class Request:
    """A request from add_request to its last output. `seq` (the step rule's state) and `kv` (its KV slot) exist while
    it runs. `reading`: the tokens to read before it decodes: its prompt, or after a preemption (which gave its KV
    back) its whole context so far, recomputed."""

    def __init__(
        self,
        rid: int,
        prompt_ids: list[int],
        params: RequestParams,
        text: TextStream,
        on_output,
        grammar=None,
        priority: int = 0,
        prediction: list[int] | None = None,
    ):
        self.id, self.prompt_ids, self.params, self.text, self.on_output = rid, prompt_ids, params, text, on_output
        self.prediction = prediction or []  # params.prediction's token ids (drafters.prediction)
        self.priority = priority  # under the priority policy: lower is admitted first and preempted last
        self.grammar = grammar  # structured.Grammar of params.structured_output, compiled once at add_request
        self.arrival = time.perf_counter()
        self.seq: SequenceState | None = None
        self.kv: SequenceKV | None = None
        self.reading: list[int] = prompt_ids
        self.admitted = 0  # admission order (the newest running request is preempted first)
        self.outputs: deque[RequestOutput] = deque()
        self.prompt_scores: list[TokenLogprobs] = []  # with params.prompt_logprobs: prompt tokens 1.. scored so far

    @property
    def scoring(self) -> bool:
        """Whether prompt tokens are still to be scored (RequestParams.prompt_logprobs): then none of its prompt may
        come from the prefix cache, whose rows have no logits."""
        return self.params.prompt_logprobs is not None and len(self.prompt_scores) < len(self.prompt_ids) - 1

    @property
    def decoding(self) -> bool:
        """What it had to read is read (the step that read its last token also took its first decoding step)."""
        return self.kv.length >= len(self.reading)

    @property
    def read(self) -> int:
        """Tokens of `reading` whose keys/values are in its slot."""
        return self.kv.length


class Acceptance:
    """Decayed counts of accepted draft tokens and rejections over all requests: a new request's controller starts
    from them (worth PRIOR_STEPS steps) instead of a fixed prior, so it drafts as much as drafts have been paying."""

    PRIOR_STEPS = 4.0

    def __init__(self):
        self.accepted = self.rejected = self.steps = 0.0

    def update(self, accepted: int, rejected: bool) -> None:
        self.accepted, self.rejected = self.accepted * DECAY + accepted, self.rejected * DECAY + rejected
        self.steps = self.steps * DECAY + 1

    def prior(self) -> tuple[float, float]:
        if self.steps == 0:
            return 0.0, 0.0
        scale = min(1.0, self.PRIOR_STEPS / self.steps)
        return self.accepted * scale, self.rejected * scale
