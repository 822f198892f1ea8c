"""`leapdecode bench-serve --scenario faults`: a fixed mix of good and bad requests against any OpenAI-compatible
server, counted by what became of each.

The mix (fault_plan, by request index): good greedy requests with short and long prompts, chat and completions,
streamed or not; a fifth dropped after their stream's first chunk; a tenth malformed (invalid JSON, bad values, an
unknown model); a tenth over the context (a prompt past it, or max_tokens past the room left); with
`--fault-marker WORD`, a twentieth carry that word (a server with the test hook of tests/test_serve_faults.py fails
their drafter; elsewhere they are ordinary requests). They go out at the highest `--concurrency` level, without
retries. Each ends as completed, disconnected, 429, 4xx, 5xx, hung (no answer within `--timeout`) or transport (the
connection failed); the report counts them per kind, gives the completed requests' latency, and checks that identical
greedy requests got identical answers (greedy output must not depend on what else the server was doing) and that
every error was an OpenAI JSON error. tests/test_serve_faults.py runs the same mix against a server with a small KV
budget and queue bound.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import pathlib
import time

from ...errors import require
from .serve_common import _levels, _pct, load_prompts


def retry_after_seconds(value: str | None, now: float | None = None) -> float:
    """A Retry-After header in seconds: delta-seconds or an HTTP-date (RFC 9110 allows both); 0 when absent or
    unreadable (a soak client then retries at once rather than stopping)."""
    if not value:
        return 0.0
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return 0.0
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def add_arguments(p) -> None:
    p.add_argument(
        "--scenario",
        default="load",
        choices=("load", "faults"),
        help="load (default): throughput and latency per concurrency level; faults: a mix of good, dropped, "
        "malformed and over-context requests at the highest --concurrency, counted by outcome",
    )
    p.add_argument("--fault-requests", type=int, default=300, help="with --scenario faults: requests sent")
    p.add_argument(
        "--fault-marker",
        help="with --scenario faults: a word put in a twentieth of the prompts (a server with the test hook fails "
        "their drafter; elsewhere they are ordinary requests)",
    )
    p.add_argument(
        "--timeout", type=float, default=300.0, help="with --scenario faults: seconds before a request counts as hung"
    )
    p.add_argument("--context", type=int, help="with --scenario faults: the context when /v1/models has none")


def run(args) -> int:
    require(args.fault_requests >= 1, f"--fault-requests must be >= 1, got {args.fault_requests}")
    require(args.max_tokens >= 1, f"--max-tokens must be >= 1, got {args.max_tokens}")
    require(args.timeout > 0, f"--timeout must be positive, got {args.timeout}")
    require(
        not (getattr(args, "compare", None) or args.compare_transformers), "--scenario faults runs against --url only"
    )
    _levels(args.concurrency)
    load_prompts(args.suite)  # a bad suite fails before any traffic
    return run_fault_scenario(args)


MALFORMED = (
    ("invalid json", b'{"model": "m", "messages": ['),
    ("temperature < 0", {"temperature": -1}),
    ("wrong type", {"max_tokens": "many"}),
    ("unknown model", {"model": "no-such-model"}),
    ("n = 0", {"n": 0}),
)


def fault_plan(
    count: int,
    short_prompts: list[str],
    long_prompts: list[str],
    context: int,
    max_tokens: int,
    fault_marker: str | None = None,
) -> list[dict]:
    """What each of `count` requests is, by its index (deterministic): a fifth drop their stream after its first
    chunk; a tenth are malformed; a tenth are over the context (a prompt past it, or max_tokens past the room left);
    with `fault_marker`, a twentieth carry it in their prompt (a server with the test hook makes their drafter
    raise); the rest are good greedy requests, short and long prompts, chat and completions, streamed or not."""
    require(short_prompts and long_prompts, "the faults scenario needs short and long prompts")
    plan = []
    for i in range(count):
        chat, stream = i % 2 == 0, i % 3 != 0
        long = (i // 2) % 2 == 1
        prompts = long_prompts if long else short_prompts
        prompt = prompts[(i // 4) % len(prompts)]
        item = dict(index=i, kind="good", chat=chat, stream=stream, prompt=prompt, max_tokens=max_tokens)
        if i % 5 == 4:
            item.update(kind="drop", stream=True, prompt=long_prompts[i % len(long_prompts)])
        elif i % 10 == 3:
            what, body = MALFORMED[(i // 10) % len(MALFORMED)]
            item.update(kind="malformed", what=what, body=body, stream=False)
        elif i % 10 == 7:
            over = (i // 10) % 2 == 0
            item.update(kind="over-context", stream=False)
            if over:
                item.update(what="prompt past the context", prompt=" ".join(["hello"] * (context + 8)))
            else:
                item.update(what="max_tokens past the room", max_tokens=context)
        elif fault_marker and i % 20 == 11:
            item.update(kind="fault", stream=False, prompt=f"{fault_marker} {short_prompts[i % len(short_prompts)]}")
        plan.append(item)
    return plan


def _body(item: dict, model: str):
    if item["kind"] == "malformed" and isinstance(item["body"], bytes):
        return item["body"]
    body = {"model": model, "max_tokens": item["max_tokens"], "temperature": 0, "stream": item["stream"]}
    if item["chat"]:
        body["messages"] = [{"role": "user", "content": item["prompt"]}]
    else:
        body["prompt"] = item["prompt"]
    if item["kind"] == "malformed":
        body.update(item["body"])
    return json.dumps(body).encode()


async def _fault_one(client, url: str, model: str, item: dict, timeout: float) -> dict:
    """One request of the plan: its outcome (completed, disconnected, 429, 4xx, 5xx, hung, transport), HTTP status,
    text and finish reason, or its error."""
    record = dict(item, outcome=None, status=None, text="", finish_reason=None, error=None, code=None, e2e=None)
    record.pop("body", None)
    path = "/v1/chat/completions" if item["chat"] else "/v1/completions"
    start = time.perf_counter()

    async def call():
        headers = {"content-type": "application/json"}
        async with client.stream("POST", url + path, content=_body(item, model), headers=headers) as r:
            record["status"] = r.status_code
            if r.status_code != 200:
                raw = await r.aread()
                try:
                    error = json.loads(raw)["error"]
                    record["error"], record["code"] = error["message"], error.get("code")
                except (ValueError, KeyError, TypeError):
                    record["error"] = "not an OpenAI JSON error: " + raw[:200].decode(errors="replace")
                record["outcome"] = "429" if r.status_code == 429 else f"{r.status_code // 100}xx"
                record["retry_after"] = retry_after_seconds(r.headers.get("retry-after"))
                return
            if not item["stream"]:
                choice = json.loads(await r.aread())["choices"][0]
                record["text"] = choice["message"]["content"] if item["chat"] else choice["text"]
                record["finish_reason"] = choice["finish_reason"]
                record["outcome"] = "completed"
                return
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if "error" in event:  # the request failed after its first token
                    record["error"], record["code"] = event["error"]["message"], event["error"].get("code")
                    record["outcome"] = "5xx"
                    return
                if item["kind"] == "drop":
                    record["outcome"] = "disconnected"
                    return  # leaving the block closes the connection mid-stream
                for c in event.get("choices", []):
                    record["text"] += (c["delta"].get("content") if item["chat"] else c["text"]) or ""
                    record["finish_reason"] = c["finish_reason"] or record["finish_reason"]
            record["outcome"] = "completed"

    try:
        await asyncio.wait_for(call(), timeout)
    except asyncio.TimeoutError:
        record["outcome"] = "hung"
    except Exception as e:  # the connection failed: counted, not fatal
        record["outcome"], record["error"] = "transport", f"{type(e).__name__}: {e}"
    record["e2e"] = time.perf_counter() - start
    return record


async def run_faults(
    url: str, model: str, plan: list[dict], concurrency: int, timeout: float = 300.0, api_key: str | None = None
) -> list[dict]:
    """Send every request of `plan` with at most `concurrency` in flight (no retries); one record per request. A
    client told to come back later (a 429 or 503 with Retry-After) waits that long before it sends its next request, as
    the `openai` client does before its retry."""
    import httpx

    gate = asyncio.Semaphore(concurrency)
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=timeout, headers=headers, limits=limits) as client:

        async def limited(item):
            async with gate:
                record = await _fault_one(client, url.rstrip("/"), model, item, timeout)
                await asyncio.sleep(record.pop("retry_after", 0.0))
                return record

        return await asyncio.gather(*(limited(item) for item in plan))


OUTCOMES = ("completed", "disconnected", "429", "4xx", "5xx", "hung", "transport")


def fault_summary(records: list[dict], duration: float) -> dict:
    """Counts by outcome and kind, latency of completed requests, and whether greedy answers to the same request
    agree (they must: greedy output does not depend on what else the server is doing)."""
    counts = {o: sum(r["outcome"] == o for r in records) for o in OUTCOMES}
    kinds = {}
    for r in records:
        kinds.setdefault(r["kind"], dict.fromkeys(OUTCOMES, 0))[r["outcome"]] += 1
    answers: dict = {}
    for r in records:
        if r["outcome"] == "completed" and r["kind"] == "good":
            answers.setdefault((r["chat"], r["prompt"], r["max_tokens"]), set()).add((r["text"], r["finish_reason"]))
    e2e = [r["e2e"] for r in records if r["outcome"] == "completed"]
    return {
        "requests": len(records),
        **counts,
        "by_kind": kinds,
        "inconsistent_answers": sum(len(a) > 1 for a in answers.values()),
        "not_json_errors": sum(bool(r["error"]) and r["error"].startswith("not an OpenAI JSON error") for r in records),
        "duration_s": round(duration, 2),
        "e2e_p50_ms": None if not e2e else round(1000 * _pct(e2e, 50), 1),
        "e2e_p99_ms": None if not e2e else round(1000 * _pct(e2e, 99), 1),
    }


def fault_markdown(summary: dict, settings: dict) -> str:
    lines = ["# bench-serve --scenario faults", "", "| setting | value |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in settings.items()]
    lines += ["", "| kind | " + " | ".join(OUTCOMES) + " |", "|---|" + "---:|" * len(OUTCOMES)]
    for kind, row in summary["by_kind"].items():
        lines.append(f"| {kind} | " + " | ".join(str(row[o]) for o in OUTCOMES) + " |")
    lines.append("| **all** | " + " | ".join(str(summary[o]) for o in OUTCOMES) + " |")
    lines += [
        "",
        f"{summary['requests']} requests in {summary['duration_s']} s; completed E2E p50 {summary['e2e_p50_ms']} ms, "
        f"p99 {summary['e2e_p99_ms']} ms; greedy answers that differ between identical requests: "
        f"{summary['inconsistent_answers']}; errors that are not OpenAI JSON: {summary['not_json_errors']}.",
        "",
    ]
    return "\n".join(lines)


def fault_prompts(suite: str, context: int) -> tuple[list[str], list[str]]:
    """Short prompts (a suite's first turns) and long ones (several of them joined, to about a third of the context
    in words)."""
    short = [p for p in load_prompts(suite) if len(p.split()) < context // 8] or ["Say hello."]
    words = " ".join(load_prompts(suite)).split()
    size = max(8, min(context // 3, 1500))
    long = [" ".join(words[i * size : (i + 1) * size]) for i in range(max(1, min(8, len(words) // size)))]
    return short[:32], [x for x in long if x] or [" ".join(["hello"] * size)]


async def bench_faults(args) -> tuple[dict, list[dict]]:
    import httpx

    url = args.url.rstrip("/").removesuffix("/v1")
    headers = {"authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    async with httpx.AsyncClient(timeout=30, headers=headers) as client:
        models = (await client.get(url + "/v1/models")).json()["data"]
    model = args.model or models[0]["id"]
    context = int(models[0].get("max_model_len") or args.context or 2048)
    short, long = fault_prompts(args.suite, context)
    plan = fault_plan(args.fault_requests, short, long, context, args.max_tokens, args.fault_marker)
    start = time.perf_counter()
    records = await run_faults(url, model, plan, max(_levels(args.concurrency)), args.timeout, args.api_key)
    return fault_summary(records, time.perf_counter() - start), records


def run_fault_scenario(args) -> int:
    out = pathlib.Path(args.out or f"bench-serve/faults-{time.strftime('%Y%m%d-%H%M%S')}")
    print(f"bench-serve --scenario faults {args.url}: {args.fault_requests} requests", flush=True)
    summary, records = asyncio.run(bench_faults(args))
    settings = {
        "url": args.url,
        "requests": args.fault_requests,
        "concurrency": max(_levels(args.concurrency)),
        "max_tokens": args.max_tokens,
        "fault_marker": args.fault_marker or "none",
        "timeout_s": args.timeout,
        "timestamp": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"settings": settings, "summary": summary, "records": records}))
    report = fault_markdown(summary, settings)
    (out / "report.md").write_text(report)
    print(report)
    print(f"saved {out}/results.json, report.md")
    return 0 if summary["hung"] == 0 and summary["inconsistent_answers"] == 0 else 1
