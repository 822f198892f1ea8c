"""`dllm bench`: every decoder (at a few settings) on the held-out split, per task: accuracy (any valid answer counts),
forward passes (NFE), tokens per forward (TPF = gen length / NFE), wall time, AUP; JSON + Markdown + a PNG of accuracy
against NFE with the Pareto frontier.

AUP (Accuracy Under Parallelism, d3LLM): for one method's (TPF, accuracy %) points sorted by TPF, with
W(y) = min(exp(-alpha * (1 - y / y_max)), 1), alpha = 3, y_max the best accuracy of any method on that task, and
only points with y >= y_max - 5 kept: AUP = rho_1 * y_1 * W(y_1) + sum_i (rho_i - rho_{i-1}) * (y_i W(y_i) +
y_{i-1} W(y_{i-1})) / 2. It rewards parallelism only while accuracy stays close to the best.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from ...diffusion.decoders import (
    CreditDecoder,
    EGPDecoder,
    FixedStepsDecoder,
    Learn2PDDecoder,
    PositionFilter,
    ProphetDecoder,
    ThresholdDecoder,
)
from ...diffusion.interface import DiffusionLM
from ...diffusion.loop import diffusion_decode
from ..report_kit import markdown_table, pyplot
from .tasks import GEN_LEN, TASKS, CharTokenizer, Example, check, encode_prompts, heldout_set


@dataclass
class Setting:
    family: str  # one curve in the plot / one AUP
    label: str  # one row in the tables
    make: Callable[[], object]
    eotp: bool = False
    oracle: bool = False  # needs the reference decode's final tokens


def aup(points: list[tuple[float, float]], y_max: float, alpha: float = 3.0, y_min_offset: float = 5.0) -> float:
    """Accuracy Under Parallelism of (tokens-per-forward, accuracy %) points; see the module docstring."""
    pts = sorted((r, y) for r, y in points if y >= y_max - y_min_offset)
    if not pts or y_max <= 0:
        return 0.0
    w = lambda y: min(math.exp(-alpha * (1 - y / y_max)), 1.0)  # noqa: E731
    total = pts[0][0] * pts[0][1] * w(pts[0][1])
    for (r0, y0), (r1, y1) in zip(pts, pts[1:]):
        total += (r1 - r0) * (y1 * w(y1) + y0 * w(y0)) / 2
    return total


def pareto_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """(NFE, accuracy) points not beaten by another with fewer-or-equal NFE and higher-or-equal accuracy."""
    front, best = [], -1.0
    for nfe, acc in sorted(points, key=lambda p: (p[0], -p[1])):
        if acc > best:
            front.append((nfe, acc))
            best = acc
    return front


def default_settings(filter_model: PositionFilter | None, gen_len: int = GEN_LEN) -> list[Setting]:
    s = [
        Setting("fixed_steps", f"fixed_steps k={k}", lambda k=k: FixedStepsDecoder(steps=gen_len // k))
        for k in (1, 2, 4, 8, 16)
    ]
    s += [Setting("threshold", f"threshold {t:g}", lambda t=t: ThresholdDecoder(t)) for t in (0.95, 0.9, 0.7, 0.5)]
    s += [
        Setting("threshold+eotp", f"threshold+eotp {t:g}", lambda t=t: ThresholdDecoder(t), eotp=True)
        for t in (0.95, 0.9, 0.7, 0.5)
    ]
    s += [Setting("credit", f"credit {t:g}", lambda t=t: CreditDecoder(t)) for t in (0.95, 0.9, 0.7)]
    s += [Setting("prophet", f"prophet x{c:g}", lambda c=c: ProphetDecoder(scale=c)) for c in (1.0, 0.5, 0.25)]
    if filter_model is not None:
        s += [
            Setting("learn2pd+eotp", f"learn2pd+eotp {t:g}", lambda t=t: Learn2PDDecoder(filter_model, t), eotp=True)
            for t in (0.95, 0.9, 0.8, 0.6)
        ]
    s += [Setting("egp+eotp (oracle)", "egp+eotp (oracle)", EGPDecoder, eotp=True, oracle=True)]
    return s


def run_setting(
    lm: DiffusionLM,
    tok: CharTokenizer,
    by_task: dict[str, list[Example]],
    setting: Setting,
    gen_len: int,
    block_len: int | None,
    batch_size: int,
    reference: dict[str, list[torch.Tensor]] | None = None,
) -> dict:
    """Per-task accuracy / NFE / TPF / wall time of one decoder setting; also returns final canvases per task."""
    per_task, finals = {}, {}
    for task, examples in by_task.items():
        correct, nfe, seconds, canvases = 0, 0, 0.0, []
        for bi, i in enumerate(range(0, len(examples), batch_size)):
            chunk = examples[i : i + batch_size]
            prompts = encode_prompts(tok, [e.prompt for e in chunk])
            ref = reference[task][bi] if (setting.oracle and reference) else None
            res = diffusion_decode(
                lm, prompts, gen_len, setting.make(), block_len=block_len, eotp=setting.eotp, reference=ref
            )
            gen = res.canvas[:, prompts.shape[1] :]
            correct += sum(check(e, tok.decode(g.tolist())) for e, g in zip(chunk, gen))
            nfe += int(res.nfe.sum())
            seconds += res.seconds
            canvases.append(res.canvas)
        n = len(examples)
        per_task[task] = {
            "accuracy": 100.0 * correct / n,
            "nfe": nfe / n,
            "tpf": gen_len * n / nfe,
            "ms_per_seq": 1000 * seconds / n,
        }
        finals[task] = canvases
    return {"per_task": per_task, "finals": finals}


def _mean(rows: dict, key: str) -> float:
    return sum(r[key] for r in rows.values()) / len(rows)


def run_bench(
    lm: DiffusionLM,
    out: str | Path,
    filter_model: PositionFilter | None,
    tasks: list[str] | None = None,
    per_task: int = 100,
    gen_len: int = GEN_LEN,
    block_len: int | None = None,
    batch_size: int = 100,
    seed: int = 1234,
    log=print,
) -> dict:
    tok = CharTokenizer()
    tasks = tasks or list(TASKS)
    examples = heldout_set(tasks, per_task, seed)
    by_task = {t: [e for e in examples if e.task == t] for t in tasks}
    settings = default_settings(filter_model, gen_len)
    results, reference = {}, None
    start = time.time()
    for setting in settings:
        r = run_setting(lm, tok, by_task, setting, gen_len, block_len, batch_size, reference)
        if reference is None:  # the first setting (one token per forward) is the reference decode
            reference = r["finals"]
        results[setting.label] = {
            "family": setting.family,
            "per_task": r["per_task"],
            "accuracy": _mean(r["per_task"], "accuracy"),
            "nfe": _mean(r["per_task"], "nfe"),
            "tpf": _mean(r["per_task"], "tpf"),
            "ms_per_seq": _mean(r["per_task"], "ms_per_seq"),
        }
        v = results[setting.label]
        log(
            f"{setting.label:24s} acc {v['accuracy']:5.1f}%  NFE {v['nfe']:5.2f}  TPF {v['tpf']:5.2f}"
            f"  ({time.time() - start:.0f} s)"
        )
    report = summarize(results, tasks, gen_len, per_task, block_len)
    write_outputs(report, Path(out))
    return report


def summarize(results: dict, tasks: list[str], gen_len: int, per_task: int, block_len: int | None) -> dict:
    egp = next((v for k, v in results.items() if k.startswith("egp")), None)
    for v in results.values():
        v["tpf_pct_of_egp"] = 100 * v["tpf"] / egp["tpf"] if egp else None
    families: dict[str, dict] = {}
    for v in results.values():
        families.setdefault(v["family"], {"settings": []})["settings"].append(v)
    y_max = {t: max(v["per_task"][t]["accuracy"] for v in results.values()) for t in tasks}
    y_max_mean = max(v["accuracy"] for v in results.values())
    for f in families.values():
        f["aup_per_task"] = {
            t: aup([(s["per_task"][t]["tpf"], s["per_task"][t]["accuracy"]) for s in f["settings"]], y_max[t])
            for t in tasks
        }
        f["aup_mean_over_tasks"] = sum(f["aup_per_task"].values()) / len(tasks)
        f["aup_of_task_means"] = aup([(s["tpf"], s["accuracy"]) for s in f["settings"]], y_max_mean)
        del f["settings"]
    return {
        "gen_len": gen_len,
        "block_len": block_len or gen_len,
        "heldout_per_task": per_task,
        "tasks": tasks,
        "multi_answer_tasks": [t for t in tasks if TASKS[t].multi_answer],
        "settings": results,
        "families": families,
    }


def markdown(report: dict) -> str:
    tasks, s = report["tasks"], report["settings"]
    lines = [
        f"Held-out split: {report['heldout_per_task']} prompts per task, gen length {report['gen_len']}, "
        f"block length {report['block_len']}. TPF = gen length / NFE. Multi-answer tasks: "
        f"{', '.join(report['multi_answer_tasks'])}.",
        "",
    ]
    lines += markdown_table(
        ["decoder", "accuracy %", "NFE", "TPF", "ms / seq", "TPF % of EGP"],
        [
            [
                label,
                f"{v['accuracy']:.1f}",
                f"{v['nfe']:.2f}",
                f"{v['tpf']:.2f}",
                f"{v['ms_per_seq']:.1f}",
                f"{v['tpf_pct_of_egp']:.0f}" if v["tpf_pct_of_egp"] is not None else "-",
            ]
            for label, v in s.items()
        ],
    )
    lines += ["", "AUP per decoder family (d3LLM definition; per task, then averaged):", ""]
    lines += markdown_table(
        ["family", *tasks, "mean"],
        [
            [fam, *(f"{f['aup_per_task'][t]:.0f}" for t in tasks), f"{f['aup_mean_over_tasks']:.0f}"]
            for fam, f in report["families"].items()
        ],
    )
    lines += parallelism_cost(report)
    for key, title in (("accuracy", "Accuracy % per task"), ("nfe", "NFE per task")):
        lines += ["", f"{title}:", ""]
        lines += markdown_table(
            ["decoder", *tasks], [[label, *(f"{v['per_task'][t][key]:.1f}" for t in tasks)] for label, v in s.items()]
        )
    return "\n".join(lines) + "\n"


def headline(report: dict) -> dict:
    """Against the reference (one token per forward): for Learn2PD+EoTP and the threshold decoders, the setting with
    the fewest forwards whose mean accuracy is within 1 point of the reference, and each one's speedup."""
    s = report["settings"]
    ref_label = next(iter(s))
    ref = s[ref_label]
    out = {"reference": {"label": ref_label, "accuracy": ref["accuracy"], "nfe": ref["nfe"]}}
    for fam in ("learn2pd+eotp", "threshold", "threshold+eotp"):
        ok = [
            (v["nfe"], label) for label, v in s.items() if v["family"] == fam and v["accuracy"] >= ref["accuracy"] - 1.0
        ]
        if ok:
            nfe, label = min(ok)
            out[fam] = {"label": label, "accuracy": s[label]["accuracy"], "nfe": nfe, "speedup": ref["nfe"] / nfe}
        else:
            out[fam] = None
    return out


