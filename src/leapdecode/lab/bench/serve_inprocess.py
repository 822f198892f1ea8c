"""The engine without HTTP, on bench-serve's own load: what serving costs, measured in the same run.

`bench-serve --compare leapdecode` measures `leapdecode serve` through HTTP with the `openai` client. After the
servers have stopped, this runs the same prompts (same order, the same chat messages, max tokens and closed loop of C
requests in flight, level after level) through an Engine built as `leapdecode serve --drafter none` builds it, warmed
up the same way, in a process of its own with the same threads. A server's rate over this one is what the serving path
costs: HTTP, the event loop, streaming, and the client process sharing the cores."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

LABEL = "leapdecode engine in process (no HTTP; speculation off)"


def run(model_dir: str, args, say=print) -> dict:
    """The in-process result for the report ({label, peer, command, rows}, or an error), from a fresh process."""
    from .serve_common import _levels, load_prompts
    from .serve_peers import _thread_env

    prompts = load_prompts(args.suite)
    random.Random(args.seed).shuffle(prompts)  # bench_url's order; its first prompt is also the warm-up
    spec = {
        "model": model_dir,
        "prompts": prompts,
        "num_prompts": args.num_prompts,
        "levels": _levels(args.concurrency),
        "max_tokens": args.max_tokens,
        "threads": args.threads,
    }
    command = [sys.executable, "-m", __name__]
    base = {
        "label": LABEL,
        "peer": "in-process",
        "command": " ".join(command) + " < SPEC.json",  # the spec (prompts, levels, max tokens) on stdin
        "env": _thread_env(args.threads),
    }
    say(f"running {LABEL}")
    done = subprocess.run(
        command, input=json.dumps(spec), capture_output=True, text=True, env={**os.environ, **base["env"]}
    )
    if done.returncode != 0:
        return dict(base, error=f"failed: {(done.stderr.strip().splitlines() or ['no output'])[-1][:300]}", rows=[])
    return dict(base, rows=json.loads(done.stdout.strip().splitlines()[-1]))


def measure(spec: dict) -> list[dict]:
    """Rows in bench-serve's columns, one per level, from one Engine kept across levels (as a server is)."""
    import argparse

    import torch

    from ...engine import Engine
    from ...serve.cli import add_serve, engine_options
    from .batch import closed_loop

    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    parser = argparse.ArgumentParser()
    add_serve(parser.add_subparsers())  # `leapdecode serve`'s own defaults
    options = engine_options(parser.parse_args(["serve", "--model", spec["model"], "--drafter", "none"]))
    engine = Engine(spec["model"], **options)
    engine.warm_up()
    messages = [[{"role": "user", "content": p}] for p in spec["prompts"]]
    engine.generate_many(messages[:1], max_new_tokens=spec["max_tokens"])  # bench_url's warm-up request
    rows = []
    for c in spec["levels"]:
        chosen = [messages[i % len(messages)] for i in range(spec["num_prompts"])]
        record = closed_loop(engine, chosen, c, spec["max_tokens"])
        rows.append(
            {
                "concurrency": c,
                "requests": len(chosen),
                "completed": len(chosen) - record["failed"],
                "failed": record["failed"],
                "duration_s": round(record["wall"], 3),
                "output_tokens": record["output_tokens"],
                "output_tokens_per_s": round(record["output_tok_s"], 3),
                "requests_per_s": round(record["requests_s"], 4),
                **{
                    f"{name}_p{q}_ms": None
                    if record[f"{name}_p{q}"] is None
                    else round(1000 * record[f"{name}_p{q}"], 2)
                    for name in ("ttft", "e2e")
                    for q in (50, 99)
                },
            }
        )
    return rows


if __name__ == "__main__":
    print(json.dumps(measure(json.load(sys.stdin))))
