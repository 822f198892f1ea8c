"""PNG plots from the same summary as the report: speedup by category and method; tokens/s against draft length."""

from __future__ import annotations

import pathlib

from ..report_kit import pyplot
from .methods import METHODS

COLORS = {m: f"C{i}" for i, m in enumerate(METHODS)}  # one colour per method in every plot


def plot_speedup(out: pathlib.Path, summary: dict, labels: list[str]) -> str | None:
    """Grouped bars: one group per category (+ overall), one bar per method, speedup over the baseline."""
    if summary["baseline"] is None:
        return None
    plt = pyplot()
    groups = summary["categories"] + ["overall"]
    width = 0.8 / max(1, len(labels))
    fig, ax = plt.subplots(figsize=(max(7, 1.1 * len(groups) * max(1, len(labels)) * 0.35 + 3), 4.5))
    for j, label in enumerate(labels):
        ys = [summary["groups"][g].get(label, {}).get("speedup") or 0.0 for g in groups]
        name = f"oracle (k={label.split('@')[1]})" if label == summary["oracle_best"] else label
        ax.bar(
            [i + (j - (len(labels) - 1) / 2) * width for i in range(len(groups))],
            ys,
            width,
            label=name,
            color=COLORS.get(label.split("@")[0]),
        )
    ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, rotation=20, ha="right")
    ax.set_ylabel(f"speedup over {summary['baseline']}")
    ax.set_title("Speedup by category and method")
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(out / "speedup.png", dpi=120)
    plt.close(fig)
    return "speedup.png"


def plot_draft_length(out: pathlib.Path, run: dict, summary: dict) -> str | None:
    """Overall tokens/s of each swept method against its fixed draft length; default variants as dashed lines."""
    swept = [v for v in run["variants"] if v["draft_length"] is not None]
    if not swept:
        return None
    plt = pyplot()
    overall = summary["groups"]["overall"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for method in dict.fromkeys(v["method"] for v in swept):
        ks = sorted(v["draft_length"] for v in swept if v["method"] == method)
        ax.plot(
            ks,
            [overall[f"{method}@{k}"]["tokens_per_second"] for k in ks],
            marker="o",
            color=COLORS[method],
            label=f"{method} (fixed k)",
        )
    for v in run["variants"]:
        if v["draft_length"] is None and v["label"] in overall:
            ax.axhline(
                overall[v["label"]]["tokens_per_second"],
                linestyle="--",
                linewidth=1.2,
                alpha=0.8,
                color="black" if v["label"] == summary["baseline"] else COLORS[v["method"]],
                label=f"{v['label']} (default)",
            )
    ks = sorted({v["draft_length"] for v in swept})
    ax.set_xscale("log", base=2)
    ax.set_xticks(ks)
    ax.set_xticklabels([str(k) for k in ks])
    ax.set_xlabel("draft length k")
    ax.set_ylabel("tokens/s (overall)")
    ax.set_title("Tokens/s against draft length")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "draft_length.png", dpi=120)
    plt.close(fig)
    return "draft_length.png"
