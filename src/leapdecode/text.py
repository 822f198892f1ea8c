"""Incremental text of a request: new text per step, stop strings, and the token that completed a stop string.

Detokenizing is incremental, as vLLM does it: each new token is decoded inside a short window of the tokens before it
(a token's text can depend on its neighbours, e.g. a leading space or a multi-byte character split over tokens), never
by re-decoding the whole output. Text is released only once it is final: a tail that could still grow into a stop
string is held back, and so is an incomplete UTF-8 character (the tokenizer shows it as U+FFFD). A stop string ends
the request at the token that completes it; the text is cut before it (or, with `include_stop`, right after it), which
is what plain decoding followed by cutting at the stop string gives. `skip_special`: special tokens leave no text.
"""

from __future__ import annotations

import contextlib

REPLACEMENT = "\ufffd"


class TextStream:
    def __init__(self, tokenizer, stop=(), lock=None, include_stop: bool = False, skip_special: bool = True):
        self.tokenizer, self.stop = tokenizer, tuple(stop)
        self.include_stop, self.skip_special = include_stop, skip_special
        self.lock = lock or contextlib.nullcontext()  # held around every use of the (shared) tokenizer
        self.ids: list[int] = []
        self.text = ""  # the request's text so far, cut before a stop string once one is found
        self.emitted = 0  # characters of `text` already released
        self.stopped = False
        self.stopped_by: str | None = None  # the stop string that ended the text
        self._prefix = 0  # ids[_prefix:_read] is the window of already-decoded tokens the next token is decoded in
        self._read = 0
        self._pending = ""  # decoded text of ids[_read:] not yet taken (it ends in an incomplete character)

    def push(self, token_ids: list[int]) -> int:
        """Add a step's tokens; return how many of them count (fewer when one completes a stop string)."""
        if not self.stop:  # nothing to find token by token: one windowed decode per step
            self._append(token_ids)
            return len(token_ids)
        for used, token in enumerate(token_ids, 1):
            self._append([token])
            found = self._stop_at()
            if found is not None:
                cut, self.stopped_by = found
                self.text, self.stopped = self.text[:cut], True
                return used
        return len(token_ids)

    def _append(self, token_ids: list[int]) -> None:
        self.ids += token_ids
        with self.lock:
            window = self.tokenizer.decode(self.ids[self._prefix : self._read], skip_special_tokens=self.skip_special)
            full = self.tokenizer.decode(self.ids[self._prefix :], skip_special_tokens=self.skip_special)
        new = full[len(window) :] if full.startswith(window) else full
        self._pending = new
        if new and not new.endswith(REPLACEMENT):
            self.text += new
            self._pending = ""
            self._prefix, self._read = self._read, len(self.ids)

    def _stop_at(self) -> tuple[int, str] | None:
        """(where the text ends, the stop string) for the first stop string in the text (it ends before it, or after
        it with `include_stop`), looking only where a new one can have appeared; None where there is none."""
        start = max(0, self.emitted - max(map(len, self.stop)))
        found = [(i, -len(s), s) for s in self.stop if (i := self.text.find(s, start)) >= 0]
        if not found:
            return None
        at, _, stop = min(found)  # the first; of stop strings found there, the longest
        return (at + len(stop) if self.include_stop else at), stop

    def release(self, final: bool = False) -> str:
        """The text that became final since the last call (all that is left, when `final`)."""
        if final and not self.stopped and self._pending:  # an incomplete character at the very end stays as U+FFFD
            self.text, self._pending = self.text + self._pending, ""
        end = len(self.text)
        if not final and not self.stopped:
            end -= self._held_back()
        delta = self.text[self.emitted : end]
        self.emitted = max(self.emitted, end)
        return delta

    def _held_back(self) -> int:
        """Characters at the end that may still change: a possible stop-string start."""
        text = self.text
        hold = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(text)), 0, -1):
                if text.endswith(s[:n]):
                    hold = max(hold, n)
                    break
        return hold
