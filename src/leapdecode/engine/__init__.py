"""Many requests at once: continuous batching, chunked prefill, prefix cache, load-aware batch speculation."""

from .engine import Engine
from .request import RequestOutput
from .scheduler import SchedulerConfig, StepPlan

__all__ = ["Engine", "RequestOutput", "SchedulerConfig", "StepPlan"]
