"""What differs across the transformers versions pyproject admits, in one place."""

from __future__ import annotations

import inspect

from transformers.masking_utils import create_causal_mask

# transformers 5.24 renamed the `past_key_values` argument of models, layers and mask builders to `cache` (the old
# name warns, and goes in 5.40); earlier 5.x releases know only `past_key_values`
CACHE_ARG = "cache" if "cache" in inspect.signature(create_causal_mask).parameters else "past_key_values"


def cache_arg(cache) -> dict:
    """Keyword arguments that hand `cache` to a model, a decoder layer or a mask builder."""
    return {CACHE_ARG: cache}