def parallelism_cost(report: dict) -> list[str]:
    """Markdown: per task, accuracy of one token per forward against naive many-tokens-per-forward settings."""
    tasks, s = report["tasks"], report["settings"]
    multi = set(report["multi_answer_tasks"])
    naive = [label for label, v in s.items() if v["family"] == "fixed_steps" or label in ("threshold 0.5",)]
    cols = [f"{t}{' *' if t in multi else ''}" for t in tasks]
    lines = [
        "",
        "Naive parallel decoding, per task (accuracy %; `fixed_steps k=K` commits K tokens per forward, the K "
        "most confident; * = several valid answers whose tokens must agree; last columns: mean over the "
        "multi-answer tasks and over all tasks):",
        "",
    ]
    rows = []
    for label in naive:
        v = s[label]
        pt = v["per_task"]
        m = [pt[t]["accuracy"] for t in tasks if t in multi]
        rows.append(
            [
                label,
                f"{v['nfe']:.1f}",
                *(f"{pt[t]['accuracy']:.0f}" for t in tasks),
                f"{sum(m) / len(m) if m else float('nan'):.1f}",
                f"{v['accuracy']:.1f}",
            ]
        )
    lines += markdown_table(["decoder", "NFE", *cols, "multi-answer", "all"], rows)
    h = headline(report)
    ref = h["reference"]
    lines += [
        "",
        f"Headline: the reference ({ref['label']}) reaches {ref['accuracy']:.1f} % in {ref['nfe']:.2f} "
        "forwards (mean over tasks).",
    ]
    for fam in ("learn2pd+eotp", "threshold", "threshold+eotp"):
        r = h[fam]
        lines.append(
            f"- {fam}: "
            + (
                "no setting within 1 point of the reference"
                if r is None
                else f"`{r['label']}` {r['accuracy']:.1f} % in {r['nfe']:.2f} forwards ({r['speedup']:.1f}x fewer)"
            )
        )
    return lines


def plot(report: dict, path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 5))
    pts = []
    for fam in report["families"]:
        xs = [(v["nfe"], v["accuracy"]) for v in report["settings"].values() if v["family"] == fam]
        pts += xs
        ax.plot(*zip(*sorted(xs)), marker="o", label=fam)
    front = pareto_front(pts)
    ax.step(*zip(*front), where="post", color="black", linestyle="--", linewidth=1, label="Pareto frontier")
    ax.set_xlabel("forward passes per sequence (NFE, mean over tasks)")
    ax.set_ylabel("held-out accuracy % (mean over tasks)")
    ax.set_title("leapdecode dllm bench: accuracy vs NFE")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_outputs(report: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "dllm_bench.json").write_text(json.dumps(report, indent=1))
    (out / "dllm_bench.md").write_text(markdown(report))
    plot(report, out / "dllm_bench.png")
