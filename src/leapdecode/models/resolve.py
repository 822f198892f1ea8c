"""What `generate` and the Engine accept as a model: a name or path (loaded once per process and dtype, so a loop of
`generate("smollm2-135m", ...)` calls loads and prepares the model once), a LoadedModel, or an HF model with its
tokenizer."""

from __future__ import annotations

import pathlib
import threading

import torch

from ..errors import LeapDecodeError, require
from .loader import LoadedModel, load_model

_loaded: dict[tuple[str, str], LoadedModel] = {}
_lock = threading.Lock()


def resolve_model(model, tokenizer=None, dtype="float32") -> LoadedModel:
    """Accept a spec string, a LoadedModel, or an HF model with its tokenizer; return a LoadedModel. A spec string is
    loaded on its first use in this process (per dtype) and the same LoadedModel is returned afterwards."""
    if isinstance(model, LoadedModel):
        return model
    if isinstance(model, str):
        path = pathlib.Path(model).expanduser()
        key = (str(path.resolve()) if path.exists() else model.lower(), str(dtype).lower().removeprefix("torch."))
        with _lock:
            if key not in _loaded:
                _loaded[key] = load_model(model, dtype=dtype)
            return _loaded[key]
    if isinstance(model, torch.nn.Module):
        require(
            tokenizer is not None, "an already loaded model needs its tokenizer: generate(model, prompt, tokenizer=tok)"
        )
        name = getattr(model.config, "name_or_path", "") or type(model).__name__
        return LoadedModel(model=model.eval(), tokenizer=tokenizer, name=name, path=name)
    raise LeapDecodeError(f"model must be a name, a path, a LoadedModel or an HF model, got {type(model).__name__}")


def forget_models() -> None:
    """Drop the models loaded by name (their memory is freed once nothing else holds them)."""
    with _lock:
        _loaded.clear()
