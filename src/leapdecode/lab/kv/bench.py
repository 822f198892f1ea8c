"""bench-kv: for each prompt length, every press at every budget against the full cache, on the same prompts.

Per sample: one full prefill (timed; it also remembers the last queries of each layer); StreamingLLM, SnapKV and
quantized KV compress a copy of that cache, which is exactly what their `prefill` does, so their prefill time is
the full prefill plus their measured compression; FastKV runs its own prefill (timed). Then each configuration
answers the needle by greedy decoding (timed token by token: decode tokens/s) or, for documents, is teacher-forced
along the full cache's greedy continuation (top-1 agreement, and the identical greedy prefix it implies).
Configurations run interleaved sample by sample, so machine noise hits them alike; compare speeds as ratios.
"""

from __future__ import annotations

import ast
import copy
import re
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import torch
from transformers import DynamicCache

from ...errors import require
from ...kv import KV_PRESSES, kv_bytes, make_press
from ...kv.base import full_prefill
from ...runner import Runner
from ..report_kit import environment
from .needle import Sample, depths, document_prompt, needle_prompt


@dataclass
class BenchSettings:
    model: str = "smollm2-135m"
    presses: list[str] = field(default_factory=lambda: list(KV_PRESSES))  # "name" or "name:key=value:..."
    budgets: list[float] = field(default_factory=lambda: [0.5, 0.25])
    lengths: list[int] = field(default_factory=lambda: [1024, 2048, 4096, 8192])
    needles: int = 4
    documents: int = 1
    answer_tokens: int = 8
    continuation: int = 32
    dtype: str = "float32"
    seed: int = 0
    threads: int | None = None


def parse_press(spec: str) -> tuple[str, str, dict]:
    """'fastkv:tsp_layer=9:tsp_rate=0.1' -> (label, name, options)."""
    name, *pairs = spec.strip().split(":")
    options = {}
    for pair in pairs:
        require("=" in pair, f"press option '{pair}' in '{spec}' must look like key=value")
        key, value = pair.split("=", 1)
        try:
            options[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            options[key] = value
    return spec.strip(), name, options


class _Clock:
    """Wall time and this process's CPU time (all threads) since start: on a shared machine the CPU time of a
    computation stays close to its unshared cost while the wall time stretches with other people's load."""

    def __init__(self):
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def read(self) -> tuple[float, float]:
        return time.perf_counter() - self.wall, time.process_time() - self.cpu


def _greedy(runner: Runner, logits: torch.Tensor, count: int) -> tuple[list[int], float, int]:
    """Greedy tokens from prefill logits; returns (tokens, (wall, cpu) seconds in single-token forwards, forwards)."""
    tokens = [int(logits.argmax())]
    clock = _Clock()
    for _ in range(count - 1):
        tokens.append(int(runner.forward([tokens[-1]])[-1].argmax()))
    return tokens, clock.read(), count - 1


def _first_number(text: str) -> str:
    match = re.search(r"\d+", text)
    return match.group(0) if match else ""


class _Evaluator:
    def __init__(self, model, tokenizer, settings: BenchSettings):
        self.model, self.tokenizer, self.settings = model, tokenizer, settings

    def score(self, runner: Runner, logits: torch.Tensor, sample: Sample, reference: list[int] | None) -> dict:
        if sample.kind == "needle":
            tokens, seconds, forwards = _greedy(runner, logits, self.settings.answer_tokens)
            text = self.tokenizer.decode(tokens, skip_special_tokens=True)
            return {
                "correct": _first_number(text) == sample.answer,
                "output": text,
                "decode_s": seconds[0],
                "decode_cpu_s": seconds[1],
                "decode_tokens": forwards,
            }
        if reference is None:  # the full cache: its greedy continuation is the reference
            tokens, seconds, forwards = _greedy(runner, logits, self.settings.continuation)
            return {"reference": tokens, "agreement": 1.0, "identical_prefix": 1.0}
        predicted = [int(logits.argmax())] + runner.forward(reference[:-1]).argmax(-1).tolist()
        same = [a == b for a, b in zip(predicted, reference)]
        prefix = same.index(False) if False in same else len(same)
        return {"agreement": sum(same) / len(same), "identical_prefix": prefix / len(same)}


def _runner_over(model, cache, n: int) -> Runner:
    runner = Runner(model)
    runner.use_cache(cache, n)
    return runner


def run_bench(settings: BenchSettings, log: Callable[[str], None] = print) -> dict:
    from ...models import load_model

    require(
        settings.budgets and all(0 < b <= 1 for b in settings.budgets),
        f"budgets must be in (0, 1], got {settings.budgets}",
    )
    require(settings.lengths and all(n >= 64 for n in settings.lengths), "prompt lengths must be at least 64 tokens")
    require(
        settings.needles >= 0 and settings.documents >= 0 and settings.needles + settings.documents > 0,
        "bench-kv needs at least one needle or one document per length",
    )
    if settings.threads:
        torch.set_num_threads(settings.threads)
    loaded = load_model(settings.model, dtype=settings.dtype)
    model, tokenizer = loaded.model, loaded.tokenizer
    configs = []
    for spec in settings.presses:
        label, name, options = parse_press(spec)
        for budget in settings.budgets:
            press = make_press(name, budget=budget, **options)
            press.check(model)
            configs.append((label, press))
    window = max([p.window for _, p in configs if p.name == "snapkv"] or [0])
    context = loaded.context_length
    room = context - max(settings.continuation, settings.answer_tokens) - 1
    evaluator = _Evaluator(model, tokenizer, settings)
    records: list[dict] = []
    with torch.inference_mode():
        full_prefill(model, torch.tensor([tokenizer("warm up " * 32)["input_ids"]]), DynamicCache(config=model.config))
        for length in settings.lengths:
            target = min(length, room)
            if target < length:
                log(f"length {length}: {loaded.name} has a context of {context} tokens; prompts of {target} tokens")
            samples = [
                needle_prompt(tokenizer, target, d, seed=settings.seed * 1000 + length + i)
                for i, d in enumerate(depths(settings.needles))
            ]
            samples += [document_prompt(tokenizer, target, settings.seed + i) for i in range(settings.documents)]
            for index, sample in enumerate(samples):
                start = time.perf_counter()
                rows = _run_sample(model, sample, configs, window, evaluator, tokenizer)
                for row in rows:
                    records.append(
                        {
                            "length": length,
                            "sample": index,
                            "kind": sample.kind,
                            "depth": sample.depth,
                            "tokens": sample.tokens,
                            **row,
                        }
                    )
                log(
                    f"length {length} sample {index} ({sample.kind}, {sample.tokens} tokens): "
                    f"{time.perf_counter() - start:.1f}s; " + ", ".join(_brief(r) for r in rows)
                )
    return {
        "settings": asdict(settings),
        "machine": environment(torch.get_num_threads()),
        "model": loaded.name,
        "records": records,
        "summary": summarize(records),
    }


def _brief(row: dict) -> str:
    mark = "" if "correct" not in row else ("ok" if row["correct"] else "miss")
    if "agreement" in row:
        mark = f"{row['agreement']:.2f}"
    label = "full" if row["press"] == "full" else f"{row['press']}@{row['budget']}"
    return f"{label} {row['prefill_s']:.1f}s {mark}"


def _run_sample(model, sample: Sample, configs, window: int, evaluator: _Evaluator, tokenizer) -> list[dict]:
    ids = tokenizer(sample.text)["input_ids"]
    n = len(ids)
    input_ids = torch.tensor([ids])
    cache = DynamicCache(config=model.config)
    clock = _Clock()
    logits, windows = full_prefill(model, input_ids, cache, window=window)
    full_seconds = clock.read()
    pristine = copy.deepcopy(cache)
    full_bytes = kv_bytes(cache)
    full = evaluator.score(_runner_over(model, cache, n), logits, sample, None)
    reference = full.pop("reference", None)
    rows = [
        {
            "press": "full",
            "budget": 1.0,
            "prefill_s": full_seconds[0],
            "prefill_cpu_s": full_seconds[1],
            "kv_bytes": full_bytes,
            "full_kv_bytes": full_bytes,
            "kept": n,
            **full,
        }
    ]
    for label, press in configs:
        if press.posthoc:
            cache = copy.deepcopy(pristine)
            clock = _Clock()
            press.compress(cache, n, windows, model)
            seconds = tuple(a + b for a, b in zip(full_seconds, clock.read()))
            runner, press_logits = _runner_over(model, cache, n), logits
        else:
            runner = Runner(model, press=press)
            clock = _Clock()
            press_logits = runner.prefill(ids)
            seconds = clock.read()
        row = {
            "press": label,
            "budget": press.budget,
            "prefill_s": seconds[0],
            "prefill_cpu_s": seconds[1],
            "kv_bytes": kv_bytes(runner.cache),
            "full_kv_bytes": full_bytes,
            "kept": press.kept(n),
        }
        row.update(evaluator.score(runner, press_logits, sample, reference))
        rows.append(row)
    return rows


def summarize(records: list[dict]) -> list[dict]:
    """One row per (length, press, budget): accuracy, agreement, KV fraction, and speed as the median over samples
    of the ratio to the full cache on the same sample (robust to the load of a shared machine changing)."""
    full = {(r["length"], r["sample"]): r for r in records if r["press"] == "full"}
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault((r["length"], r["press"], r["budget"]), []).append(r)
    out = []
    for (length, press, budget), rows in groups.items():
        base = [full[(length, r["sample"])] for r in rows]
        needles = [r for r in rows if r["kind"] == "needle"]
        docs = [r for r in rows if r["kind"] == "document"]
        decode_rates = [r["decode_tokens"] / r["decode_s"] for r in needles if r.get("decode_s")]
        prefill_ratios = [b["prefill_s"] / r["prefill_s"] for b, r in zip(base, rows)]
        cpu_ratios = [b["prefill_cpu_s"] / r["prefill_cpu_s"] for b, r in zip(base, rows) if r.get("prefill_cpu_s")]
        decode_cpu = [
            (r["decode_cpu_s"] and b["decode_cpu_s"] / r["decode_cpu_s"]) or None
            for b, r in zip(base, rows)
            if r.get("decode_cpu_s") and b.get("decode_cpu_s")
        ]
        decode_ratios = [
            (r["decode_tokens"] / r["decode_s"]) / (b["decode_tokens"] / b["decode_s"])
            for b, r in zip(base, rows)
            if r.get("decode_s") and b.get("decode_s")
        ]
        out.append(
            {
                "length": length,
                "press": press,
                "budget": budget,
                "samples": len(rows),
                "tokens": round(sum(r["tokens"] for r in rows) / len(rows)),
                "kv_bytes": round(sum(r["kv_bytes"] for r in rows) / len(rows)),
                "kv_fraction": sum(r["kv_bytes"] / r["full_kv_bytes"] for r in rows) / len(rows),
                "prefill_s": statistics.median(r["prefill_s"] for r in rows),
                "prefill_speedup": statistics.median(prefill_ratios),
                "prefill_cpu_speedup": statistics.median(cpu_ratios) if cpu_ratios else None,
                "decode_tok_s": statistics.median(decode_rates) if decode_rates else None,
                "decode_speedup": statistics.median(decode_ratios) if decode_ratios else None,
                "decode_cpu_speedup": statistics.median(decode_cpu) if decode_cpu else None,
                "needle_accuracy": sum(r["correct"] for r in needles) / len(needles) if needles else None,
                "needles": len(needles),
                "agreement": sum(r["agreement"] for r in docs) / len(docs) if docs else None,
                "identical_prefix": sum(r["identical_prefix"] for r in docs) / len(docs) if docs else None,
            }
        )
    return out


def check_targets(summary: list[dict], length: int = 4096) -> list[dict]:
    """The issue's targets for FastKV at `length`: >= 1.5x prefill, <= 50 % KV bytes, needle accuracy within
    2 points of the full cache."""
    full = next((s for s in summary if s["length"] == length and s["press"] == "full"), None)
    rows = []
    for s in summary:
        if s["length"] != length or not s["press"].startswith("fastkv") or full is None:
            continue
        accuracy_ok = (
            s["needle_accuracy"] is not None
            and full["needle_accuracy"] is not None
            and s["needle_accuracy"] >= full["needle_accuracy"] - 0.02
        )
        rows.append(
            {
                "press": s["press"],
                "budget": s["budget"],
                "prefill": s["prefill_speedup"] >= 1.5,
                "prefill_cpu": s.get("prefill_cpu_speedup") is not None and s["prefill_cpu_speedup"] >= 1.5,
                "memory": s["kv_fraction"] <= 0.5005,
                "accuracy": accuracy_ok,
            }
        )  # ceil(budget * n) entries
    return rows
