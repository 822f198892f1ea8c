"""`leapdecode` command line: generate, models, bench, bench-kv, dllm."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import sys

from .argtypes import integer as _int
from .errors import LeapDecodeError, require
from .models.registry import DEFAULT_MODEL


def add_generate(sub) -> None:
    from .drafters import DRAFTERS

    p = sub.add_parser("generate", help="generate text with speculative decoding")
    p.add_argument("prompt", help="the user message (chat template applied unless --raw); '-' reads standard input")
    p.add_argument(
        "--model", default=DEFAULT_MODEL, help="packaged name, local HF directory, .gguf file or cached hub id"
    )
    p.add_argument(
        "--drafter",
        default="auto",
        choices=("auto", *DRAFTERS),
        help="auto (default): the model's shipped draft head if it has one, else prompt-lookup",
    )
    p.add_argument("--draft-model", help="the draft model for --drafter draft-model (same tokenizer as --model)")
    p.add_argument("--head", help="draft head directory for --drafter head (default: the model's shipped head)")
    p.add_argument("--max-new-tokens", type=_int, default=256)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (lossless against plain greedy)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=_int, default=0)
    p.add_argument("--seed", type=_int)
    p.add_argument("--repetition-penalty", type=float, default=1.0, help="> 1 discourages tokens already seen (HF's)")
    p.add_argument("--frequency-penalty", type=float, default=0.0, help="in [-2, 2], per occurrence (OpenAI's)")
    p.add_argument("--presence-penalty", type=float, default=0.0, help="in [-2, 2], once per token seen (OpenAI's)")
    p.add_argument("--stop", action="append", help="end the answer before this text (repeat the option for several)")
    shape = p.add_mutually_exclusive_group()
    shape.add_argument("--json-schema", help="the answer follows this JSON schema (a file, or the schema's text)")
    shape.add_argument("--json-object", action="store_true", help="the answer is a JSON object")
    shape.add_argument("--regex", help="the answer matches this regular expression (Rust syntax: \\d is Unicode's)")
    shape.add_argument("--choice", action="append", help="the answer is one of these strings (repeat the option)")
    p.add_argument(
        "--dtype",
        default="float32",
        help="float32, bfloat16, float16, or q4 (4-bit weights in groups of 32, int8 output head, bf16 products)",
    )
    p.add_argument(
        "--draft-dtype",
        default="int8",
        help="dtype of --draft-model: int8 (default), bfloat16, float32 (never changes the output)",
    )
    p.add_argument("--draft-length", type=_int, default=4, help="initial draft length k")
    p.add_argument("--max-draft-length", type=_int, default=16)
    p.add_argument("--fixed-draft-length", action="store_true", help="keep k fixed instead of adapting it online")
    p.add_argument("--kv-press", help="compress the prompt's KV cache: " + _press_names())
    p.add_argument("--kv-budget", type=float, default=1.0, help="fraction of the prompt's KV entries to keep (0, 1]")
    p.add_argument("--raw", action="store_true", help="send the prompt as is, without the chat template")
    p.add_argument("--chat-template", help="render the prompt with this Jinja template (a file, or the text)")
    p.add_argument(
        "--suffix", help="the text after the answer: a code model fills in the middle between the prompt and this"
    )
    p.add_argument(
        "--hf-kernels", action="store_true", help="HF's forward and F.linear instead of leapdecode's kernels (slower)"
    )
    p.add_argument(
        "--prediction",
        help="a file whose text the answer will largely repeat (e.g. code to edit): drafts copy it (OpenAI's "
        "Predicted Outputs); the answer is unchanged",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")
    p.set_defaults(func=run_generate)


def _press_names() -> str:
    from .kv import KV_PRESSES

    return ", ".join(KV_PRESSES)


def run_generate(args) -> int:
    from rich.console import Console

    from .models import resolve_model
    from .prompt import read_chat_template, with_chat_template
    from .text import TextStream

    require(not args.head or args.drafter == "head", "--head goes with --drafter head")
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    target = resolve_model(args.model, dtype=args.dtype)
    if args.chat_template:
        template = read_chat_template(args.chat_template)
        target = dataclasses.replace(target, tokenizer=with_chat_template(target.tokenizer, template))
    if args.suffix is not None:
        from .prompt import fill_in_the_middle

        prompt = fill_in_the_middle(target.tokenizer, prompt, args.suffix)
    press = None
    if args.kv_press:
        from .kv import make_press

        press = make_press(args.kv_press, budget=args.kv_budget)
    # the answer's text as it becomes final (the same stop strings as generate's: nothing past one is printed)
    streamer = None if args.json else TextStream(target.tokenizer, args.stop or ())
    # the one-off work before the first token (kernels measured once per host, weights encoded once per process) as a
    # transient line on a terminal, gone at the first token or an error (which then stays the only line printed)
    waiting = Console(stderr=True, quiet=args.json).status(
        f"{target.name}: preparing kernels (once), then the first token …"
    )
    waiting.start()

    def stream(ids):
        waiting.stop()
        streamer.push(ids)
        print(streamer.release(), end="", flush=True)

    try:
        result = _generate(args, target, prompt, press, None if streamer is None else stream)
    finally:
        waiting.stop()
    if args.json:
        print(json.dumps(result.as_dict()))
        return 0
    print(streamer.release(final=True), flush=True)
    s = result.stats
    print(
        f"[{result.model} · {result.drafter}] {s.new_tokens} tokens in {s.total_time:.2f} s = "
        f"{s.tokens_per_second:.1f} tok/s · {s.forward_passes} forward passes · "
        f"{s.mean_accepted_tokens:.2f} tokens/forward · first token {s.time_to_first_token * 1000:.0f} ms"
        + (
            f" · {s.accepted_prediction_tokens} of {s.prediction_tokens} prediction tokens followed"
            if s.prediction_tokens
            else ""
        ),
        file=sys.stderr,
    )
    return 0


def _generate(args, target, prompt, press, stream):
    from .api import generate

    return generate(
        target,
        prompt,
        drafter=args.drafter,
        draft_model=args.draft_model,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
        repetition_penalty=args.repetition_penalty,
        frequency_penalty=args.frequency_penalty,
        presence_penalty=args.presence_penalty,
        stop=args.stop,
        structured_output=_structured(args),
        raw=args.raw,
        dtype=args.dtype,
        draft_dtype=args.draft_dtype,
        draft_length=args.draft_length,
        max_draft_length=args.max_draft_length,
        adaptive_draft_length=not args.fixed_draft_length,
        kv_press=press,
        packed_weights=not args.hf_kernels,
        drafter_options={"head": args.head} if args.head else None,
        stream=stream,
        prediction=_read_text(args.prediction, "--prediction") if args.prediction else None,
    )


def _read_text(path: str, option: str) -> str:
    try:
        return pathlib.Path(path).read_text()
    except (OSError, UnicodeDecodeError) as e:
        why = getattr(e, "strerror", None) or e
        raise LeapDecodeError(f"{option}: cannot read {path}: {why}") from None


def _structured(args) -> dict | None:
    """--json-schema / --json-object / --regex / --choice as RequestParams.structured_output."""
    if args.json_schema is not None:
        path = pathlib.Path(args.json_schema)
        is_file = len(args.json_schema) < 4096 and not args.json_schema.lstrip().startswith("{") and path.is_file()
        return {"json": path.read_text() if is_file else args.json_schema}
    if args.json_object:
        return {"json_object": True}
    if args.regex is not None:
        return {"regex": args.regex}
    return {"choice": args.choice} if args.choice else None


def add_models(sub) -> None:
    p = sub.add_parser("models", help="list or pull the packaged models")
    msub = p.add_subparsers(dest="models_command", required=True)
    msub.add_parser("list", help="packaged models and whether they are cached").set_defaults(func=run_models_list)
    pull = msub.add_parser("pull", help="download, verify and convert a packaged model into the cache")
    pull.add_argument("name")
    pull.set_defaults(func=run_models_pull)


def run_models_list(args) -> int:
    from rich.console import Console
    from rich.table import Table

    from .models import cache_dir, list_models

    table = Table(title=f"packaged models (cache: {cache_dir()})")
    for column in ("name", "packages", "GGUF bytes", "cached"):
        table.add_column(column)
    for m in list_models():
        table.add_row(m["name"], m["packages"], f"{m['bytes']:,}", "yes" if m["cached"] else "no")
    Console().print(table)
    return 0


def run_models_pull(args) -> int:
    from .models import pull_model

    print(pull_model(args.name))
    return 0


def build_parser() -> argparse.ArgumentParser:
    from . import __version__
    from .lab.bench import batch_cli
    from .lab.bench import cli as bench_cli
    from .lab.diffusion import cli as dllm_cli
    from .lab.heads import cli as heads_cli
    from .lab.kv import cli as kv_cli
    from .serve import cli as serve_cli

    parser = argparse.ArgumentParser(prog="leapdecode", description=__doc__)
    parser.add_argument("--version", action="version", version=f"leapdecode {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    add_generate(sub)
    add_models(sub)
    from .lab.bench import serve as bench_serve_cli

    for module in (bench_cli, batch_cli, kv_cli, dllm_cli, heads_cli, serve_cli, bench_serve_cli):
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    # the command line's own process: transformers' progress chatter off unless the user set a level (the loader
    # never reaches for the hub, see models.loader: no offline switch is needed)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except LeapDecodeError as error:
        print(f"leapdecode: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("leapdecode: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
