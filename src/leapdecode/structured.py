"""Structured output: a grammar (a JSON schema, any JSON object, a regular expression, a choice of strings, or a Lark
grammar) that every output must follow, as vLLM's `structured_outputs` and OpenAI's `response_format` ask.

llguidance (a Rust library with no dependencies) gives, for the output so far, the set of tokens that keep it inside
the grammar; each row's logits outside that set become -inf before temperature and the filters. Under speculation,
row i of a verification is masked by the grammar's state after the output *and the first i drafted tokens*, so
plain and speculative decoding mask the same rows the same way: greedy output is plain greedy's under the grammar and
sampling draws from the same masked distribution. A draft is cut before its first token the grammar refuses (those
rows could only be rejected). Once the grammar is complete only the end of sequence is allowed.
"""

from __future__ import annotations

import json
import weakref
from dataclasses import dataclass

import torch

from .errors import LeapDecodeError, require

KINDS = ("json", "json_object", "regex", "choice", "grammar")  # vLLM's StructuredOutputsParams fields


@dataclass(frozen=True)
class StructuredOutput:
    """What the output must follow: `kind` one of KINDS, `spec` its text (a JSON schema or choice list as JSON);
    `compact`: JSON without free whitespace between its tokens (vLLM's `disable_any_whitespace`; the default lets
    the model lay JSON out as it likes, which a weak model may fill with newlines until max_tokens)."""

    kind: str
    spec: str
    compact: bool = False

    @classmethod
    def of(cls, value) -> StructuredOutput | None:
        """From None, a StructuredOutput, or vLLM's dict with one field: {"json": schema (dict or JSON text)},
        {"json_object": True}, {"regex": str}, {"choice": [str, ...]}, {"grammar": Lark or GBNF text}; with
        "disable_any_whitespace": True for compact JSON."""
        if value is None or isinstance(value, StructuredOutput):
            return value
        require(isinstance(value, dict), f"structured_output must be a dict naming one of {', '.join(KINDS)}")
        value = dict(value)
        compact = value.pop("disable_any_whitespace", False)
        require(isinstance(compact, bool), "structured_output: disable_any_whitespace must be true or false")
        found = cls._of(value)
        return found if not compact else cls(found.kind, found.spec, True)

    @classmethod
    def _of(cls, value: dict) -> StructuredOutput:
        require(
            len([k for k, v in value.items() if v not in (None, False)]) == 1,
            f"structured_output must name exactly one of {', '.join(KINDS)}, got {value!r}"[:300],
        )
        kind, spec = next((k, v) for k, v in value.items() if v not in (None, False))
        require(kind in KINDS, f"structured_output: unknown kind {kind!r}; kinds: {', '.join(KINDS)}")
        if kind == "json_object":
            return cls("json", '{"type": "object"}')
        if kind == "json":
            require(isinstance(spec, (dict, str)), "structured_output: json must be a JSON schema (an object or text)")
            return cls("json", spec if isinstance(spec, str) else json.dumps(spec))
        if kind == "choice":
            require(
                isinstance(spec, (list, tuple)) and spec and all(isinstance(c, str) and c for c in spec),
                "structured_output: choice must be a non-empty list of non-empty strings",
            )
            return cls("choice", json.dumps(list(spec)))
        require(isinstance(spec, str) and spec, f"structured_output: {kind} must be a non-empty string")
        return cls(kind, spec)


def grammar_for(structured: StructuredOutput | None, loaded, tokenizer=None) -> Grammar | None:
    """`structured` compiled for a loaded model (models.LoadedModel: its logits width, end of sequence and tokenizer,
    or `tokenizer`, a copy of it another thread owns), or None; a bad grammar fails here, in one line."""
    if structured is None:
        return None
    tokenizer = loaded.tokenizer if tokenizer is None else tokenizer
    return Grammar(structured, tokenizer, loaded.model.config.vocab_size, loaded.eos_token_ids)


class Grammar:
    """A StructuredOutput compiled for one tokenizer and logits width; `start()` gives a request its own state."""

    def __init__(self, structured: StructuredOutput, tokenizer, vocab: int, eos_ids):
        import llguidance

        self.vocab, self.eos_ids = vocab, frozenset(eos_ids)
        self.tokenizer = _ll_tokenizer(tokenizer, vocab, sorted(eos_ids))
        try:
            if structured.kind == "json":  # JSON text in, so a bad schema text fails here in one line
                flexible = {"whitespace_flexible": not structured.compact}
                self.text = llguidance.LLMatcher.grammar_from_json_schema(structured.spec, overrides=flexible)
            else:
                self.text = llguidance.grammar_from(structured.kind, structured.spec)
        except Exception as error:  # bad JSON text, an unknown format
            raise LeapDecodeError(f"structured_output: {_one_line(error)}") from None
        ok, message = _validate(self.text, self.tokenizer)
        require(ok, f"structured_output: the {structured.kind} is not valid: {message}")

    def start(self) -> GrammarState:
        import llguidance

        return GrammarState(llguidance.LLMatcher(self.tokenizer, self.text, log_level=0), self.vocab, self.eos_ids)


