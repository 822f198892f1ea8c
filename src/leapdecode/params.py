"""Typed request settings, validated once where they enter (generate, Engine.add_request, the server), and the one map
from a sequence's stop reason to the finish reason users see.

`RequestParams` is what one request asks for (how much to generate, how to sample, where to stop); `DraftConfig` is
how a drafter's draft length starts and adapts. Both are frozen: whatever runs the request reads them, never changes
them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace

from .controller import DraftLengthController
from .errors import require
from .penalties import Penalties, bad_word_ids
from .sampling import SamplingConfig
from .structured import StructuredOutput

# stop reason of a sequence (stats.GenerationStats.stop_reason) -> OpenAI/vLLM finish reason
FINISH_REASONS = {
    "eos": "stop",
    "stop": "stop",
    "length": "length",
    "context": "length",
    "cancelled": "abort",
    "error": "error",
}


MAX_LOGPROBS = 20  # top alternatives a request may ask for (OpenAI's and vLLM's default limit)


def finish_reason(stop_reason: str) -> str:
    return FINISH_REASONS[stop_reason]


def _is_int(value) -> bool:
    return type(value) is int  # bool is an int subclass, and True is no token count


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class RequestParams:
    """What one request asks for. `stop`: strings that end the output (never part of it); `raw`: a string prompt is
    sent as is, without the chat template. As vLLM has them: `min_p` (sampling drops tokens less likely than min_p
    times the most likely one), `stop_token_ids` (tokens that end the output, kept in it like the end of sequence),
    `ignore_eos` (the end-of-sequence token ends nothing), `min_tokens` (the end of sequence and the stop token ids
    cannot be produced before this many tokens: the sampled distribution excludes them there). `logprobs`: report,
    for every output token, its log-probability and that of the `logprobs` most likely tokens (0: the chosen token's
    only; None: none) under the target model's raw distribution (log_softmax of its logits, before temperature and
    any filter or mask, as vLLM's default `raw_logprobs`). `repetition_penalty`, `frequency_penalty`,
    `presence_penalty`, `logit_bias` ({token id: bias}) and `allowed_token_ids` (the only tokens the output may hold)
    as vLLM applies them (penalties.Penalties); like the sampling settings they change the distribution plain and
    speculative decoding both draw from.
    `prompt_logprobs`: report, for every prompt token after the first, its log-probability given the tokens before it
    and that of the `prompt_logprobs` most likely tokens there (vLLM's `prompt_logprobs`; the Engine only): the prompt
    is then read whole from its first token (no cached prefix) and `max_new_tokens` may be 0 (scoring alone).
    `bad_words`: words the output may not contain (vLLM's: each word's tokens, alone and after a space; the last
    token is ruled out where the others end the output). `include_stop_str_in_output`: the text keeps the stop
    string that ended it (vLLM's; by default it is cut before it); `skip_special_tokens`: False keeps special tokens
    (e.g. a template's tags) in the text.
    `structured_output`: a grammar every output follows (structured.StructuredOutput, or vLLM's dict: {"json":
    schema}, {"json_object": True}, {"regex": ...}, {"choice": [...]}, {"grammar": ...}).
    `prediction`: text (or its token ids) the output is expected to largely repeat, OpenAI's Predicted Outputs: drafts
    copy it (drafters.prediction). It changes the speed, never the output."""

    max_new_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    raw: bool = False
    min_p: float = 0.0
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: tuple[int, ...] | None = None
    bad_words: tuple[str, ...] = ()
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    structured_output: StructuredOutput | dict | None = None
    prediction: str | tuple[int, ...] | None = None
    sampling: SamplingConfig = field(init=False, repr=False, compare=False)
    penalties: Penalties = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        scoring = self.prompt_logprobs is not None
        require(
            _is_int(self.max_new_tokens) and self.max_new_tokens >= (0 if scoring else 1),
            f"max_new_tokens must be a positive integer (0 only with prompt_logprobs), got {self.max_new_tokens!r}",
        )
        require(
            _is_number(self.temperature) and _is_number(self.top_p) and _is_int(self.top_k),
            "temperature and top_p must be finite numbers, top_k an integer",
        )
        require(self.seed is None or _is_int(self.seed), f"seed must be an integer, got {self.seed!r}")
        stop = [self.stop] if isinstance(self.stop, str) else self.stop
        require(
            stop is None or (isinstance(stop, (list, tuple)) and all(isinstance(s, str) and s for s in stop)),
            "stop must be a non-empty string or a list of non-empty strings",
        )
        object.__setattr__(self, "stop", tuple(stop or ()))
        require(
            isinstance(self.bad_words, (list, tuple)) and all(isinstance(w, str) and w.strip() for w in self.bad_words),
            f"bad_words must be a list of non-empty strings, got {self.bad_words!r}",
        )
        object.__setattr__(self, "bad_words", tuple(self.bad_words))
        require(_is_number(self.min_p), f"min_p must be a number, got {self.min_p!r}")
        ids = self.stop_token_ids
        require(
            isinstance(ids, (list, tuple)) and all(_is_int(t) and t >= 0 for t in ids),
            f"stop_token_ids must be a list of token ids (integers >= 0), got {ids!r}",
        )
        object.__setattr__(self, "stop_token_ids", tuple(ids))
        for name in ("ignore_eos", "include_stop_str_in_output", "skip_special_tokens"):
            require(isinstance(getattr(self, name), bool), f"{name} must be true or false, got {getattr(self, name)!r}")
        require(
            _is_int(self.min_tokens) and 0 <= self.min_tokens <= self.max_new_tokens,
            f"min_tokens must be an integer in [0, max_new_tokens={self.max_new_tokens}], got {self.min_tokens!r}",
        )
        require(
            self.logprobs is None or (_is_int(self.logprobs) and 0 <= self.logprobs <= MAX_LOGPROBS),
            f"logprobs must be None or an integer in [0, {MAX_LOGPROBS}], got {self.logprobs!r}",
        )
        require(
            not scoring or (_is_int(self.prompt_logprobs) and 0 <= self.prompt_logprobs <= MAX_LOGPROBS),
            f"prompt_logprobs must be None or an integer in [0, {MAX_LOGPROBS}], got {self.prompt_logprobs!r}",
        )
        sampling = SamplingConfig(
            temperature=float(self.temperature),
            top_k=self.top_k,
            top_p=float(self.top_p),
            seed=self.seed,
            min_p=float(self.min_p),
        )
        object.__setattr__(self, "sampling", sampling)
        bias = self.logit_bias
        require(
            bias is None or isinstance(bias, (dict, list, tuple)),
            f"logit_bias must be a dict of token id to bias, got {type(bias).__name__}",
        )
        penalties = Penalties(
            repetition=self.repetition_penalty,
            frequency=self.frequency_penalty,
            presence=self.presence_penalty,
            logit_bias=tuple(dict(bias or {}).items()),
            allowed=tuple(self.allowed_token_ids or ()),
        )
        object.__setattr__(self, "penalties", penalties)
        object.__setattr__(self, "structured_output", StructuredOutput.of(self.structured_output))
        prediction = self.prediction
        require(
            prediction is None
            or isinstance(prediction, str)
            or (isinstance(prediction, (list, tuple)) and all(_is_int(t) and t >= 0 for t in prediction)),
            f"prediction must be a string or a list of token ids, got {type(prediction).__name__}",
        )
        if isinstance(prediction, list):
            object.__setattr__(self, "prediction", tuple(prediction))

    def prepare(self, tokenizer) -> None:
        """Fail in one line where the request names a token the tokenizer does not have (logit_bias, allowed ids);
        put the bad words' token sequences in the penalties."""
        if self.bad_words:
            words = tuple(bad_word_ids(tokenizer, self.bad_words))
            object.__setattr__(self, "penalties", replace(self.penalties, bad_words=words))
        vocab = len(tokenizer)
        bad = next((t for t, _ in self.penalties.logit_bias if t >= vocab), None)
        require(bad is None, f"logit_bias: token id {bad} is outside the tokenizer's vocabulary of {vocab}")
        bad = next((t for t in self.penalties.allowed if t >= vocab), None)
        require(bad is None, f"allowed_token_ids: token id {bad} is outside the tokenizer's vocabulary of {vocab}")
        bad = next((t for t in self.prediction if t >= vocab), None) if isinstance(self.prediction, tuple) else None
        require(bad is None, f"prediction: token id {bad} is outside the tokenizer's vocabulary of {vocab}")

    def state_options(self) -> dict:
        """SequenceState's keyword arguments besides the sampling settings and max_new_tokens: where the output may
        and must end, the penalties, and the logprobs it reports."""
        return dict(
            min_tokens=self.min_tokens,
            stop_token_ids=self.stop_token_ids,
            ignore_eos=self.ignore_eos,
            logprobs=self.logprobs,
            penalties=self.penalties,
        )

    @classmethod
    def of(cls, params: RequestParams | None = None, **options) -> RequestParams:
        """`params` as given, or one built from keyword options (bad names fail in one line)."""
        if params is not None:
            require(not options, "pass either a RequestParams or its fields as keywords, not both")
            require(isinstance(params, RequestParams), f"params must be a RequestParams, got {type(params).__name__}")
            return params
        unknown = sorted(set(options) - set(REQUEST_OPTIONS))
        require(not unknown, f"unknown request option(s) {', '.join(unknown)}; options: {', '.join(REQUEST_OPTIONS)}")
        return cls(**options)


def prediction_ids(tokenizer, prediction: str | tuple[int, ...] | None) -> list[int]:
    """A prediction's token ids: its text as the tokenizer reads it, without special tokens; [] for none."""
    if isinstance(prediction, str):
        return tokenizer.encode(prediction, add_special_tokens=False) if prediction else []
    return list(prediction or ())


REQUEST_OPTIONS = tuple(f.name for f in fields(RequestParams) if f.init)


@dataclass(frozen=True)
class DraftConfig:
    """The draft length k: where it starts, its ceiling, and whether it adapts to measured cost and acceptance."""

    draft_length: int = 4
    max_draft_length: int = 16
    adaptive_draft_length: bool = True

    def __post_init__(self) -> None:
        require(
            _is_int(self.draft_length) and _is_int(self.max_draft_length),
            f"draft lengths must be integers, got {self.draft_length!r} and {self.max_draft_length!r}",
        )
        DraftLengthController(**self.controller_options())  # bad lengths fail here, in the controller's words

    def controller_options(self) -> dict:
        """The keyword arguments of controller.DraftLengthController."""
        return dict(
            k_init=min(self.draft_length, self.max_draft_length),
            k_max=self.max_draft_length,
            adaptive=self.adaptive_draft_length,
        )
