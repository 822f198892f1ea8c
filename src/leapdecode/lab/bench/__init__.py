"""Benchmark of decoding methods on Spec-Bench-format suites: `leapdecode bench` (see `cli.py`), or
`run_benchmark(loaded_model, load_suite("quick"), BenchConfig(methods=[...]), out_dir)` from Python."""

from .run import run_benchmark
from .runner import BenchConfig
from .suites import load_suite

__all__ = ["BenchConfig", "load_suite", "run_benchmark"]
