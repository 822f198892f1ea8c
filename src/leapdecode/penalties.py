"""Repetition, frequency and presence penalties, a fixed logit bias and a set of allowed tokens, as vLLM applies them
(OpenAI's `frequency_penalty`, `presence_penalty`, `logit_bias`; vLLM's and HF's `repetition_penalty`, vLLM's
`allowed_token_ids` and `bad_words`).

They change the logits a row samples from by what came before that row, so they are part of the target distribution,
not a filter on the output: under speculation, row i of a verification scores the token after the output so far plus
the first i drafted tokens, and is penalised for exactly those tokens. Plain decoding penalises the same row by the
same tokens, so greedy speculative decoding still emits plain greedy's tokens and speculative sampling still draws
from plain sampling's distribution, penalties included.

Order (vLLM's sampler, and HF's processors for the two it has): the bias is added first; then a token seen in the
prompt or the output has a positive logit divided by `repetition`, a negative one multiplied by it; then each output
token's logit loses `frequency` times its count and `presence` once. A token outside `allowed` (when given) is
ruled out, and so is the last token of a bad word whose other tokens end the output so far (-inf: no finite step
above changes that, so its place in the order does not matter). Temperature and the top-k/top-p/min-p filters come
after (sampling.probabilities).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .errors import require

MAX_BIAS = 100.0  # OpenAI's range for a logit_bias value


@dataclass(frozen=True)
class Penalties:
    """`logit_bias`: (token id, bias) pairs added to those tokens' logits at every position; `allowed`: the only
    tokens that may be produced (empty: any); `bad_words`: token sequences the output may not complete."""

    repetition: float = 1.0
    frequency: float = 0.0
    presence: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    allowed: tuple[int, ...] = ()
    bad_words: tuple[tuple[int, ...], ...] = ()

    def __post_init__(self) -> None:
        for name in ("repetition", "frequency", "presence"):
            value = getattr(self, name)
            require(
                isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value),
                f"{name}_penalty must be a finite number, got {value!r}",
            )
        require(self.repetition > 0, f"repetition_penalty must be > 0, got {self.repetition}")
        require(
            -2 <= self.frequency <= 2 and -2 <= self.presence <= 2,
            f"frequency_penalty and presence_penalty must be in [-2, 2], got {self.frequency} and {self.presence}",
        )
        bias = dict(self.logit_bias.items() if isinstance(self.logit_bias, dict) else self.logit_bias)
        for token, value in bias.items():
            require(type(token) is int and token >= 0, f"logit_bias: token ids must be integers >= 0, got {token!r}")
            require(
                isinstance(value, (int, float)) and not isinstance(value, bool) and -MAX_BIAS <= value <= MAX_BIAS,
                f"logit_bias: the bias of token {token} must be a number in [-100, 100], got {value!r}",
            )
        object.__setattr__(self, "logit_bias", tuple(sorted((t, float(v)) for t, v in bias.items())))
        require(
            isinstance(self.allowed, (list, tuple)) and all(type(t) is int and t >= 0 for t in self.allowed),
            f"allowed_token_ids must be a list of token ids (integers >= 0), got {self.allowed!r}",
        )
        object.__setattr__(self, "allowed", tuple(sorted(set(self.allowed))))

    @property
    def active(self) -> bool:
        return (
            self.repetition != 1
            or self.frequency != 0
            or self.presence != 0
            or bool(self.logit_bias or self.allowed or self.bad_words)
        )

    @property
    def needs_prompt(self) -> bool:
        return self.repetition != 1

    def apply(
        self, logits: torch.Tensor, out: list[int], draft: list[int], in_prompt: torch.Tensor | None = None
    ) -> torch.Tensor:
        """`logits` [len(draft) + 1, V] adjusted (a new tensor; the input is kept for raw logprobs): row i is the
        position after `out` + draft[:i]. `in_prompt` (where `needs_prompt`): prompt_mask of the prompt."""
        if not self.active:
            return logits
        rows, vocab = logits.shape
        logits = logits.float().clone()
        if self.logit_bias:
            ids = [t for t, _ in self.logit_bias]
            require(max(ids) < vocab, f"logit_bias: token id {max(ids)} is outside the model's {vocab} logits")
            logits[:, ids] += torch.tensor([b for _, b in self.logit_bias], device=logits.device)
        if self.allowed:
            require(self.allowed[-1] < vocab, f"allowed_token_ids: {self.allowed[-1]} is outside the model's logits")
            barred = torch.ones(vocab, dtype=torch.bool, device=logits.device)
            barred[list(self.allowed)] = False
            logits.masked_fill_(barred, -math.inf)
        for row in range(rows if self.bad_words else 0):  # a bad word's last token where its others end the output
            history = out + draft[:row]
            for word in self.bad_words:
                if len(word) - 1 <= len(history) and tuple(history[len(history) - len(word) + 1 :]) == word[:-1]:
                    logits[row, word[-1]] = -math.inf
        if self.repetition == 1 and self.frequency == 0 and self.presence == 0:
            return logits
        # counts[i]: how often each token occurs in out + draft[:i]
        history = torch.tensor(out + draft[: rows - 1], dtype=torch.long, device=logits.device)
        counts = torch.zeros(rows, vocab, device=logits.device)
        if len(out):
            counts += torch.bincount(history[: len(out)], minlength=vocab)[:vocab]
        for i, token in enumerate(draft[: rows - 1]):
            counts[i + 1 :, token] += 1
        seen = counts > 0
        if self.repetition != 1:
            repeated = seen | in_prompt[:vocab]
            scaled = torch.where(logits > 0, logits / self.repetition, logits * self.repetition)
            logits = torch.where(repeated, scaled, logits)
        if self.frequency:
            logits -= self.frequency * counts
        if self.presence:
            logits -= self.presence * seen.float()
        return logits


NO_PENALTIES = Penalties()


def bad_word_ids(tokenizer, words) -> list[tuple[int, ...]]:
    """Each word's token sequence, and (vLLM's rule) its sequence after a space where that is another word of as many
    tokens: so a word is ruled out at the start of the text and inside it."""
    out = []
    for word in words:
        alone = tuple(tokenizer.encode(word.lstrip(), add_special_tokens=False))
        spaced = tuple(tokenizer.encode(" " + word.lstrip(), add_special_tokens=False))
        out.append(alone)
        if alone and spaced and spaced[0] != alone[0] and len(spaced) == len(alone):
            out.append(spaced)
    return [w for w in out if w]


def prompt_mask(prompt_ids: list[int], vocab: int) -> torch.Tensor:
    """[vocab] bool: which tokens occur in the prompt (computed once per request, read by every step)."""
    ids = torch.tensor([t for t in prompt_ids if 0 <= t < vocab], dtype=torch.long)
    return torch.bincount(ids, minlength=vocab).bool()
