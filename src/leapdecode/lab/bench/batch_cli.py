"""The `bench-batch` command: parse, load, run every method at every concurrency, write the report."""

from __future__ import annotations

import argparse
import pathlib

from ...argtypes import number
from ...errors import require
from ...models.registry import DEFAULT_MODEL
from ..report_kit import environment, markdown_table, meta_lines
from .batch import (
    METHODS,
    _record,
    check_against,
    combine_repeats,
    engine_drafter,
    interleaved_runs,
    run_engine,
    run_hf_generate,
    run_hf_generate_batch,
    write_outputs,
)
from .cli import _ints, _names
from .methods import truncate_at_eos
from .peer_export import ensure_ir
from .peer_worker import peak_rss_mb
from .peers import BATCH_PEER_METHODS, check_available, describe_cb, run_cb
from .sampling_args import add_sampling_arguments, check_sampling_arguments, sampling_options, sampling_words


def cmd_bench_batch(args: argparse.Namespace) -> int:
    import torch
    from rich.console import Console
    from rich.progress import Progress

    from ...models import load_model
    from ...prompt import encode_prompt
    from .suites import load_suite

    methods = _names(args.methods) or [
        "hf-generate",
        "hf-generate-batch",
        "engine",
        "engine-prompt-lookup",
        "engine-ngram",
    ] + (["engine-draft-model"] if args.draft_model else [])
    unknown = [m for m in methods if m not in METHODS]
    require(not unknown, f"unknown method(s) {', '.join(unknown)}: choose from {', '.join(METHODS)}")
    require("engine-draft-model" not in methods or args.draft_model, "engine-draft-model needs --draft-model")
    if any(m in BATCH_PEER_METHODS for m in methods):
        check_available()  # one line naming the extra to install, before any model is loaded
    concurrency = _ints(args.concurrency, "--concurrency")
    require(args.repeats > 0, f"--repeats must be positive, got {args.repeats}")
    check_sampling_arguments(args)
    require(
        args.scenario == "paired" or args.temperature == 0,
        "--temperature goes with --scenario paired (the other scenarios compare with HF greedy)",
    )
    if args.threads is not None:
        require(args.threads > 0, f"--threads must be positive, got {args.threads}")
        torch.set_num_threads(args.threads)
    target = load_model(args.model, dtype=args.dtype)
    draft = load_model(args.draft_model, dtype=args.draft_dtype) if args.draft_model else None
    questions = load_suite(args.suite, _names(args.categories) or None, args.per_category)
    count = args.requests or max(concurrency)
    prompts = [encode_prompt(target.tokenizer, questions[i % len(questions)].turns[0]) for i in range(count)]
    warmup = [
        encode_prompt(target.tokenizer, questions[(count + i) % len(questions)].turns[0])
        for i in range(max(concurrency))
    ]  # the engine's untimed warm-up: the questions after the timed ones
    console = Console(stderr=True)
    if args.scenario != "throughput":
        return _scenario(args, target, questions, prompts, warmup, console)
    meta = {
        **environment(torch.get_num_threads()),
        "target model": target.name,
        "draft model": draft.name if draft else "none",
        "dtype": args.dtype,
        "workload": f"{count} requests (first turns of suite '{args.suite}', {len(questions)} questions, cycled), "
        f"greedy, max_new_tokens {args.max_new_tokens}, closed loop of C requests in flight; each "
        "engine first serves C other questions of the suite untimed (steady state)",
        "max batch tokens": args.max_batch_tokens,
        "max decode slowdown": args.max_decode_slowdown,
        "reference": "each request decoded alone by HF generate (greedy)",
        "repeats": f"{args.repeats} (interleaved: every method at one concurrency, then the next; the order of the "
        "methods rotates per repeat; tok/s is the median run, 'vs engine' the median of the per-repeat ratios, "
        "ranges in brackets)"
        if args.repeats > 1
        else "1",
    }
    notes: list[str] = []
    rows: list[dict] = []
    if any(m in BATCH_PEER_METHODS for m in methods):
        ensure_ir(target, console)  # the one-off conversion, before the progress bar
    runs = interleaved_runs(methods, concurrency, args.repeats)
    records: dict[tuple[str, int], list[dict | None]] = {}
    with Progress(console=console, disable=args.no_progress) as progress:
        task = progress.add_task("bench-batch", total=len(runs) + 1)
        reference = run_hf_generate(target, prompts, args.max_new_tokens)  # also warms every kernel up
        progress.advance(task)
        for method, c in runs:
            progress.update(task, description=f"{method} @ {c}")
            record = _run(method, c, target, draft, prompts, args, notes, warmup, console)
            if record is not None:
                record.setdefault("peak_rss_mb", peak_rss_mb())
                check_against(target, prompts, reference["tokens"], record)
            records.setdefault((method, c), []).append(record)
            progress.advance(task)
    for (method, c), row in combine_repeats(records).items():
        rows += [dict(row, method=method, concurrency=cc) for cc in (concurrency if method == "hf-generate" else [c])]
    notes.append(
        "peak RSS: peak resident memory (VmHWM) of the process that ran the method: the bench process for HF's and leapdecode's methods "
        "(one process, so it includes everything that ran before), a fresh process per run for a peer"
    )
    paths = write_outputs(pathlib.Path(args.out), meta, rows, notes)
    for r in rows:
        console.print(
            f"  {r['method']:<22} C={r['concurrency']:<3} {r['output_tok_s']:8.2f} tok/s  "
            f"identical {r['identical']}/{len(r['tokens'])}"
        )
    for note in notes:
        console.print(f"[yellow]note:[/] {note}")
    console.print("wrote " + ", ".join(map(str, paths)))
    ours = [r for r in rows if r["method"] not in BATCH_PEER_METHODS]  # a peer that differs is shown, never fails us
    return 3 if args.fail_on_mismatch and any(r["mismatches"] for r in ours) else 0


