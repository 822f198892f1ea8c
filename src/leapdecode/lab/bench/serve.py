"""`leapdecode bench-serve`: load on any OpenAI-compatible server, measured as `vllm bench serve` and GuideLLM do.

For each concurrency level, `--num-prompts` streamed chat (or completion) requests from a suite's first turns are
sent with at most that many in flight (optionally released at `--rate` requests/s, evenly or as a Poisson process).
Per request: time to first token (first chunk with text), the gaps between chunks with text (inter-token latency;
a chunk can carry several tokens when a server speculates), end-to-end latency, and output tokens (the server's
`usage` where it streams one, else one per text chunk). Per level: output tokens/s and requests/s over the level's
wall time, and p50/p99 of each latency. Results go to `results.json`, `report.md` and PNG plots in `--out`.

`--compare leapdecode,vllm,transformers` starts each server on the same model directory (`--model-dir`), one after
another on a free port of 127.0.0.1, measures it with the same prompts and stops it before the next starts
(serve_peers.py); `--compare-transformers DIR` is `--compare leapdecode,transformers --model-dir DIR`. With
`--rounds N` leapdecode's two servers (speculation on and off) are measured in turns instead, N rounds, for paired
ratios that the host's drift does not blur (serve_rounds.py).
"""

from __future__ import annotations

import asyncio
import json
import pathlib
import random
import signal
import statistics
import sys
import time

from ...errors import require
from . import serve_inprocess, serve_peers, serve_rounds
from .sampling_args import add_sampling_arguments, check_sampling_arguments, sampling_words
from .serve_common import (
    _levels,
    _pct,
    level_prompts,
    load_prompts,
    scrape_step_counters,
    step_columns,
    streamed_call,
)


def register(sub) -> None:
    p = sub.add_parser("bench-serve", help="measure an OpenAI-compatible server under concurrent load")
    p.add_argument("--url", default="http://127.0.0.1:8000", help="server base URL (without /v1)")
    p.add_argument("--model", help="model name to send (default: the first of the server's /v1/models)")
    p.add_argument("--concurrency", default="1,4,16,32", help="comma-separated levels of requests in flight")
    p.add_argument("--num-prompts", type=int, default=32, help="requests per concurrency level")
    p.add_argument("--rate", type=float, help="release requests at R per second (default: all at once)")
    p.add_argument("--poisson", action="store_true", help="with --rate: exponential gaps (a Poisson process)")
    p.add_argument("--suite", default="dev", help="built-in suite name or a Spec-Bench JSONL path")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument(
        "--endpoint",
        default="chat",
        choices=("chat", "completions", "responses"),
        help="chat completions (default), completions (the prompt as raw text) or the Responses API",
    )
    p.add_argument(
        "--json-object",
        action="store_true",
        help='every answer a JSON object (response_format {"type": "json_object"}), as structured-output clients ask',
    )
    add_sampling_arguments(p, "unseeded, as clients send them")
    p.add_argument("--api-key", default="none")
    p.add_argument(
        "--request-timeout",
        type=float,
        default=300.0,
        help="seconds a request may take in all before it counts as failed (0: none)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the prompt order and Poisson gaps")
    p.add_argument(
        "--repeat-prompts",
        action="store_true",
        help="send the suite's prompts as they are, so that repeats (across levels, rounds and within a level) may "
        "be served from a server's prefix cache; by default each request begins with a tag of its own",
    )
    p.add_argument("--out", help="output directory (default bench-serve/<timestamp>)")
    p.add_argument("--label", help="name of this server in the report (default: the URL)")
    p.add_argument(
        "--compare",
        metavar="PEERS",
        help="start and measure each of these servers in turn on --model-dir: leapdecode (speculation on and off), "
        "transformers (transformers serve --continuous-batching), vllm (vLLM's CPU build in a venv of its own)",
    )
    p.add_argument(
        "--model-dir",
        default="smollm2-135m",
        help="with --compare: the HF model directory, or a packaged model's cached copy (default smollm2-135m)",
    )
    p.add_argument(
        "--install-peers",
        action="store_true",
        help="with --compare vllm: create vLLM's own venv under the cache dir if missing (several GB)",
    )
    p.add_argument("--serve-args", help="with --compare: more flags for leapdecode serve (one quoted string)")
    p.add_argument(
        "--compare-transformers",
        metavar="MODEL_DIR",
        help="the same as --compare leapdecode,transformers --model-dir MODEL_DIR",
    )
    p.add_argument("--port", type=int, help="with --compare: one port for every server (default: a free one each)")
    p.add_argument(
        "--drafter",
        default="auto",
        help="with --compare: leapdecode's drafter when speculating (add --head NAME for a shipped draft head)",
    )
    p.add_argument("--head", help="with --compare and --drafter head: the draft head")
    p.add_argument("--threads", type=int, help="with --compare: torch threads of each server")
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="with --compare: measure leapdecode's servers (speculation on and off) in turns, N rounds, "
        "for paired on ÷ off ratios; the report keeps each server's median round",
    )
    from .serve_faults import add_arguments as add_fault_arguments

    add_fault_arguments(p)
    p.set_defaults(func=run_bench_serve)


