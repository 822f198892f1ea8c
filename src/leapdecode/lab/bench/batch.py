"""`leapdecode bench-batch`: offline throughput and latency with many requests at once.

For each concurrency C, the suite's first turns (cycled to `--requests`) are decoded with at most C in flight: a new
request is sent whenever one finishes (a closed loop, as `vllm bench serve --max-concurrency` does). Methods:
`hf-generate` (HF `generate`, one request at a time), `hf-generate-batch` (HF's own continuous batching,
`generate_batch`, same max batch tokens and C requests per batch), `engine` (leapdecode's Engine, speculation off),
`engine-<drafter>` (speculation on) and the optional peer `openvino-cb` (OpenVINO GenAI's ContinuousBatchingPipeline
in the same closed loop, in a process of its own: peers.py). Per run: output tokens/s over the whole run, requests/s, and per request
time to first token (TTFT), time per output token after the first (TPOT) and end-to-end latency, p50/p99. Every
greedy output is compared with the same request decoded alone by HF `generate`; a difference is reported with the
target's top-2 logit margin at the first differing token (a rounding tie, or a bug).
"""

from __future__ import annotations

import math
import pathlib
import time
from collections import deque

import torch

from ...engine import Engine
from ...errors import require
from ..report_kit import markdown_table, meta_lines, pyplot
from .methods import _FirstTokenTimer, divergence, first_difference, truncate_at_eos
from .peers import BATCH_PEER_METHODS

DRAFTERS = ("prompt-lookup", "ngram", "head", "select", "draft-model")
METHODS = ("hf-generate", "hf-generate-batch", "engine", *(f"engine-{d}" for d in DRAFTERS), *BATCH_PEER_METHODS)


def percentile(values: list[float], q: float) -> float | None:
    values = sorted(v for v in values if v is not None and not math.isnan(v))
    if not values:
        return None
    return values[min(len(values) - 1, max(0, math.ceil(q / 100 * len(values)) - 1))]


def run_engine(
    target,
    prompts: list[list[int]],
    concurrency: int,
    max_new_tokens: int,
    *,
    drafter="none",
    draft=None,
    max_batch_tokens=256,
    packed_weights=True,
    prefix_cache_tokens=0,
    max_decode_slowdown=math.inf,
    on_done=None,
    warmup: list[list[int]] = (),
) -> dict:
    """Closed loop over an Engine: at most `concurrency` requests in flight. The engine first serves `warmup`
    (other prompts) untimed: a server's steady state, with step costs and acceptance already learned."""
    engine = make_engine(
        target,
        drafter,
        concurrency,
        draft=draft,
        max_batch_tokens=max_batch_tokens,
        packed_weights=packed_weights,
        prefix_cache_tokens=prefix_cache_tokens,
        max_decode_slowdown=max_decode_slowdown,
    )
    if warmup:  # closed_loop counts from where the counters stand
        engine.generate_many(list(warmup)[:concurrency], max_new_tokens=max_new_tokens)
    return closed_loop(engine, prompts, concurrency, max_new_tokens, on_done)


def engine_drafter(method: str) -> str:
    """The drafter of an engine method: none for `engine`, X for `engine-X`."""
    return "none" if method == "engine" else method.removeprefix("engine-")


def make_engine(
    target,
    drafter: str,
    concurrency: int,
    *,
    draft=None,
    max_batch_tokens=256,
    packed_weights=True,
    prefix_cache_tokens=0,
    max_decode_slowdown=math.inf,
) -> Engine:
    """The Engine a bench run measures: `concurrency` sequences at most, prefix cache off unless asked, warmed up as
    a server warms its engine (Engine.warm_up). The n-gram drafter's process-wide store starts empty for every engine
    made."""
    from ...drafters.ngram import NGramDrafter

    NGramDrafter._shared.clear()
    engine = Engine(
        target,
        drafter=drafter,
        draft_model=draft.model if draft is not None and drafter == "draft-model" else None,
        max_batch_tokens=max_batch_tokens,
        max_sequences=concurrency,
        packed_weights=packed_weights,
        prefix_cache_tokens=prefix_cache_tokens,
        max_decode_slowdown=max_decode_slowdown,
    )
    engine.warm_up()
    return engine