def _scenario(args, target, questions, prompts, warmup, console) -> int:
    """`--scenario prefill-stall | prefix-reuse | paired`: one table in report.md and results.json."""
    import json

    import torch

    from .batch_scenarios import long_prompt, paired, prefill_stall, prefix_reuse

    texts = [q.turns[0] for q in questions]
    if args.scenario == "paired":
        methods = _names(args.methods) or ["engine", "engine-head"]
        require(
            methods[0] == "engine" and all(m.startswith("engine-") for m in methods[1:]),
            f"--scenario paired compares engine methods with `engine` first, got {', '.join(methods)}",
        )
        require("engine-draft-model" not in methods, "--scenario paired does not run engine-draft-model")
        sampling = sampling_options(args) if args.temperature else None
        # greedy outputs are checked against HF's (which also warms every kernel up); sampled ones against `engine`'s
        reference = None if sampling else run_hf_generate(target, prompts, args.max_new_tokens)["tokens"]
        concurrency = _ints(args.concurrency, "--concurrency")
        table = paired(
            target,
            prompts,
            methods,
            concurrency,
            args.max_new_tokens,
            args.max_batch_tokens,
            warmup,
            reference,
            args.max_decode_slowdown,
            sampling,
        )
        how = sampling_words(args, "each request seeded by its index") if sampling else "greedy"
        settings = (
            f"{len(prompts)} requests (first turns of suite '{args.suite}'), max_new_tokens {args.max_new_tokens}, "
            f"max batch tokens {args.max_batch_tokens}, max decode slowdown {args.max_decode_slowdown}, {how}; "
            "per concurrency C one engine per method, warmed up on C other questions, the requests in slices of 2 x C, "
            "each slice run by every method in turn (closed loop of C, order rotated per slice); a second plain engine runs every slice as the A/A control (the "
            "ratios two identical engines read); intervals: ~95 % over the per-slice ratios (t on their logs)"
        )
    else:
        if args.scenario == "prefill-stall":
            long = long_prompt(target.tokenizer, texts, args.long_prompt_tokens)
            table = prefill_stall(target, prompts, long, args.streams, args.max_new_tokens, args.max_batch_tokens)
        else:
            prefix = long_prompt(target.tokenizer, texts, args.prefix_tokens)
            table = {"engine": prefix_reuse(target, prefix, prompts[:2])}
        settings = (
            f"streams {args.streams}, long prompt {args.long_prompt_tokens} tokens, prefix {args.prefix_tokens} "
            f"tokens, max_new_tokens {args.max_new_tokens}, max batch tokens {args.max_batch_tokens}, greedy"
        )
    meta = {
        **environment(torch.get_num_threads()),
        "target model": target.name,
        "scenario": args.scenario,
        "settings": settings,
    }
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"meta": meta, "table": table}, indent=2))
    columns = list(next(iter(table.values())))
    lines = [
        f"# leapdecode bench-batch --scenario {args.scenario}",
        "",
        *meta_lines(meta),
        "",
        *markdown_table(
            ["run", *columns], [[label, *(_cell(row[c]) for c in columns)] for label, row in table.items()]
        ),
    ]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    console.print("\n".join(lines[-len(table) - 2 :]))
    console.print(f"wrote {out / 'results.json'}, {out / 'report.md'}")
    return 0