async def _one(client, model: str, prompt: str, args) -> dict:
    record = {"ok": False, "ttft": None, "itl": [], "e2e": None, "output_tokens": 0, "error": None}
    start = time.perf_counter()
    last, chunks, usage_tokens = None, 0, None
    try:
        async with asyncio.timeout(getattr(args, "request_timeout", None) or None):  # a stream that never ends
            call, read = streamed_call(client, model, prompt, args)
            async for event in await call:
                text, tokens = read(event)
                if tokens is not None:
                    usage_tokens = tokens
                if text:
                    now = time.perf_counter()
                    if last is None:
                        record["ttft"] = now - start
                    else:
                        record["itl"].append(now - last)
                    last, chunks = now, chunks + 1
            record["e2e"] = time.perf_counter() - start
            record["output_tokens"] = usage_tokens if usage_tokens is not None else chunks
            record["ok"] = True
    except Exception as e:  # a failed request is counted, not fatal
        record["error"] = f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"
    return record


async def _level(
    client, url: str, model: str, prompts: list[str], concurrency: int, args, rng: random.Random, round_: int = 1
) -> dict:
    semaphore = asyncio.Semaphore(concurrency)

    async def limited(prompt: str, delay: float):
        await asyncio.sleep(delay)
        async with semaphore:
            return await _one(client, model, prompt, args)

    delays, t = [], 0.0
    for _ in range(args.num_prompts):
        delays.append(t)
        if args.rate:
            t += rng.expovariate(args.rate) if args.poisson else 1.0 / args.rate
    chosen = level_prompts(prompts, args.num_prompts, concurrency, round_, not getattr(args, "repeat_prompts", False))
    counters = await asyncio.to_thread(scrape_step_counters, url)  # a leapdecode server's; None for a peer
    start, cpu = time.perf_counter(), time.process_time()
    records = await asyncio.gather(*(limited(p, d) for p, d in zip(chosen, delays)))
    duration = time.perf_counter() - start
    client_cores = (time.process_time() - cpu) / duration  # the load generator's own share of the machine
    after = None if counters is None else await asyncio.to_thread(scrape_step_counters, url)
    ok = [r for r in records if r["ok"]]
    tokens = sum(r["output_tokens"] for r in ok)
    ttft = [r["ttft"] for r in ok if r["ttft"] is not None]
    itl = [x for r in ok for x in r["itl"]]
    e2e = [r["e2e"] for r in ok]
    row = {
        "concurrency": concurrency,
        "requests": len(records),
        "completed": len(ok),
        "failed": len(records) - len(ok),
        "duration_s": round(duration, 3),
        "output_tokens": tokens,
        "output_tokens_per_s": round(tokens / duration, 3),
        "requests_per_s": round(len(ok) / duration, 4),
        "client_cpu_cores": round(client_cores, 2),
        **step_columns(counters, after),
    }
    for name, values in (("ttft", ttft), ("itl", itl), ("e2e", e2e)):
        for q in (50, 99):
            v = _pct(values, q)
            row[f"{name}_p{q}_ms"] = None if v is None else round(1000 * v, 2)
        row[f"{name}_mean_ms"] = round(1000 * statistics.fmean(values), 2) if values else None
    errors = sorted({r["error"] for r in records if r["error"]})
    row["errors"] = errors[:5]
    return row


async def bench_url(
    url: str, model: str | None, args, log=print, levels: list[int] | None = None, round_: int = 1
) -> dict:
    """Every concurrency level (of --concurrency, or `levels`) against one server; returns {label, url, model,
    rows}. `round_`: which round of --rounds this is (it tags the prompts, serve_common.level_prompts)."""
    import openai

    client = openai.AsyncOpenAI(base_url=url.rstrip("/") + "/v1", api_key=args.api_key, max_retries=0, timeout=600.0)
    try:
        if model is None:
            model = (await client.models.list()).data[0].id
        prompts = load_prompts(args.suite)
        random.Random(args.seed).shuffle(prompts)
        await _one(client, model, prompts[0], args)  # warm-up, not measured
        rows = []
        for c in levels or _levels(args.concurrency):
            row = await _level(client, url, model, prompts, c, args, random.Random(args.seed), round_)
            log(
                f"  concurrency {c:>3}: {row['output_tokens_per_s']:8.1f} tok/s  {row['requests_per_s']:6.2f} req/s  "
                f"TTFT p50 {row['ttft_p50_ms']} ms  ITL p50 {row['itl_p50_ms']} ms  E2E p50 {row['e2e_p50_ms']} ms"
                f"  failed {row['failed']}"
            )
            rows.append(row)
    finally:
        await client.close()
    return {"label": args.label or url, "url": url, "model": model, "rows": rows}