def closed_loop(
    engine, prompts: list, concurrency: int, max_new_tokens: int, on_done=None, seeds=None, **options
) -> dict:
    """Decode `prompts` (token ids, strings or chat messages) on `engine` with at most `concurrency` in flight, a new
    request sent whenever one finishes; the record of tokens, timings, failed requests and the engine's counters over
    the run. `options`: more request settings for every request (RequestParams fields); `seeds`: each prompt's."""
    start_counters = dict(engine.counters)
    n = len(prompts)
    sent, first, end = [0.0] * n, [None] * n, [0.0] * n
    tokens: list[list[int]] = [[] for _ in range(n)]
    pending, in_flight, forwards, failed = deque(range(n)), [0], [0], [0]

    def on_output(i, out):
        now = time.perf_counter()
        if out.new_token_ids and first[i] is None:
            first[i] = now
        tokens[i] += out.new_token_ids
        if out.finished:
            end[i] = now
            in_flight[0] -= 1
            forwards[0] += out.stats.forward_passes
            failed[0] += out.error is not None
            if on_done:
                on_done()

    start = time.perf_counter()
    while pending or engine.has_work:
        while pending and in_flight[0] < concurrency:
            i = pending.popleft()
            sent[i] = time.perf_counter()
            seed = {} if seeds is None else {"seed": seeds[i]}
            engine.add_request(
                prompts[i], max_new_tokens=max_new_tokens, on_output=lambda o, i=i: on_output(i, o), **seed, **options
            )
            in_flight[0] += 1
        engine.step()
    wall = time.perf_counter() - start
    counted = {k: v - start_counters.get(k, 0) for k, v in engine.metrics().items() if k in start_counters}
    drafted, accepted = counted["spec_decode_num_draft_tokens"], counted["spec_decode_num_accepted_tokens"]
    return _record(
        tokens,
        sent,
        first,
        end,
        wall,
        {
            "steps": counted["steps"],
            "forwards": forwards[0],
            "draft_tokens": drafted,
            "failed": failed[0],
            "acceptance": accepted / drafted if drafted else None,
            "speculation": engine.metrics()["speculation"],  # the gate's arms per load level at the run's end
        },
    )


def run_hf_generate(target, prompts: list[list[int]], max_new_tokens: int, on_done=None) -> dict:
    """HF `generate`, greedy, one request after another (latency excludes waiting for the previous ones)."""
    n = len(prompts)
    sent, first, end, tokens = [0.0] * n, [None] * n, [0.0] * n, []
    start = time.perf_counter()
    for i, ids in enumerate(prompts):
        sent[i] = time.perf_counter()
        timer = _FirstTokenTimer(sent[i])
        with torch.inference_mode():
            out = target.model.generate(
                torch.tensor([ids]),
                attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                streamer=timer,
                pad_token_id=target.tokenizer.pad_token_id or 0,
            )
        end[i] = time.perf_counter()
        first[i] = None if timer.first is None else sent[i] + timer.first
        tokens.append(truncate_at_eos(out[0, len(ids) :].tolist(), target.eos_token_ids))
        if on_done:
            on_done()
    return _record(tokens, sent, first, end, time.perf_counter() - start, {})


def run_hf_generate_batch(
    target, prompts: list[list[int]], concurrency: int, max_new_tokens: int, max_batch_tokens: int
) -> dict:
    """HF's continuous batching (`generate_batch`), at most `concurrency` requests per batch."""
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    config = GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=list(target.eos_token_ids),
        pad_token_id=target.tokenizer.pad_token_id or 0,
    )
    cb = ContinuousBatchingConfig(max_batch_tokens=max_batch_tokens, max_requests_per_batch=concurrency)
    start = time.perf_counter()
    with torch.inference_mode():
        results = target.model.generate_batch(
            inputs=prompts,
            generation_config=config,
            continuous_batching_config=cb,
            record_timestamps=True,
            progress_bar=False,
        )
    wall = time.perf_counter() - start
    ordered = sorted(results.values(), key=lambda r: int(str(r.request_id).rsplit("_", 1)[-1]))
    require(
        len(ordered) == len(prompts) and all(r.error is None for r in ordered),
        "generate_batch did not return every request: " + "; ".join(str(r.error) for r in ordered if r.error),
    )
    tokens = [truncate_at_eos(list(r.generated_tokens), target.eos_token_ids) for r in ordered]
    sent = [r.created_time for r in ordered]
    first = [r.timestamps[0] if r.timestamps else None for r in ordered]
    end = [r.lifespan[1] for r in ordered]
    return _record(tokens, sent, first, end, wall, {})


