"""bench-kv outputs: results.json (raw records + summary), report.md (tables), one PNG per prompt length."""

from __future__ import annotations

import json
import pathlib

from ..report_kit import markdown_table, meta_lines, pyplot
from .bench import check_targets

COLUMNS = [  # one table per prompt length, one row per press and budget
    "press",
    "budget",
    "KV MB",
    "KV share",
    "prefill s",
    "prefill × (wall)",
    "prefill × (CPU)",
    "decode tok/s",
    "decode × (wall)",
    "decode × (CPU)",
    "needle acc",
    "agreement",
    "identical prefix",
]


def _fmt(value, pattern="{:.2f}", none="–"):
    return none if value is None else pattern.format(value)


def _label(row: dict) -> str:
    return "full cache" if row["press"] == "full" else row["press"]


def markdown(result: dict) -> str:
    s, m = result["settings"], result["machine"]
    lines = [
        f"# bench-kv: {result['model']}",
        "",
        *meta_lines({**m, "dtype": s["dtype"]}),
        "",
        f"Settings: budgets {s['budgets']}, {s['needles']} needle prompts (depths spread evenly) and "
        f"{s['documents']} document(s) per length; needle answers: {s['answer_tokens']} greedy tokens (the first "
        f"number must equal the hidden 5-digit value); documents: {s['continuation']}-token greedy continuation of "
        "the full cache, teacher-forced through each compressed cache.",
        "Prefill of streaming-llm / snapkv / quantized = the sample's full prefill + its measured compression "
        "(what their prefill does); FastKV's prefill is timed on its own. Prefill s is the median over samples; "
        "decode tok/s is the median over the needle answers (single-token forwards); speed-ups are medians of "
        "per-sample ratios to the full cache in the same run, in wall time and in this process's CPU time (the "
        "machine may be shared: CPU time tracks the work done, wall time also other people's load).",
        "",
    ]
    for length in sorted({r["length"] for r in result["summary"]}):
        rows = [r for r in result["summary"] if r["length"] == length]
        rows.sort(key=lambda r: (r["press"] != "full", r["press"], -r["budget"]))
        lines += [f"## {length}-token prompts (mean {rows[0]['tokens']} tokens)", ""]
        lines += markdown_table(
            COLUMNS,
            [
                [
                    _label(r),
                    f"{r['budget']:g}",
                    f"{r['kv_bytes'] / 1e6:.1f}",
                    f"{r['kv_fraction']:.1%}",
                    f"{r['prefill_s']:.2f}",
                    f"{r['prefill_speedup']:.2f}",
                    _fmt(r.get("prefill_cpu_speedup")),
                    _fmt(r["decode_tok_s"], "{:.1f}"),
                    _fmt(r["decode_speedup"]),
                    _fmt(r.get("decode_cpu_speedup")),
                    f"{_fmt(r['needle_accuracy'], '{:.0%}')} ({r['needles']})",
                    _fmt(r["agreement"], "{:.0%}"),
                    _fmt(r["identical_prefix"], "{:.0%}"),
                ]
                for r in rows
            ],
            align="-",
        )
        lines.append("")
    targets = check_targets(result["summary"])
    if targets:
        yes = {True: "met", False: "missed"}
        lines += ["## Targets (FastKV, 4096-token prompts)", ""]
        lines += markdown_table(
            [
                "press",
                "budget",
                "prefill ≥ 1.5× (wall)",
                "prefill ≥ 1.5× (CPU time)",
                "KV ≤ 50 %",
                "needle acc within 2 points of full",
            ],
            [
                [
                    t["press"],
                    f"{t['budget']:g}",
                    yes[t["prefill"]],
                    yes[t["prefill_cpu"]],
                    yes[t["memory"]],
                    yes[t["accuracy"]],
                ]
                for t in targets
            ],
            align="-",
        )
        lines.append("")
    return "\n".join(lines)


def plots(result: dict, out: pathlib.Path) -> list[str]:
    plt = pyplot()
    written = []
    panels = [
        ("needle_accuracy", "needle accuracy"),
        ("agreement", "greedy top-1 agreement"),
        ("prefill_speedup", "prefill speed-up (× full)"),
        ("decode_speedup", "decode speed-up (× full)"),
    ]
    for length in sorted({r["length"] for r in result["summary"]}):
        rows = [r for r in result["summary"] if r["length"] == length]
        full = next(r for r in rows if r["press"] == "full")
        presses = sorted({r["press"] for r in rows if r["press"] != "full"})
        fig, axes = plt.subplots(2, 2, figsize=(10, 7))
        for ax, (key, title) in zip(axes.flat, panels):
            for i, press in enumerate(presses):
                points = sorted((r["kv_fraction"], r[key]) for r in rows if r["press"] == press and r[key] is not None)
                if points:
                    ax.plot(*zip(*points), marker="o", color=f"C{i}", label=press)
            if full[key] is not None:
                ax.axhline(full[key], color="black", linestyle="--", linewidth=0.8, label="full cache")
            ax.set_title(title)
            ax.set_xlabel("KV bytes kept (share of the full cache)")
            ax.grid(alpha=0.3)
        axes.flat[0].legend(fontsize=8)
        fig.suptitle(f"{result['model']}: {length}-token prompts")
        fig.tight_layout()
        name = f"kv_{length}.png"
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        written.append(name)
    return written


def write(result: dict, out: pathlib.Path) -> list[pathlib.Path]:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(result, indent=1))
    (out / "report.md").write_text(markdown(result))
    names = plots(result, out)
    return [out / "results.json", out / "report.md", *(out / n for n in names)]
