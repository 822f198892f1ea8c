"""argparse value types shared by every command line of the package."""

from __future__ import annotations

import argparse


def number(text: str) -> float:
    """A float, `inf` included."""
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