def _record(tokens, sent, first, end, wall: float, extra: dict) -> dict:
    ttft = [None if f is None else f - s for f, s in zip(first, sent)]
    tpot = [(e - f) / (len(t) - 1) if f is not None and len(t) > 1 else None for t, f, e in zip(tokens, first, end)]
    e2e = [e - s for e, s in zip(end, sent)]
    out_tokens = sum(map(len, tokens))
    return {
        "tokens": tokens,
        "wall": wall,
        "output_tokens": out_tokens,
        "output_tok_s": out_tokens / wall,
        "requests_s": len(tokens) / wall,
        **{
            f"{name}_p{q}": percentile(values, q)
            for name, values in (("ttft", ttft), ("tpot", tpot), ("e2e", e2e))
            for q in (50, 99)
        },
        **extra,
    }


def rotated(items: list, by: int) -> list:
    """`items` rotated left by `by` places: turn `by` of an interleaving that changes who goes first each turn."""
    return items[by % len(items) :] + items[: by % len(items)] if items else []


def interleaved_runs(methods: list[str], concurrency: list[int], repeats: int) -> list[tuple[str, int]]:
    """(method, concurrency) in the order to run them: per repeat, every method at one concurrency before the next,
    the methods' order rotated by one each repeat, so that a drift of the machine's speed (another tenant, heat)
    falls on all methods alike and a ratio between methods of the same repeat compares like with like.
    hf-generate (one request at a time: concurrency does not apply) runs once, first."""
    runs = [("hf-generate", concurrency[0])] if "hf-generate" in methods else []
    others = [m for m in methods if m != "hf-generate"]
    for repeat in range(repeats):
        turn = rotated(others, repeat)
        runs += [(m, c) for c in concurrency for m in turn]
    return runs


