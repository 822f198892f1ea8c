"""Splits side by side: when one run combines suites (``--suite dev,heldout``, question ids ``dev:3``,
``heldout:3``), the report adds per-split tables, so that a drafter tuned on ``dev`` can be read against the questions
it never saw. A gap between the splits is a finding (overfitting to ``dev``), not a failure of the run."""

from __future__ import annotations

from typing import Callable

from .suites import CATEGORY_TITLES, split_of


def split_groups(
    med: dict[tuple, dict], labels: list[str], baseline: str | None, aggregate: Callable[[list[dict]], dict]
) -> dict[str, dict[str, dict[str, dict]]]:
    """{split: {"overall" or category: {label: aggregate row with its speedup over `baseline` in that group}}} from
    the per-turn medians (keyed (question_id, turn, label)) of a run over several suites; {} for a single suite."""
    splits = list(dict.fromkeys(s for (q, _, _) in med if (s := split_of(q)) is not None))
    if len(splits) < 2:
        return {}
    out: dict[str, dict[str, dict[str, dict]]] = {}
    for split in splits:
        items = [(v, m) for (q, _, v), m in med.items() if split_of(q) == split]
        table: dict[str, dict[str, dict]] = {}
        for group in ["overall", *dict.fromkeys(m["category"] for _, m in items)]:
            rows = {
                label: aggregate(chosen)
                for label in labels
                if (chosen := [m for v, m in items if v == label and group in ("overall", m["category"])])
            }
            base = rows[baseline]["tokens_per_second"] if baseline in rows else 0.0
            for row in rows.values():
                row["speedup"] = round(row["tokens_per_second"] / base, 3) if base else None
            table[group] = rows
        out[split] = table
    return out


def split_section(splits: dict[str, dict[str, dict[str, dict]]], labels: list[str]) -> list[str]:
    """Markdown: accepted tokens per target forward, then speedup, by category (rows) and method (columns), each
    cell giving the splits in order (e.g. ``dev · heldout``); empty for a single-suite run."""
    if not splits:
        return []
    names = list(splits)
    groups = list(dict.fromkeys(g for table in splits.values() for g in table))
    shown = [lab for lab in labels if any(lab in t.get(g, {}) for t in splits.values() for g in groups)]
    lines = [
        "## Splits side by side (" + " · ".join(f"`{n}`" for n in names) + ")",
        "",
        "Each cell gives the value on " + " · ".join(names) + " (– where a split has no such turn). The "
        "built-in `heldout` split is never used to train or tune a drafter (`dev` may be): a gap between the "
        "splits is a finding, not a failure.",
        "",
    ]
    for title, key, spec in (
        ("accepted tokens per target forward", "mean_accepted_tokens", ".2f"),
        ("speedup over the baseline", "speedup", ".2f"),
    ):
        lines += [f"**{title}**", "", "| category | " + " | ".join(shown) + " |", "|---|" + "---:|" * len(shown)]
        for g in groups:
            cells = []
            for lab in shown:
                vals = [splits[n].get(g, {}).get(lab, {}).get(key) for n in names]
                cells.append(" · ".join("–" if x is None else format(x, spec) for x in vals))
            lines.append(f"| {CATEGORY_TITLES.get(g, g)} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines
