"""Two engine scenarios of `bench-batch --scenario`:

- `prefill-stall` (SARATHI's claim): streams are decoding when a long prompt arrives. Without chunking its whole
  prefill runs in one step and every stream stalls for it; with chunks of at most `max_batch_tokens` rows the
  streams keep getting a token every step (the engine sizes chunks so that such a step costs at most twice a
  decode-only step, from its measured step costs). Measured: the p99 gap between a stream's consecutive outputs, with no long
  prompt, with it chunked, and with it read at once.
- `prefix-reuse` (the prefix cache): time to first token of a request whose prompt shares a long prefix with an
  earlier one, cold (cache off) and warm (the earlier request left the prefix's keys/values in the cache).
- `paired`: engine methods compared on a host whose speed drifts. Whole runs of each method minutes apart carry
  that drift into their ratio (docs/benchmarks.md shows how much on a shared 2-core host); here, per concurrency,
  one engine per method is built and warmed up once, the prompts go in slices of 2 x C, and every slice is run by
  each method in turn (a closed loop of C, the order rotated per slice), so a drift falls on all methods alike
  within seconds. A second plain engine runs every slice too (the A/A control): two identical engines differ
  by what the host and the engines' timing-adapted plans (prompt chunk sizes, streams per step) make of the same
  requests, so its ratio to `engine` is the noise any other ratio must be read against. Each ratio comes with a
  ~95 % interval over its slices.
"""

from __future__ import annotations

import math
import statistics
import time

from ...engine import Engine
from .batch import check_against, closed_loop, engine_drafter, make_engine, percentile, rotated
from .intervals import ratio_interval


def long_prompt(tokenizer, texts: list[str], tokens: int) -> list[int]:
    """A prompt of exactly `tokens` token ids made of the suite's own texts, repeated as needed."""
    ids: list[int] = []
    while len(ids) < tokens:
        for text in texts:
            ids += tokenizer(text + "\n", add_special_tokens=False)["input_ids"]
    return ids[:tokens]


def prefill_stall(
    target,
    prompts: list[list[int]],
    long: list[int],
    streams: int,
    max_new_tokens: int,
    max_batch_tokens: int,
    drafter: str = "none",
) -> dict:
    """p99 gap between outputs of `streams` decoding requests: alone, with `long` arriving chunked, and unchunked."""
    results = {}
    for label, budget, slowdown, add_long in (
        ("no long prompt", max_batch_tokens, 2.0, False),
        (f"chunked (at most {max_batch_tokens} rows, steps within 2x a decode step)", max_batch_tokens, 2.0, True),
        ("unchunked (whole prompt in one step)", len(long) + streams * 17, float("inf"), True),
    ):
        engine = Engine(
            target,
            drafter=drafter,
            max_batch_tokens=budget,
            max_sequences=streams + 1,
            prefix_cache_tokens=0,
            max_decode_slowdown=slowdown,
        )
        last: dict[int, float] = {}
        gaps: list[float] = []

        def on_output(out, last=last, gaps=gaps):
            now = time.perf_counter()
            if out.new_token_ids and out.request_id in last:
                gaps.append((now - last[out.request_id]) / len(out.new_token_ids))
            last[out.request_id] = now

        for i in range(streams):
            engine.add_request(prompts[i % len(prompts)], max_new_tokens=max_new_tokens, on_output=on_output)
        steps, long_done = 0, [False]
        while engine.has_work:
            engine.step()
            steps += 1
            if steps == 8:  # every stream is decoding by now: measure from here (the long prompt's arrival) on
                gaps.clear()
            if steps == 8 and add_long:
                engine.add_request(long, max_new_tokens=1, on_output=lambda out: long_done.__setitem__(0, out.finished))  # noqa: B023 - called at once, in this iteration
            if add_long and long_done[0]:
                break
        results[label] = {
            "p99_gap_ms": 1000 * (percentile(gaps, 99) or 0.0),
            "p50_gap_ms": 1000 * (percentile(gaps, 50) or 0.0),
        }
    base = results["no long prompt"]["p99_gap_ms"]
    for row in results.values():
        row["p99_vs_no_long_prompt"] = row["p99_gap_ms"] / base if base else None
    return results