COLUMNS = (
    ("concurrency", "concurrency"),
    ("output_tokens_per_s", "output tok/s"),
    ("requests_per_s", "req/s"),
    ("ttft_p50_ms", "TTFT p50 ms"),
    ("ttft_p99_ms", "TTFT p99 ms"),
    ("itl_p50_ms", "ITL p50 ms"),
    ("itl_p99_ms", "ITL p99 ms"),
    ("e2e_p50_ms", "E2E p50 ms"),
    ("e2e_p99_ms", "E2E p99 ms"),
    ("completed", "completed"),
    ("failed", "failed"),
    ("client_cpu_cores", "client CPU (cores)"),
)
STEP_COLUMNS = (  # leapdecode's servers and engine
    ("step_ms", "engine step ms"),
    ("forward_ms", "of it forward ms"),
    ("handover_ms", "hand-over ms"),
)


def markdown(results: list[dict], settings: dict) -> str:
    lines = ["# bench-serve", "", "| setting | value |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in settings.items()]
    columns = list(COLUMNS)
    if any("step_ms" in row for res in results for row in res["rows"]):
        columns += STEP_COLUMNS
    for key, title in (("ratio_to_in-process", "× engine in process"), ("ratio_to_vllm", "× vLLM tok/s")):
        if any(key in row for res in results for row in res["rows"]):
            columns.insert(2, (key, title))
    lines += ["", "| server | " + " | ".join(t for _, t in columns) + " |", "|---|" + "---:|" * len(columns)]
    for res in results:
        if res.get("error"):  # a peer that could not be installed, started or measured: one line
            lines.append(f"| {res['label']} | – | **not measured**: {res['error']} |" + " |" * (len(columns) - 2))
        for row in res["rows"]:
            cells = ["–" if row.get(k) is None else str(row[k]) for k, _ in columns]
            lines.append(f"| {res['label']} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "Output tok/s and req/s: over each level's wall time. TTFT: request sent to first chunk with "
        "text. ITL: gaps between chunks with text (a speculating server may send several tokens per chunk). "
        f"E2E: request sent to last chunk. {settings.get('sampling', 'Greedy')}, streamed. Client CPU: the cores the load "
        "generator itself (this process, the `openai` client) kept busy over the level, on the same machine as the "
        "server.",
        "",
    ]
    if any("step_ms" in row for res in results for row in res["rows"]):
        lines += [
            "Engine step ms: the mean step of leapdecode's engine over the level (its /metrics, or the engine in "
            "process), and of it the forward alone: the rest is scheduling, drafting, verification and handing "
            "outputs over; a server's forward dearer than the engine's in process is the cores it shares with HTTP "
            "and the client. Hand-over ms: a server's wait after each step, until its event loop has written the "
            "step's outputs (none in process).",
            "",
        ]
    lines += serve_rounds.markdown(results)
    started = [res for res in results if res.get("command")]
    if started:
        lines += ["Servers on 127.0.0.1, one measured at a time:", ""]
        for res in started:
            env = " ".join(f"{k}={v}" for k, v in (res.get("env") or {}).items())
            version = f" {res['version']}" if res.get("version") else ""
            lines.append(f"- {res['label']} ({res['peer']}{version}): `{(env + ' ') if env else ''}{res['command']}`")
        lines.append("")
    return "\n".join(lines)


def plot(out: pathlib.Path, results: list[dict]) -> list[str]:
    from ..report_kit import pyplot

    plt = pyplot()
    names = []
    for key, title, fname in (
        ("output_tokens_per_s", "output tokens/s", "throughput.png"),
        ("ttft_p50_ms", "TTFT p50 (ms)", "ttft.png"),
        ("itl_p50_ms", "ITL p50 (ms)", "itl.png"),
    ):
        fig, ax = plt.subplots(figsize=(6.5, 4))
        for res in results:
            xs = [r["concurrency"] for r in res["rows"] if r.get(key) is not None]
            ax.plot(xs, [r[key] for r in res["rows"] if r.get(key) is not None], marker="o", label=res["label"])
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency")
        ax.set_ylabel(title)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / fname, dpi=110)
        plt.close(fig)
        names.append(fname)
    return names


