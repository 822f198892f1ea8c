"""leapdecode: faster generation for Hugging Face language models, lossless where it promises to be."""

from .api import GenerationResult, generate
from .errors import LeapDecodeError
from .version import __version__

__all__ = ["generate", "Engine", "GenerationResult", "LeapDecodeError", "load_model", "__version__"]


def __getattr__(name):
    if name == "load_model":
        from .models import load_model

        return load_model
    if name == "Engine":
        from .engine import Engine

        return Engine
    raise AttributeError(name)
