"""`leapdecode bench`: measure decoding methods on a Spec-Bench-format suite.

`register(subparsers)` adds the `bench` command to the main CLI (it sets `func` to `cmd_bench(args)`, which returns an
exit code).
"""

from __future__ import annotations

import argparse

from ...errors import LeapDecodeError, require
from ...models.registry import DEFAULT_MODEL
from .methods import METHODS, NEEDS_DRAFT_MODEL, SWEEPABLE, parse_methods
from .peers import PEER_METHODS

DEFAULTS = {"quick": {"max_new_tokens": 32, "repeats": 1}, "other": {"max_new_tokens": 128, "repeats": 3}}


def _ints(value: str, flag: str) -> list[int]:
    try:
        out = [int(x) for x in value.split(",") if x.strip()]
    except ValueError:
        raise LeapDecodeError(f"{flag} takes comma-separated integers, e.g. 2,4,8; got '{value}'") from None
    require(out and all(k > 0 for k in out), f"{flag} takes positive integers, got '{value}'")
    return out


def _names(value: str | None) -> list[str]:
    return [x.strip() for x in (value or "").split(",") if x.strip()]


def _busy() -> str:
    """A hint when other processes already load the CPUs (oversubscribed torch threads make timings erratic)."""
    import os

    import torch

    from ..report_kit import other_load, oversubscribed

    threads, load = torch.get_num_threads(), other_load()
    if not oversubscribed(load, threads):
        return ""
    return (
        f"{load:g} other tasks running on {os.cpu_count()} CPUs with {threads} torch thread(s): timings will be noisy"
        + ("; --threads 1 is steadier on a shared machine" if threads > 1 else "")
    )


def default_methods(has_draft: bool, has_head: bool) -> str:
    return ",".join(m for m in METHODS if (has_draft or m not in NEEDS_DRAFT_MODEL) and (has_head or m != "head"))


def cmd_bench(args: argparse.Namespace) -> int:
    import torch

    from ...heads.model import has_shipped_head
    from ...models import load_model
    from .run import run_benchmark
    from .runner import BenchConfig
    from .suites import load_suite

    has_head = args.head is not None or has_shipped_head(args.model)
    methods = parse_methods(
        args.methods or default_methods(args.draft_model is not None, has_head), args.draft_model is not None
    )
    questions = load_suite(args.suite, _names(args.categories) or None, args.per_category)
    defaults = DEFAULTS["quick" if args.suite == "quick" else "other"]
    if args.threads is not None:
        require(args.threads > 0, f"--threads must be positive, got {args.threads}")
        torch.set_num_threads(args.threads)
    cfg = BenchConfig(
        methods=methods,
        max_new_tokens=args.max_new_tokens or defaults["max_new_tokens"],
        repeats=args.repeats or defaults["repeats"],
        draft_lengths=_ints(args.draft_lengths, "--draft-lengths"),
        sweep=_names(args.sweep),
        warmup=not args.no_warmup,
        draft_length=args.draft_length,
        max_draft_length=args.max_draft_length,
        hf_prompt_lookup_tokens=args.hf_prompt_lookup_tokens,
        packed_weights=not args.hf_kernels,
        head=args.head,
    )
    target = load_model(args.model, dtype=args.dtype)
    draft = load_model(args.draft_model, dtype=args.draft_dtype) if args.draft_model else None
    if draft is not None:
        from ...drafters.factory import same_tokenizer

        require(
            same_tokenizer(draft.tokenizer, target.tokenizer),
            f"draft model '{draft.name}' uses a different tokenizer from '{target.name}'",
        )
    from rich.console import Console

    console = Console(stderr=True)
    busy = _busy()
    if busy:
        console.print(f"[yellow]note:[/] {busy}")
    result = run_benchmark(
        target, questions, cfg, args.out, draft=draft, suite=args.suite, progress=not args.no_progress, console=console
    )
    s = result.summary
    if cfg.packed_weights:
        from ...kernels import describe_kernels

        console.print("kernels chosen (layer shape, dtype x layers: path per row count):")
        for line in describe_kernels(target.model):
            console.print(f"  {line}", highlight=False)
    overall = s["groups"]["overall"]
    for label, row in overall.items():
        if "@" in label and label != s["oracle_best"]:
            continue
        speed = "" if row["speedup"] is None else f"  {row['speedup']:.2f}×"
        per_forward = "   –" if row["mean_accepted_tokens"] is None else f"{row['mean_accepted_tokens']:.2f}"
        rss = "" if row.get("peak_rss_mb") is None else f"  peak RSS {row['peak_rss_mb']:.0f} MiB"
        console.print(
            f"  {label:<22} {row['tokens_per_second']:7.2f} tok/s{speed}  "
            f"{per_forward} tok/forward  identical {100 * row['identical_share']:.0f} %{rss}",
            soft_wrap=True,
        )
    if s["mismatched_outputs"]:
        console.print(
            f"[bold red]MISMATCH: {s['mismatched_outputs']} of {s['outputs']} outputs differ from greedy "
            f"— see the top of {result.report}[/]"
        )
    if s.get("peer_mismatched_outputs"):
        console.print(
            f"[yellow]peers: {s['peer_mismatched_outputs']} of {s['peer_outputs']} outputs differ from greedy "
            f"— see {result.report}[/]"
        )
    console.print(f"wrote {result.results}, {result.report}" + "".join(f", {p}" for p in result.plots))
    return 3 if s["mismatched_outputs"] and args.fail_on_mismatch else 0