def save(out: pathlib.Path, results: list[dict], settings: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    paired = serve_rounds.summary(results)
    (out / "results.json").write_text(
        json.dumps({"settings": settings, "results": results, "paired": paired}, indent=1)
    )
    plots = plot(out, results)
    (out / "report.md").write_text(markdown(results, settings) + "\n" + "\n".join(f"![{p}]({p})" for p in plots) + "\n")


def _settings(args) -> dict:
    return {
        "concurrency": args.concurrency,
        "num_prompts": args.num_prompts,
        "rate": args.rate or "all at once",
        "arrivals": "poisson" if args.poisson else "uniform",
        "suite": args.suite,
        "max_tokens": args.max_tokens,
        "endpoint": args.endpoint,
        "sampling": sampling_words(args),
        "response_format": "json_object" if getattr(args, "json_object", False) else "text",
        "rounds": getattr(args, "rounds", 1),
        "prompts": "as in the suite (repeats may hit prefix caches)"
        if getattr(args, "repeat_prompts", False)
        else "each request tagged, new to the server",
        "timestamp": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def run_bench_serve(args) -> int:
    if args.scenario == "faults":
        from . import serve_faults

        return serve_faults.run(args)
    require(args.num_prompts >= 1, f"--num-prompts must be >= 1, got {args.num_prompts}")
    require(args.max_tokens >= 1, f"--max-tokens must be >= 1, got {args.max_tokens}")
    require(args.rate is None or args.rate > 0, f"--rate must be positive, got {args.rate}")
    require(not args.poisson or args.rate, "--poisson goes with --rate")
    require(args.rounds >= 1, f"--rounds must be >= 1, got {args.rounds}")
    check_sampling_arguments(args)
    require(args.rounds == 1 or args.compare or args.compare_transformers, "--rounds goes with --compare")
    _levels(args.concurrency)
    load_prompts(args.suite)  # a bad suite fails before any traffic
    out = pathlib.Path(args.out or f"bench-serve/{time.strftime('%Y%m%d-%H%M%S')}")
    if args.compare or args.compare_transformers:
        results, host = compare(args, lambda partial, host: save(out, partial, {**host, **_settings(args)}))
    else:
        host = {}
        print(f"bench-serve {args.url}")
        results = [asyncio.run(bench_url(args.url, args.model, args))]
    settings = {**host, **_settings(args)}
    if host:
        settings["load average after"] = serve_peers.host().get("load average")
    save(out, results, settings)
    print(markdown(results, settings))
    print(f"saved {out}/results.json, report.md, throughput.png, ttft.png, itl.png")
    return 0


def compare(args, save_partial=None) -> tuple[list[dict], dict]:
    """Start, measure and stop each server of --compare in turn; (results, host header). `save_partial(results,
    host)` after each server but the last."""
    if args.compare_transformers:
        require(not args.compare, "--compare-transformers DIR is --compare leapdecode,transformers --model-dir DIR")
        args.compare, args.model_dir = "leapdecode,transformers", args.compare_transformers
    peers = serve_peers.parse_compare(args.compare)
    model_dir = serve_peers.model_directory(args.model_dir)
    host = {**serve_peers.host(), "model directory": model_dir, "compared": ", ".join(peers)}
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a terminated benchmark still stops its server
    servers = serve_peers.plan(peers, model_dir, args)

    def measure(url: str, model: str, label: str, levels: list[int] | None = None, round_: int = 1) -> dict:
        args.label = label
        return asyncio.run(bench_url(url, model, args, levels=levels, round_=round_))

    def partial(results: list[dict]) -> None:
        if save_partial is not None and len(results) < len(servers):
            serve_peers.add_ratios(results)
            save_partial(results, host)

    in_process = "leapdecode" in peers and not args.rate  # the engine without HTTP on the same load (closed loop)
    if args.rounds > 1:  # leapdecode's servers and the engine in turns, then the peers one at a time
        ours = [s for s in servers if s.peer == "leapdecode"]

        def measure_level(url: str, model: str, label: str, level: int, round_: int) -> dict:
            return measure(url, model, label, levels=[level], round_=round_)["rows"][0]

        engine = serve_inprocess.Worker(model_dir, args) if in_process else None  # in the same turns
        results = serve_rounds.run_interleaved(
            ours, measure_level, _levels(args.concurrency), args.rounds, engine=engine
        )
        results += serve_peers.run_servers([s for s in servers if s.peer != "leapdecode"], measure)
    else:
        results = serve_peers.run_servers(servers, measure, on_result=partial)
        if in_process:
            results.append(serve_inprocess.run(model_dir, args))
    if in_process:
        serve_peers.add_ratios(results, "in-process")
    serve_peers.add_ratios(results)
    return results, host


def server_commands(
    model_dir: str, port: int, threads: int | None, drafter: str = "auto", head: str | None = None
) -> list[tuple[str, list[str], str]]:
    """(label, command, model name) of each server --compare-transformers runs on one model directory."""
    import argparse

    args = argparse.Namespace(port=port, threads=threads, drafter=drafter, head=head, serve_args=None)
    return [(s.label, s.command, s.model) for s in serve_peers.plan(["leapdecode", "transformers"], model_dir, args)]
