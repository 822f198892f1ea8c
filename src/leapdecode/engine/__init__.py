"""Many requests at once: continuous batching, chunked prefill, prefix cache, load-aware batch speculation."""

from .engine import Engine, RequestOutput

__all__ = ["Engine", "RequestOutput"]
