"""The engine without HTTP, on bench-serve's own load: what serving costs, measured in the same run.

`bench-serve --compare leapdecode` measures `leapdecode serve` through HTTP with the `openai` client. This runs the
same prompts (same order, the same chat messages, max tokens and closed loop of C requests in flight) through an
Engine built as `leapdecode serve --drafter none` builds it, warmed up the same way, in a process of its own with the
same threads. A server's rate over this one is what the serving path costs: HTTP, the event loop, streaming, and the
client process sharing the cores.

The process is a worker that stays up and measures one level when asked (a JSON line in, a row out), so that with
`--rounds N` it takes its turn beside the servers in every round (serve_rounds.py) and server ÷ engine is paired per
round like speculation on ÷ off; without rounds it measures every level once the servers have stopped."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile

LABEL = "leapdecode engine in process (no HTTP; speculation off)"


class Worker:
    """The engine's process, driven level by level: `start` (→ the report entry, with an error where it could not
    start), `measure(level, round)` (→ one row in bench-serve's columns), `stop`."""

    def __init__(self, model_dir: str, args):
        from .sampling_args import sampling_options
        from .serve_common import _levels, load_prompts
        from .serve_peers import _thread_env

        prompts = load_prompts(args.suite)
        random.Random(args.seed).shuffle(prompts)  # bench_url's order; its first prompt is also the warm-up
        self.spec = {
            "model": model_dir,
            "prompts": prompts,
            "num_prompts": args.num_prompts,
            "max_tokens": args.max_tokens,
            "threads": args.threads,
            "distinct": not getattr(args, "repeat_prompts", False),
            "json_object": getattr(args, "json_object", False),
            "sampling": sampling_options(args),
        }
        self.levels = _levels(args.concurrency)
        self.rounds = getattr(args, "rounds", 1)
        self.command = [sys.executable, "-m", __name__]
        self.label = LABEL
        self.entry = {
            "label": LABEL,
            "peer": "in-process",
            "command": " ".join(self.command) + " < SPEC.json",  # the spec (prompts, max tokens) on stdin
            "env": _thread_env(args.threads),
        }
        self.proc = None

    def start(self, say=print) -> dict:
        say(f"starting {LABEL}")
        self.log = tempfile.TemporaryFile("w+")  # its stderr: a pipe nobody reads would fill and stall it
        self.proc = subprocess.Popen(
            self.command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            env={**os.environ, **self.entry["env"]},
        )
        try:
            self._ask(self.spec)  # → {"ready": true} once built and warmed up
        except RuntimeError as e:
            self.stop()
            return dict(self.entry, error=f"failed: {e}", rows=[])
        return dict(self.entry)

    def measure(self, level: int, round_: int) -> dict:
        return self._ask({"level": level, "round": round_})

    def _ask(self, message: dict) -> dict:
        try:
            self.proc.stdin.write(json.dumps(message) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except (BrokenPipeError, OSError):
            line = ""
        if not line:
            self.log.seek(0)
            raise RuntimeError((self.log.read().strip().splitlines() or ["no output"])[-1][:300])
        return json.loads(line)

    def stop(self) -> None:
        if self.proc is not None:
            try:
                self.proc.stdin.close()
                self.proc.wait(30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
            self.proc = None
            self.log.close()


def run(model_dir: str, args, say=print) -> dict:
    """The in-process result for the report ({label, peer, command, env, rows}, or an error): every level, round
    after round, from one worker."""
    from .serve_rounds import median_row

    worker = Worker(model_dir, args)
    entry = worker.start(say)
    if "error" in entry:
        return entry
    try:
        rows = [worker.measure(c, r) for r in range(1, worker.rounds + 1) for c in worker.levels]
    except RuntimeError as e:
        return dict(entry, error=f"failed while measured: {e}", rows=[])
    finally:
        worker.stop()
    return dict(entry, rows=[median_row([row for row in rows if row["concurrency"] == c]) for c in worker.levels])


def serve_requests(requests, answer) -> None:
    """The worker's loop: the spec, then one level per line, each answered on one line of stdout (everything else
    the engine prints goes to stderr)."""
    import argparse

    import torch

    from ...engine import Engine
    from ...serve.cli import add_serve, engine_options
    from .batch import closed_loop
    from .serve_common import level_prompts, step_columns

    spec = json.loads(next(requests))
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
    answer({"ready": True})
    for line in requests:
        ask = json.loads(line)
        c, round_ = ask["level"], ask["round"]
        texts = level_prompts(spec["prompts"], spec["num_prompts"], c, round_, spec.get("distinct", True))
        before = dict(engine.counters)
        record = closed_loop(engine, [chat(t) for t in texts], c, spec["max_tokens"], **shape, **spec["sampling"])
        answer({**_row(c, round_, len(texts), record), **step_columns(before, engine.counters)})


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


def _main() -> None:
    out = sys.stdout
    sys.stdout = sys.stderr  # the protocol owns stdout

    def answer(message: dict) -> None:
        out.write(json.dumps(message) + "\n")
        out.flush()

    serve_requests(iter(sys.stdin.readline, ""), answer)


if __name__ == "__main__":
    _main()