def _cell(value) -> str:
    if isinstance(value, list):
        return "–".join(f"{v:.3f}" for v in value)
    return "–" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)


def _run(method: str, c: int, target, draft, prompts, args, notes: list[str], warmup=(), console=None) -> dict | None:
    if method == "openvino-cb":
        import torch

        answer, info = run_cb(
            target,
            prompts,
            c,
            args.max_new_tokens,
            threads=torch.get_num_threads(),
            max_batch_tokens=args.max_batch_tokens,
            warmup=warmup,
            console=console,
        )
        note = describe_cb(info, args.max_batch_tokens)
        if note not in notes:
            notes.append(note)
        tokens = [truncate_at_eos(t, target.eos_token_ids) for t in answer["tokens"]]
        record = _record(tokens, answer["sent"], answer["first"], answer["end"], answer["wall"], {})
        return dict(record, peak_rss_mb=answer["peak_rss_mb"])
    if method == "hf-generate":
        return run_hf_generate(target, prompts, args.max_new_tokens)
    if method == "hf-generate-batch":
        try:
            return run_hf_generate_batch(target, prompts, c, args.max_new_tokens, args.max_batch_tokens)
        except Exception as error:  # noqa: BLE001 - HF's engine may not run on this CPU/model: say why, go on
            notes.append(f"hf-generate-batch @ {c} did not run: {type(error).__name__}: {str(error).splitlines()[0]}")
            return None
    return run_engine(
        target,
        prompts,
        c,
        args.max_new_tokens,
        drafter=engine_drafter(method),
        draft=draft,
        warmup=warmup,
        max_batch_tokens=args.max_batch_tokens,
        max_decode_slowdown=args.max_decode_slowdown,
        packed_weights=not args.hf_kernels,
    )


def register(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "bench-batch", help="offline throughput/latency of many requests at once", description=__doc__
    )
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--draft-model", help="draft model for engine-draft-model (same tokenizer)")
    p.add_argument("--methods", help=f"comma-separated, from {', '.join(METHODS)}")
    p.add_argument("--concurrency", default="1,4,16,32", help="requests in flight, comma-separated")
    p.add_argument("--requests", type=int, help="requests per run (default: the largest concurrency)")
    p.add_argument("--suite", default="dev", help="quick | dev | heldout | PATH.jsonl")
    p.add_argument("--categories", help="comma-separated subset of the suite's categories")
    p.add_argument("--per-category", type=int)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--max-batch-tokens", type=int, default=256)
    p.add_argument(
        "--max-decode-slowdown",
        type=number,
        default=float("inf"),
        help="the engine's bound on how much dearer than a decode-only step a step reading prompts may get (as serve)",
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="timed runs of every method at every concurrency, interleaved (median and range reported; "
        "hf-generate runs once)",
    )
    p.add_argument("--dtype", default="float32", help="float32 | bfloat16 | float16 | q4 (all methods, peers included)")
    p.add_argument("--draft-dtype", default="int8")
    p.add_argument("--hf-kernels", action="store_true", help="the engine uses HF's forward and F.linear too")
    p.add_argument("--threads", type=int)
    p.add_argument("--no-progress", action="store_true")
    p.add_argument(
        "--scenario",
        default="throughput",
        choices=("throughput", "prefill-stall", "prefix-reuse", "paired"),
        help="throughput (default): methods x concurrency; prefill-stall: decoding streams while a long "
        "prompt arrives, chunked or not; prefix-reuse: TTFT with a shared prefix, cold and warm; paired: engine "
        "methods interleaved slice by slice on engines built once (ratios a drifting host cannot move)",
    )
    p.add_argument("--streams", type=int, default=8, help="prefill-stall: decoding streams")
    p.add_argument("--long-prompt-tokens", type=int, default=4000, help="prefill-stall: tokens of the long prompt")
    p.add_argument("--prefix-tokens", type=int, default=1000, help="prefix-reuse: tokens of the shared prefix")
    add_sampling_arguments(p, "--scenario paired, each request seeded by its index")
    p.add_argument("--fail-on-mismatch", action="store_true", help="exit 3 if an output differs from solo greedy")
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_bench_batch)
    return p
