"""What every benchmark report shares: the machine/versions header, Markdown tables and "- **key**: value" lines,
and a headless matplotlib.

`bench`, `bench-batch`, `bench-kv` and `dllm bench` each write results.json-style data and a report.md. The pieces
that say which machine and software produced the numbers, and how a table is drawn, live here once so the stacks
describe a run the same way and cannot drift apart. This module sits below bench/, kv/ and diffusion/ and imports
none of them, so each can use it without importing the others.
"""

from __future__ import annotations

import os
import platform
import sys

import torch

from ..host import other_load, oversubscribed  # noqa: F401 - the lab reads them from here too
from ..kernels import decoder_ops, decoder_step, native_linear, segment_attention

CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile")  # the flags that decide which CPU kernels torch can use

_ALIGN = {"-": "---", "l": ":---", "r": "---:", "c": ":---:"}


def cpu_model() -> str:
    """The CPU's marketing name from /proc/cpuinfo; `platform` (often only the architecture) where that is absent."""
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_flags() -> str:
    """Which of CPU_FLAGS this CPU reports, space-separated ("" where /proc/cpuinfo is absent)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            words = set(next(line for line in f if line.startswith("flags")).split())
    except (OSError, StopIteration):
        return ""
    return " ".join(flag for flag in CPU_FLAGS if flag in words)


def machine() -> str:
    """One line: CPU model, torch's CPU capability and the relevant flags, logical CPU count, operating system."""
    flags = cpu_flags()
    return (
        f"{cpu_model()} ({torch.backends.cpu.get_cpu_capability()}{'; ' + flags if flags else ''}), "
        f"{os.cpu_count()} logical CPUs, {platform.system()} {platform.release()}"
    )


def versions() -> str:
    """Versions of the software that shapes the timings: python, torch, transformers, leapdecode."""
    import transformers  # imported when a report is written, not when leapdecode is

    from ..version import __version__

    return (
        f"python {platform.python_version()}, torch {torch.__version__}, transformers {transformers.__version__}, "
        f"leapdecode {__version__}"
    )


def command() -> str:
    """The command line that produced the report, as the user would retype it."""
    return " ".join(["leapdecode", *sys.argv[1:]]) if sys.argv else ""


def environment(threads: int | None = None) -> dict:
    """The header every report starts with: machine, torch threads (default: torch's current count), versions,
    command. A report adds its own keys (model, dtype, workload) after these."""
    return {
        "machine": machine(),
        "torch threads": torch.get_num_threads() if threads is None else threads,
        "attention": segment_attention.describe(),
        "linear layers": native_linear.describe(),
        "norms, rotary, activation": decoder_ops.describe(),
        "decoder step": decoder_step.describe(),
        "versions": versions(),
        "command": command(),
    }


def meta_lines(meta: dict) -> list[str]:
    """A Markdown bullet per item: "- **key**: value"."""
    return [f"- **{k}**: {v}" for k, v in meta.items()]


def _row(cells) -> str:
    return "|" + "|".join(f" {c} " if str(c) else " " for c in cells) + "|"


def markdown_table(header: list[str], rows: list[list], align: str = "-r") -> list[str]:
    """A Markdown table as lines: header, separator, one line per row (cells through str()).

    `align` has one code per column: "-" default, "l" left, "r" right, "c" centre; its last code repeats for the
    remaining columns, so the default "-r" is a label column followed by numbers."""
    codes = [align[min(i, len(align) - 1)] for i in range(len(header))]
    return [_row(header), "|" + "|".join(_ALIGN[c] for c in codes) + "|", *(_row(r) for r in rows)]


def pyplot():
    """matplotlib.pyplot on the Agg backend: reports are written on machines without a display."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
