"""leapdecode: faster generation for Hugging Face language models, lossless where it promises to be."""

from .api import generate
from .errors import LeapDecodeError
from .params import DraftConfig, RequestParams
from .stats import GenerationResult
from .version import __version__

__all__ = [
    "generate",
    "Engine",
    "GenerationResult",
    "RequestParams",
    "DraftConfig",
    "LeapDecodeError",
    "load_model",
    "__version__",
]


def __getattr__(name):
    if name == "load_model":
        from .models import load_model

        return load_model
    if name == "Engine":
        from .engine import Engine

        return Engine
    raise AttributeError(name)