class GrammarState:
    """One request's place in its grammar: it follows the output token by token (`advance`)."""

    def __init__(self, matcher, vocab: int, eos_ids: frozenset[int]):
        self.matcher, self.vocab, self.eos_ids = matcher, vocab, eos_ids

    def valid_prefix(self, tokens: list[int]) -> int:
        """How many of `tokens`, from the first, the grammar accepts after the output so far."""
        return self.matcher.validate_tokens(tokens) if tokens else 0

    def mask(self, logits: torch.Tensor, draft: list[int]) -> torch.Tensor:
        """`logits` [len(draft) + 1, V] with the tokens outside the grammar at -inf (a new tensor): row i after the
        output and draft[:i]. Rows past a draft token the grammar refuses keep the mask before it (they are never
        read: verification rejects that token)."""
        rows, words = logits.shape[0], -(-self.vocab // 32)
        bitmasks, consumed = [], 0
        for i in range(rows):
            bitmasks.append(torch.frombuffer(bytearray(self.matcher.compute_bitmask()), dtype=torch.int32)[:words])
            # past a refused token, or an end of sequence (which ends the output), no row is read
            if i == rows - 1 or draft[i] in self.eos_ids or not self.matcher.consume_token(draft[i]):
                break
            consumed += 1
        self.matcher.rollback(consumed)
        bitmask = torch.stack(bitmasks + bitmasks[-1:] * (rows - len(bitmasks)))
        return logits.float().masked_fill(~allowed(bitmask, logits.shape[-1]), float("-inf"))

    def advance(self, tokens: list[int]) -> None:
        """The output grew by `tokens` (each allowed by the mask its row was drawn under; an end of sequence, allowed
        where the grammar is complete, ends the output and is not the grammar's)."""
        for token in tokens:
            if token in self.eos_ids and self.matcher.is_accepting():
                return
            require(
                self.matcher.consume_token(token),
                f"the output left its grammar ({_one_line(self.matcher.get_error() or 'a token outside it')})",
            )


def allowed(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """llguidance's bitmask [rows, words] of int32 (bit j of word w: token 32 w + j) as bool [rows, vocab]."""
    bits = (bitmask.unsqueeze(-1) >> torch.arange(32, dtype=torch.int32)) & 1
    return bits.reshape(bitmask.shape[0], -1)[:, :vocab].bool()


_LL_TOKENIZERS: dict[int, tuple] = {}  # id(tokenizer) -> (a weak reference to it, {(vocab, eos): LLTokenizer})


def _ll_tokenizer(tokenizer, vocab: int, eos_ids: list[int]):
    """llguidance's view of the tokenizer (~0.3-1 s to build): cached per tokenizer, logits width and EOS (beside the
    tokenizer, not on it: the server deep-copies its tokenizers, and an LLTokenizer does not copy)."""
    import llguidance.hf

    ref, cache = _LL_TOKENIZERS.get(id(tokenizer), (None, None))
    if ref is None or ref() is not tokenizer:
        ref, cache = weakref.ref(tokenizer), {}
        _LL_TOKENIZERS[id(tokenizer)] = (ref, cache)
    key = (vocab, tuple(eos_ids))
    if key not in cache:
        require(getattr(tokenizer, "is_fast", False), "structured output needs a fast (Rust) tokenizer")
        try:
            cache[key] = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab, eos_token=eos_ids)
        except Exception as error:  # e.g. a word-level tokenizer: no bytes per token to follow a grammar with
            raise LeapDecodeError(
                f"structured output is not available for this tokenizer ({_one_line(error)})"
            ) from None
    return cache[key]


def _validate(text: str, ll_tokenizer) -> tuple[bool, str]:
    """(valid, the first error or warning on one line)."""
    import llguidance

    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(text, ll_tokenizer)
    return not is_error, _one_line(messages[0] if messages else "")


def _one_line(message) -> str:
    """llguidance's messages span lines (with a source excerpt): one line of at most 300 characters."""
    return " ".join(str(message).split())[:300] or "invalid"