def combine_repeats(records: dict[tuple[str, int], list[dict | None]]) -> dict[tuple[str, int], dict]:
    """One row per (method, concurrency) from its repeats, in the order given: the median run (by tok/s; the lower
    one of an even count), with every run's tok/s, and each repeat's ratio to the engine's run of the same repeat.
    A repeat that did not run (None) is left out; outputs count as identical only where every repeat's were."""
    rows = {}
    for key, runs in records.items():
        done = [r for r in runs if r is not None]
        if not done:
            continue
        median = sorted(done, key=lambda r: r["output_tok_s"])[(len(done) - 1) // 2]
        worst = min(done, key=lambda r: r.get("identical", 0))
        row = dict(median, runs_tok_s=[r["output_tok_s"] for r in done])
        row.update(identical=worst.get("identical"), mismatches=worst.get("mismatches", []))
        plain = records.get(("engine", key[1]), []) if key[0] != "hf-generate" else []  # it ran once, alone
        pairs = [(r, e) for r, e in zip(runs, plain) if r is not None and e is not None]
        if pairs:
            row["vs_engine_runs"] = [r["output_tok_s"] / e["output_tok_s"] for r, e in pairs]
        rows[key] = row
    return rows


def check_against(target, prompts, reference: list[list[int]], record: dict) -> None:
    """Count outputs identical to the reference; describe each mismatch by the top-2 margin where it starts."""
    mismatches = []
    for ids, ref, got in zip(prompts, reference, record["tokens"]):
        if first_difference(ref, got) is not None:
            mismatches.append(divergence(_Ctx(target), ids, ref, got))
    record["identical"] = len(prompts) - len(mismatches)
    record["mismatches"] = mismatches


class _Ctx:
    def __init__(self, target):
        self.target = target


def _median_and_range(values: list[float], spec: str, range_spec: str, unit: str = "") -> str:
    """'m' for one value; 'm (lo–hi)' for several (m: the lower median, as combine_repeats picks its run)."""
    m = sorted(values)[(len(values) - 1) // 2]
    if len(values) == 1:
        return f"{m:{spec}}{unit}"
    return f"{m:{spec}}{unit} ({min(values):{range_spec}}–{max(values):{range_spec}})"


def write_outputs(out: pathlib.Path, meta: dict, rows: list[dict], notes: list[str]) -> list[pathlib.Path]:
    """results.json, report.md and throughput.png (output tokens/s against concurrency, a line per method)."""
    import json

    out.mkdir(parents=True, exist_ok=True)
    public = [{k: v for k, v in r.items() if k != "tokens"} for r in rows]
    (out / "results.json").write_text(json.dumps({"meta": meta, "runs": public, "notes": notes}, indent=2))
    fmt = lambda x, spec: "–" if x is None else format(x, spec)  # noqa: E731
    header = [
        "method",
        "concurrency",
        "output tok/s",
        "vs engine",
        "requests/s",
        "TTFT p50 / p99 (s)",
        "TPOT p50 / p99 (ms)",
        "e2e p50 / p99 (s)",
        "tokens / forward (per sequence)",
        "identical to solo greedy",
        "peak RSS MiB",
    ]
    plain = {r["concurrency"]: r["output_tok_s"] for r in rows if r["method"] == "engine"}
    table = []
    for r in rows:
        ratios = r.get("vs_engine_runs") or (
            [r["output_tok_s"] / plain[r["concurrency"]]] if r["concurrency"] in plain else []
        )
        per_forward = r["output_tokens"] / r["forwards"] if r.get("forwards") else None
        table.append(
            [
                r["method"],
                r["concurrency"],
                _median_and_range(r.get("runs_tok_s") or [r["output_tok_s"]], ".2f", ".1f"),
                _median_and_range(ratios, ".2f", ".2f", "×") if ratios else "–",
                f"{r['requests_s']:.3f}",
                f"{fmt(r['ttft_p50'], '.2f')} / {fmt(r['ttft_p99'], '.2f')}",
                f"{fmt(r['tpot_p50'] and 1000 * r['tpot_p50'], '.0f')} / "
                f"{fmt(r['tpot_p99'] and 1000 * r['tpot_p99'], '.0f')}",
                f"{fmt(r['e2e_p50'], '.2f')} / {fmt(r['e2e_p99'], '.2f')}",
                fmt(per_forward, ".2f"),
                f"{r.get('identical', '–')} of {len(r['tokens'])}",
                fmt(r.get("peak_rss_mb"), ".0f"),
            ]
        )
    lines = [
        "# leapdecode bench-batch",
        "",
        *meta_lines(meta),
        "",
        *(f"> {n}" for n in notes),
        "",
        *markdown_table(header, table),
    ]
    mismatched = [(r["method"], r["concurrency"], m) for r in rows for m in r.get("mismatches", [])]
    if mismatched:
        lines += ["", "## Outputs that differ from solo greedy", ""]
        lines += markdown_table(
            ["method", "C", "position", "top-2 margin", "tie margin"],
            [[m, c, d.get("position"), d.get("top2_margin"), d.get("tie_margin")] for m, c, d in mismatched],
        )
    (out / "report.md").write_text("\n".join(lines) + "\n")
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for method in dict.fromkeys(r["method"] for r in rows):
        points = sorted((r["concurrency"], r["output_tok_s"]) for r in rows if r["method"] == method)
        ax.plot(*zip(*points), marker="o", label=method)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrency (requests in flight)")
    ax.set_ylabel("output tokens/s")
    ax.set_title(f"{meta.get('target model', '')}: throughput against concurrency")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "throughput.png", dpi=120)
    plt.close(fig)
    return [out / "results.json", out / "report.md", out / "throughput.png"]
