"""KV-cache presses: compress the prompt's KV cache during prefill, one press per file (kvpress's convention).

    press = make_press("fastkv", budget=0.5, tsp_layer=11, tsp_rate=0.2)
    leapdecode.generate(model, prompt, kv_press=press)

`press.check(model)` raises LeapDecodeError for a model the press cannot run on (it is checked again in prefill).
"""

from __future__ import annotations

import inspect

from ..errors import LeapDecodeError
from .base import Press, check_budget, kv_bytes
from .fastkv import FastKVPress
from .quantized import QuantizedPress
from .snapkv import SnapKVPress
from .streaming_llm import StreamingLLMPress

_PRESSES = {cls.name: cls for cls in (StreamingLLMPress, SnapKVPress, QuantizedPress, FastKVPress)}
KV_PRESSES = tuple(_PRESSES)


def press_options(name: str) -> dict:
    """The keyword options a press takes, with their defaults (budget excluded)."""
    signature = inspect.signature(_PRESSES[name].__init__)
    return {k: p.default for k, p in signature.parameters.items() if k not in ("self", "budget")}


def make_press(name: str, *, budget: float = 1.0, **options) -> Press:
    """A press by name (one of KV_PRESSES) at `budget` (fraction of the prompt's KV entries, or bytes for
    'quantized', in (0, 1]); press-specific options as keywords, e.g. tsp_layer=, tsp_rate=, bits=, window=, sinks=."""
    if name not in _PRESSES:
        raise LeapDecodeError(f"unknown KV press '{name}'; choose one of: {', '.join(KV_PRESSES)}")
    check_budget(budget)
    allowed = press_options(name)
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise LeapDecodeError(
            f"KV press '{name}' has no option {', '.join(unknown)} (its options: {', '.join(allowed) or 'none'})"
        )
    return _PRESSES[name](budget=budget, **options)


__all__ = [
    "KV_PRESSES",
    "FastKVPress",
    "Press",
    "QuantizedPress",
    "SnapKVPress",
    "StreamingLLMPress",
    "kv_bytes",
    "make_press",
    "press_options",
]
