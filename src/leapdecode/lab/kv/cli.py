"""`leapdecode bench-kv`: KV presses against the full cache on long prompts (needles and documents).

`register(subparsers)` adds the command to the main CLI (it sets `func`, called as `args.func(args)`, returning an
exit code)."""

from __future__ import annotations

import argparse
import pathlib

from ...errors import require
from ...models.registry import DEFAULT_MODEL


def _list(kind):
    def parse(value: str):
        try:
            return [kind(v) for v in value.split(",") if v.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected a comma-separated list of {kind.__name__}s, got '{value}'"
            ) from None

    return parse


def cmd_bench_kv(args: argparse.Namespace) -> int:
    from ...kv import KV_PRESSES
    from .bench import BenchSettings, parse_press, run_bench
    from .report import write

    presses = [p for p in args.presses.split(",") if p.strip()] if args.presses else list(KV_PRESSES)
    for spec in presses:
        name = parse_press(spec)[1]
        require(name in KV_PRESSES, f"unknown KV press '{name}'; choose from: {', '.join(KV_PRESSES)}")
    require(args.answer_tokens >= 6, "--answer-tokens must be at least 6 (a space and five digits)")
    require(args.continuation >= 2, "--continuation must be at least 2 tokens")
    settings = BenchSettings(
        model=args.model,
        presses=presses,
        budgets=args.budgets,
        lengths=args.lengths,
        needles=args.needles,
        documents=args.documents,
        answer_tokens=args.answer_tokens,
        continuation=args.continuation,
        dtype=args.dtype,
        seed=args.seed,
        threads=args.threads,
    )
    result = run_bench(settings, log=lambda line: print(line, flush=True))
    for path in write(result, pathlib.Path(args.out)):
        print(f"wrote {path}")
    return 0


def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "bench-kv",
        help="KV presses vs the full cache: prefill time, decode tok/s, KV bytes, "
        "needle accuracy and greedy agreement on long prompts",
    )
    p.add_argument("--model", default=DEFAULT_MODEL, help=f"model name or path (default: {DEFAULT_MODEL})")
    p.add_argument(
        "--presses",
        default=None,
        help="comma-separated presses, each NAME or NAME:key=value:... (e.g. fastkv:tsp_layer=9); "
        "default: all of streaming-llm, snapkv, quantized, fastkv",
    )
    p.add_argument(
        "--budgets",
        type=_list(float),
        default=[0.5, 0.25],
        help="KV budgets in (0, 1], comma-separated (default 0.5,0.25)",
    )
    p.add_argument(
        "--lengths",
        type=_list(int),
        default=[1024, 2048, 4096, 8192],
        help="prompt lengths in tokens (default 1024,2048,4096,8192; capped by the model's context)",
    )
    p.add_argument("--needles", type=int, default=4, help="needle prompts per length, depths spread evenly (default 4)")
    p.add_argument(
        "--documents", type=int, default=1, help="long documents per length for greedy agreement (default 1)"
    )
    p.add_argument("--answer-tokens", type=int, default=8, help="greedy tokens for a needle answer (default 8)")
    p.add_argument("--continuation", type=int, default=32, help="greedy continuation tokens per document (default 32)")
    p.add_argument("--dtype", default="float32", help="model dtype (default float32)")
    p.add_argument("--seed", type=int, default=0, help="seed of the generated prompts (default 0)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--out", default="bench-kv-out", help="output directory (default bench-kv-out)")
    p.set_defaults(func=cmd_bench_kv)
    return p
