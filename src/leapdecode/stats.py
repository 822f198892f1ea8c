"""The record of a generation and its result, read alike by the API, the Engine, the CLI and the benchmark."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0  # of those, read from the prefix cache instead of computed
    new_tokens: int = 0
    forward_passes: int = 0  # target forwards, prefill included
    drafted_tokens: int = 0  # draft tokens sent to verification
    accepted_draft_tokens: int = 0  # of those, accepted
    time_to_first_token: float = 0.0  # seconds
    total_time: float = 0.0  # seconds, prefill included
    draft_time: float = 0.0  # seconds spent inside the drafter
    stop_reason: str = ""  # "eos", "length" (max_new_tokens) or "context" (model context full)
    accepted_per_step: list[int] = field(default_factory=list)  # new tokens per decode step
    prediction_tokens: int = 0  # of the request's prediction (RequestParams.prediction)
    accepted_prediction_tokens: int = 0  # of those, the ones the output followed (drafters.prediction)

    @property
    def mean_accepted_tokens(self) -> float:
        """New tokens per target forward pass (plain decoding: exactly 1)."""
        return self.new_tokens / self.forward_passes if self.forward_passes else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.total_time if self.total_time > 0 else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_draft_tokens / self.drafted_tokens if self.drafted_tokens else 0.0

    def as_dict(self) -> dict:
        return {
            "prompt_tokens": self.prompt_tokens,
            "cached_prompt_tokens": self.cached_prompt_tokens,
            "new_tokens": self.new_tokens,
            "forward_passes": self.forward_passes,
            "mean_accepted_tokens": round(self.mean_accepted_tokens, 4),
            "drafted_tokens": self.drafted_tokens,
            "accepted_draft_tokens": self.accepted_draft_tokens,
            "acceptance_rate": round(self.acceptance_rate, 4),
            "tokens_per_second": round(self.tokens_per_second, 3),
            "time_to_first_token": round(self.time_to_first_token, 4),
            "total_time": round(self.total_time, 4),
            "draft_time": round(self.draft_time, 4),
            "stop_reason": self.stop_reason,
            "prediction_tokens": self.prediction_tokens,
            "accepted_prediction_tokens": self.accepted_prediction_tokens,
        }


@dataclass
class GenerationResult:
    """What one request produced: its text, the new token ids, the prompt's ids and the record of how it went."""

    text: str
    token_ids: list[int]  # the new tokens only
    prompt_ids: list[int]
    stats: GenerationStats
    model: str
    drafter: str
    logprobs: list | None = None  # with RequestParams.logprobs: one sequence.TokenLogprobs per new token
    prompt_logprobs: list | None = None  # with RequestParams.prompt_logprobs (Engine): None, then one per prompt token
    error: str | None = None  # the request failed (stats.stop_reason "error"): why; the tokens are those before it

    def as_dict(self) -> dict:
        out = {
            "text": self.text,
            "token_ids": self.token_ids,
            "model": self.model,
            "drafter": self.drafter,
            **self.stats.as_dict(),
        }
        if self.error is not None:
            out["error"] = self.error
        if self.logprobs is not None:
            out["logprobs"] = [
                {"token_id": lp.token, "logprob": lp.logprob, "top": [list(t) for t in lp.top]} for lp in self.logprobs
            ]
        return out
