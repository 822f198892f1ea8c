"""The engine without HTTP, on bench-serve's own load: what serving costs, measured in the same run.

`bench-serve --compare leapdecode` measures `leapdecode serve` through HTTP with the `openai` client. After the
servers have stopped, this runs the same prompts (same order, the same chat messages, max tokens and closed loop of C
requests in flight, level after level, as many rounds) through an Engine built as `leapdecode serve --drafter none`
builds it, warmed up the same way, in a process of its own with the same threads. A server's rate over this one is
what the serving path costs: HTTP, the event loop, streaming, and the client process sharing the cores."""

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
        "rounds": getattr(args, "rounds", 1),
        "distinct": not getattr(args, "repeat_prompts", False),
        "json_object": getattr(args, "json_object", False),
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
    """Rows in bench-serve's columns, one per level (its median round, with every round's tok/s, as serve_rounds
    keeps for the servers), from one Engine kept across levels and rounds (as a server is)."""
    import argparse

    import torch

    from ...engine import Engine
    from ...serve.cli import add_serve, engine_options
    from .batch import closed_loop
    from .serve_common import level_prompts
    from .serve_rounds import median_row

    if spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    parser = argparse.ArgumentParser()
    add_serve(parser.add_subparsers())  # `leapdecode serve`'s own defaults
    options = engine_options(parser.parse_args(["serve", "--model", spec["model"], "--drafter", "none"]))
    engine = Engine(spec["model"], **options)
    engine.warm_up()
    chat = lambda text: [{"role": "user", "content": text}]  # noqa: E731
    shape = {"structured_output": {"json_object": True}} if spec.get("json_object") else {}
    engine.generate_many([chat(spec["prompts"][0])], max_new_tokens=spec["max_tokens"], **shape)  # the warm-up
    rows = []
    for round_ in range(1, spec.get("rounds", 1) + 1):
        for c in spec["levels"]:
            texts = level_prompts(spec["prompts"], spec["num_prompts"], c, round_, spec.get("distinct", True))
            rows.append(
                _row(
                    c, round_, len(texts), closed_loop(engine, [chat(t) for t in texts], c, spec["max_tokens"], **shape)
                )
            )
    return [median_row([row for row in rows if row["concurrency"] == c]) for c in spec["levels"]]


def _row(c: int, round_: int, requests: int, record: dict) -> dict:
    """One level of closed_loop's record in bench-serve's columns."""
    latencies = {
        f"{name}_p{q}_ms": None if record[f"{name}_p{q}"] is None else round(1000 * record[f"{name}_p{q}"], 2)
        for name in ("ttft", "e2e")
        for q in (50, 99)
    }
    return {
        "concurrency": c,
        "round": round_,
        "requests": requests,
        "completed": requests - record["failed"],
        "failed": record["failed"],
        "duration_s": round(record["wall"], 3),
        "output_tokens": record["output_tokens"],
        "output_tokens_per_s": round(record["output_tok_s"], 3),
        "requests_per_s": round(record["requests_s"], 4),
        **latencies,
    }


if __name__ == "__main__":
    print(json.dumps(measure(json.load(sys.stdin))))