def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "bench",
        help="benchmark decoding methods (tokens/s, speedup, acceptance, losslessness)",
        description="Measure decoding methods on a suite in the Spec-Bench question format; "
        "write results.json, report.md and PNG plots to --out.",
    )
    p.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help=f"target model: packaged name, directory, .gguf or cached hub id (default: {DEFAULT_MODEL})",
    )
    p.add_argument("--draft-model", help="draft model for hf-assisted and draft-model (same tokenizer)")
    p.add_argument(
        "--methods",
        help=f"comma-separated, from {', '.join(METHODS)} (default: all that apply), and the optional peers "
        f"{', '.join(PEER_METHODS)} (OpenVINO GenAI: pip install 'leapdecode[peers]')",
    )
    p.add_argument(
        "--suite",
        default="quick",
        help="quick | dev | heldout | dev-v1 | PATH.jsonl (Spec-Bench question format); a comma-separated "
        "list (dev,heldout) runs them as one and reports the splits side by side",
    )
    p.add_argument("--categories", help="comma-separated subset of the suite's categories")
    p.add_argument("--per-category", type=int, help="only the first N questions of each category")
    p.add_argument("--max-new-tokens", type=int, help="default: 32 for quick, 128 otherwise")
    p.add_argument("--repeats", type=int, help="timed runs per method and turn (median); default: 1 quick, 3 otherwise")
    p.add_argument("--draft-lengths", default="4,8,16", help="fixed draft lengths for the oracle and --sweep methods")
    p.add_argument("--sweep", help=f"methods also run at each --draft-lengths value, from {', '.join(SWEEPABLE[:-1])}")
    p.add_argument("--draft-length", type=int, default=4, help="initial draft length of the adaptive drafters")
    p.add_argument("--max-draft-length", type=int, default=16)
    p.add_argument("--head", help="draft head directory for method head (default: the target's shipped head)")
    p.add_argument("--hf-prompt-lookup-tokens", type=int, default=10, help="HF prompt_lookup_num_tokens")
    p.add_argument("--dtype", default="float32", help="float32 | bfloat16 | float16 | q4 (all methods, peers included)")
    p.add_argument(
        "--draft-dtype",
        default="int8",
        help="draft model dtype for hf-assisted and draft-model (int8, bfloat16, float32)",
    )
    p.add_argument(
        "--hf-kernels",
        action="store_true",
        help="leapdecode methods use HF's forward and F.linear too (default: fused decoder, kernels calibrated per host)",
    )
    p.add_argument("--threads", type=int, help="torch threads for all methods (default: torch's choice)")
    p.add_argument("--no-warmup", action="store_true", help="skip the untimed warm-up run of every method")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--fail-on-mismatch", action="store_true", help="exit with status 3 if any output differs from greedy"
    )
    p.add_argument("--out", required=True, help="output directory (results.json, report.md, *.png)")
    p.set_defaults(func=cmd_bench)
    return p
