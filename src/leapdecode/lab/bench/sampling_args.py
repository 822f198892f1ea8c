"""The sampling settings a benchmark's requests carry (`--temperature`, `--top-p`): the options, their check, and
the words a report gives them. Greedy by default: greedy outputs can be checked token for token."""

from __future__ import annotations

import argparse

from ...errors import require


def add_sampling_arguments(p: argparse.ArgumentParser, scope: str) -> None:
    """`scope`: what the options apply to, for the help text."""
    p.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help=f"{scope}: every request samples at this temperature (default 0: greedy; chat clients send 0.7-1)",
    )
    p.add_argument("--top-p", type=float, default=1.0, help=f"{scope}, with --temperature: nucleus sampling's top_p")


def check_sampling_arguments(args: argparse.Namespace) -> None:
    require(args.temperature >= 0, f"--temperature must be >= 0, got {args.temperature}")
    require(0 < args.top_p <= 1, f"--top-p must be in (0, 1], got {args.top_p}")
    require(args.temperature > 0 or args.top_p == 1, "--top-p goes with --temperature > 0")


def sampling_options(args) -> dict:
    """The request settings of `args` (temperature 0: greedy; top_p only where it filters)."""
    options = {"temperature": getattr(args, "temperature", 0.0)}
    if options["temperature"] and getattr(args, "top_p", 1.0) < 1:
        options["top_p"] = args.top_p
    return options


def sampling_words(args, seeds: str = "unseeded") -> str:
    """The run's sampling settings for its report; `seeds`: how its requests are seeded."""
    options = sampling_options(args)
    if not options["temperature"]:
        return "Greedy (temperature 0)"
    return f"Sampled ({seeds}): " + ", ".join(f"{k} {v}" for k, v in options.items())