def prefix_reuse(target, prefix: list[int], questions: list[list[int]], max_new_tokens: int = 8) -> dict:
    """TTFT of prefix + questions[1] cold (no cache) and warm (after prefix + questions[0] filled the cache)."""

    def ttft(engine: Engine, prompt: list[int]) -> float:
        start = time.perf_counter()
        for out in engine.stream(engine.add_request(prompt, max_new_tokens=max_new_tokens)):
            if out.new_token_ids:
                return time.perf_counter() - start
        return float("nan")

    warm_up = Engine(target, prefix_cache_tokens=0)
    ttft(warm_up, questions[0])  # kernels warmed up, nothing cached
    cold = ttft(Engine(target, prefix_cache_tokens=0), prefix + questions[1])
    engine = Engine(target, prefix_cache_tokens=len(prefix) + 256)
    ttft(engine, prefix + questions[0])
    warm = ttft(engine, prefix + questions[1])
    return {
        "prefix tokens": len(prefix),
        "cold TTFT (s)": cold,
        "warm TTFT (s)": warm,
        "warm / cold": warm / cold,
        "cache hits": engine.prefix_cache.hits,
    }


CONTROL = "engine (A/A control)"


def paired(
    target,
    prompts: list[list[int]],
    methods: list[str],
    concurrency: list[int],
    max_new_tokens: int,
    max_batch_tokens: int,
    warmup: list[list[int]],
    reference: list[list[int]] | None,
    max_decode_slowdown: float = math.inf,
    sampling: dict | None = None,
) -> dict:
    """Per method and concurrency (and the A/A control, a second `engine`): output tok/s over all slices, its ratio
    to `engine` over all slices, the median of the per-slice ratios and their ~95 % interval, and how many outputs
    equal `reference` (each prompt decoded alone). With `sampling` (temperature, top_p) every request samples with
    its prompt's index as its seed, and outputs are compared with `engine`'s instead: a seeded request draws the same
    tokens whatever was drafted and whatever ran beside it."""
    sampling = sampling or {}
    table = {}
    arms = [*methods, CONTROL]
    for c in concurrency:
        engines = {
            m: make_engine(
                target,
                engine_drafter(m) if m != CONTROL else "none",
                c,
                max_batch_tokens=max_batch_tokens,
                max_decode_slowdown=max_decode_slowdown,
            )
            for m in arms
        }
        for engine in engines.values():  # a server's steady state: step costs and acceptance already learned
            engine.generate_many(list(warmup)[:c], max_new_tokens=max_new_tokens, **sampling)
        slices = [range(i, min(i + 2 * c, len(prompts))) for i in range(0, len(prompts), 2 * c)]
        runs: dict[str, list[tuple[int, float]]] = {m: [] for m in arms}
        tokens: dict[str, list] = {m: [None] * len(prompts) for m in arms}
        for j, part in enumerate(slices):
            for m in rotated(arms, j):
                seeds = list(part) if sampling else None  # a prompt's index
                record = closed_loop(engines[m], [prompts[i] for i in part], c, max_new_tokens, seeds=seeds, **sampling)
                runs[m].append((record["output_tokens"], record["wall"]))
                for i, out in zip(part, record["tokens"]):
                    tokens[m][i] = out
        rate = {m: sum(n for n, _ in runs[m]) / sum(w for _, w in runs[m]) for m in arms}
        for m in arms:
            checked = {"tokens": tokens[m]}
            check_against(target, prompts, tokens["engine"] if sampling else reference, checked)
            per_slice = [(n / w) / (ne / we) for (n, w), (ne, we) in zip(runs[m], runs["engine"])]
            interval = None if m == "engine" else ratio_interval(per_slice)
            table[f"{m} @ {c}"] = {
                "output tok/s": rate[m],
                "x engine": rate[m] / rate["engine"],
                "x engine, median slice": statistics.median(per_slice),
                "x engine, ~95 % interval": None if interval is None else [round(v, 3) for v in interval],
                "slices": len(slices),
                ("identical to engine, same seeds" if sampling else "identical to solo greedy"): (
                    f"{checked['identical']} of {len(prompts)}"
                ),
            }
    return table
