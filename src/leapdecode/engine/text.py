"""Incremental text of a request: new text per step, stop strings, and the token that completed a stop string.

Text is re-decoded from the request's tokens (a token's text can depend on its neighbours) and released only once
it is final: a tail that could still grow into a stop string is held back, and so is an incomplete UTF-8 character
(the tokenizer shows it as U+FFFD). A stop string ends the request at the token that completes it; the text never
contains it, which is what plain decoding followed by cutting at the stop string gives.
"""

from __future__ import annotations

import contextlib

REPLACEMENT = "\ufffd"


class TextStream:
    def __init__(self, tokenizer, stop: list[str], lock=None):
        self.tokenizer, self.stop = tokenizer, stop
        self.lock = lock or contextlib.nullcontext()  # held around every use of the (shared) tokenizer
        self.ids: list[int] = []
        self.text = ""  # the request's text so far, cut before a stop string once one is found
        self.emitted = 0  # characters of `text` already released
        self.stopped = False

    def push(self, token_ids: list[int]) -> int:
        """Add a step's tokens; return how many of them count (fewer when one completes a stop string)."""
        if not self.stop:  # nothing to find token by token: one decode per step
            self.ids += token_ids
            self.text = self._decode()
            return len(token_ids)
        for used, token in enumerate(token_ids, 1):
            self.ids.append(token)
            self.text = self._decode()
            cut = self._stop_at()
            if cut is not None:
                self.text, self.stopped = self.text[:cut], True
                return used
        return len(token_ids)

    def _decode(self) -> str:
        with self.lock:
            return self.tokenizer.decode(self.ids, skip_special_tokens=True)

    def _stop_at(self) -> int | None:
        """Index of the first stop string in the text, looking only where a new one can have appeared."""
        start = max(0, self.emitted - max(map(len, self.stop)))
        found = [i for i in (self.text.find(s, start) for s in self.stop) if i >= 0]
        return min(found) if found else None

    def release(self, final: bool = False) -> str:
        """The text that became final since the last call (all that is left, when `final`)."""
        end = len(self.text)
        if not final and not self.stopped:
            end -= self._held_back()
        delta = self.text[self.emitted : end]
        self.emitted = max(self.emitted, end)
        return delta

    def _held_back(self) -> int:
        """Characters at the end that may still change: an incomplete character, or a possible stop-string start."""
        text = self.text
        hold = len(text) - len(text.rstrip(REPLACEMENT))
        for s in self.stop:
            for n in range(min(len(s) - 1, len(text)), 0, -1):
                if text.endswith(s[:n]):
                    hold = max(hold, n)
                    break
        return hold
