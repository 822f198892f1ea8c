"""From raw records to numbers people read: medians over repeats, per-category and overall tables, `results.json`
and `report.md`. Tokens/s of a group is its total new tokens over the sum of median wall times (as Spec-Bench);
speedup is against `hf-generate` (else `none`) from the same run; % of oracle against the oracle at its best k."""

from __future__ import annotations

import json
import pathlib
import statistics
from collections import defaultdict

from ..report_kit import markdown_table
from .forward_cost import cost_table
from .methods import FLOOR_METHOD
from .peers import is_peer
from .splits import split_groups, split_section
from .suites import CATEGORY_TITLES


def medians(records: list[dict]) -> dict[tuple, dict]:
    """(question_id, turn, variant) -> median wall/ttft/forwards over repeats; identical only if every repeat was."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in records:
        groups[(r["question_id"], r["turn"], r["variant"])].append(r)
    out = {}
    for key, rs in groups.items():
        out[key] = {
            "category": rs[0]["category"],
            "method": rs[0]["method"],
            "draft_length": rs[0]["draft_length"],
            "new_tokens": rs[0]["new_tokens"],
            "repeats": len(rs),
            "wall_time": statistics.median(r["wall_time"] for r in rs),
            "time_to_first_token": statistics.median(r["time_to_first_token"] for r in rs),
            "forward_passes": statistics.median(r["forward_passes"] for r in rs),
            "identical": all(r["identical"] for r in rs),
            "peak_rss_mb": _max(r.get("peak_rss_mb") for r in rs),
        }
    return out


def _max(values) -> float | None:
    values = [v for v in values if v is not None]
    return max(values) if values else None


def _aggregate(items: list[dict]) -> dict:
    tokens = sum(i["new_tokens"] for i in items)
    time = sum(i["wall_time"] for i in items)
    forwards = sum(i["forward_passes"] for i in items)
    return {
        "turns": len(items),
        "new_tokens": tokens,
        "time": round(time, 4),
        "tokens_per_second": round(tokens / time, 3) if time > 0 else 0.0,
        "mean_accepted_tokens": round(tokens / forwards, 3) if forwards else None,  # None: not counted (peers)
        "forward_passes": forwards,
        "time_to_first_token": round(statistics.median(i["time_to_first_token"] for i in items), 4),
        "identical_share": round(sum(i["identical"] for i in items) / len(items), 4),
        "peak_rss_mb": _max(i.get("peak_rss_mb") for i in items),
    }


def summarize(run: dict) -> dict:
    """Per group ('overall' and each category) and variant: the aggregates, speedup and % of oracle."""
    med = medians(run["records"])
    labels = [v["label"] for v in run["variants"]]
    categories = list(dict.fromkeys(r["category"] for r in run["references"]))
    groups = {"overall": categories, **{c: [c] for c in categories}}
    table: dict[str, dict[str, dict]] = {}
    for group, cats in groups.items():
        table[group] = {}
        for label in labels:
            items = [m for (q, t, v), m in med.items() if v == label and m["category"] in cats]
            if items:
                table[group][label] = _aggregate(items)
    oracle = [v["label"] for v in run["variants"] if v["method"] == "oracle"]
    best = max(oracle, key=lambda lab: table["overall"][lab]["tokens_per_second"]) if oracle else None
    baseline = next((b for b in ("hf-generate", "none") if b in labels), None)
    for rows in table.values():
        base = rows[baseline]["tokens_per_second"] if baseline else 0.0
        ceiling = rows[best]["tokens_per_second"] if best else 0.0
        for row in rows.values():
            row["speedup"] = round(row["tokens_per_second"] / base, 3) if base else None
            row["pct_of_oracle"] = round(100 * row["tokens_per_second"] / ceiling, 1) if ceiling else None
    mismatches = [r for r in run["records"] if not r["identical"] and not is_peer(r["method"])]
    floor, plain = table["overall"].get(FLOOR_METHOD), table["overall"].get("none")
    overhead = (
        round(floor["tokens_per_second"] / plain["tokens_per_second"] - 1, 4)
        if floor and plain and plain["tokens_per_second"]
        else None
    )
    return {
        "baseline": baseline,
        "oracle_best": best,
        "categories": categories,
        "groups": table,
        "none_time_per_token_over_floor": overhead,
        "mismatched_outputs": len(mismatches),  # leapdecode's and HF's methods: meant to be lossless
        "outputs": len([r for r in run["records"] if not is_peer(r["method"])]),
        "peer_mismatched_outputs": sum(not r["identical"] for r in run["records"] if is_peer(r["method"])),
        "peer_outputs": sum(is_peer(r["method"]) for r in run["records"]),
        "splits": split_groups(med, labels, baseline, _aggregate),
    }


def main_rows(run: dict, summary: dict) -> list[str]:
    """Labels shown in the main tables: each method at its default, then the oracle at its best draft length."""
    rows = [v["label"] for v in run["variants"] if v["draft_length"] is None]
    return rows + ([summary["oracle_best"]] if summary["oracle_best"] else [])


def write_results(out: pathlib.Path, meta: dict, questions: list[dict], run: dict, summary: dict) -> pathlib.Path:
    path = out / "results.json"
    path.write_text(json.dumps({"meta": meta, "questions": questions, "summary": summary, **run}, indent=1))
    return path


def _fmt(x, spec: str, none: str = "–") -> str:
    return none if x is None else format(x, spec)


def _table(rows: dict[str, dict], labels: list[str], baseline: str | None, best: str | None) -> list[str]:
    header = [
        "method",
        "tok/s",
        f"speedup vs {baseline or '–'}",
        "% of oracle",
        "accepted tok / target forward",
        "target forwards",
        "TTFT ms (median)",
        "identical to greedy",
        "peak RSS MiB",
    ]
    body = []
    for label in labels:
        if label not in rows:
            continue
        r = rows[label]
        name = f"oracle (k={label.split('@')[1]}, ceiling)" if label == best else label
        differs = " ❌ **differs** (peer)" if is_peer(label) else " ❌ **MISMATCH**"
        same = f"{100 * r['identical_share']:.0f} %" + ("" if r["identical_share"] == 1 else differs)
        counted = r["mean_accepted_tokens"] is not None
        body.append(
            [
                name,
                f"{r['tokens_per_second']:.2f}",
                f"{_fmt(r['speedup'], '.2f')}×",
                f"{_fmt(r['pct_of_oracle'], '.0f')} %",
                f"{r['mean_accepted_tokens']:.2f}" if counted else "–",
                f"{r['forward_passes']:.0f}" if counted else "–",
                f"{1000 * r['time_to_first_token']:.0f}",
                same,
                _fmt(r.get("peak_rss_mb"), ".0f"),
            ]
        )
    return markdown_table(header, body)


def _mismatch_section(run: dict, summary: dict) -> list[str]:
    bad = [r for r in run["records"] if not r["identical"] and not is_peer(r["method"])]
    peers = _peer_section(run, summary)
    if not bad:
        n_peers = summary.get("peer_outputs", 0)
        same_peers = n_peers - summary.get("peer_mismatched_outputs", 0)
        return [
            "## Losslessness",
            "",
            f"All {summary['outputs']} measured outputs{' of HF and leapdecode methods' if n_peers else ''} are "
            "identical to the greedy reference (HF `generate`, greedy). ✅"
            + (f" Peers: {same_peers} of {n_peers} outputs identical." if n_peers else ""),
            "",
        ] + peers
    lines = [
        "## ❌❌ MISMATCH: OUTPUTS DIFFER FROM GREEDY ❌❌",
        "",
        f"**{len(bad)} of {summary['outputs']} outputs are not token for token the greedy reference.** Every "
        "method here is meant to be lossless. The first difference of each (question, turn, method) with the "
        "target's top-2 logit margin there (a margin within a few units in the last place of the logit in the "
        "model's dtype, and at least 0.01, reads as a floating-point tie between two near-equal logits; a larger "
        "one is a bug):",
        "",
    ]
    return lines + _divergence_table(bad, "**LIKELY BUG**") + [""] + peers


def _peer_section(run: dict, summary: dict) -> list[str]:
    """Peers' outputs that are not the greedy reference: shown, with the same first-difference table (a peer is
    another runtime, so a difference beyond a tie is its numerics, not our bug)."""
    bad = [r for r in run["records"] if not r["identical"] and is_peer(r["method"])]
    if not bad:
        return []
    return [
        "## ❌ Peers whose outputs differ from greedy",
        "",
        f"**{len(bad)} of {summary['peer_outputs']} outputs of peer runtimes are not token for token the greedy "
        "reference** (their tok/s counts the tokens they produced). First difference of each (question, turn, peer), "
        "with the target's top-2 logit margin there:",
        "",
        *_divergence_table(bad, "beyond a tie"),
        "",
    ]


def _divergence_table(bad: list[dict], beyond: str) -> list[str]:
    counts: dict[tuple, int] = defaultdict(int)
    first: dict[tuple, dict] = {}
    for r in bad:
        key = (r["variant"], r["question_id"], r["turn"])
        counts[key] += 1
        if "divergence" in r:
            first[key] = r["divergence"]
    rows = []
    for key, n in counts.items():
        d = first.get(key, {})
        margin = d.get("top2_margin")
        verdict = "–" if margin is None else ("numerical tie" if margin <= d["tie_margin"] else beyond)
        rows.append([key[0], key[1], key[2] + 1, n, d.get("position", "–"), _fmt(margin, ".4g"), verdict])
    header = ["method", "question", "turn", "repeats differing", "first differing token", "top-2 margin", "verdict"]
    return markdown_table(header, rows, align="--rrrr-")


def _sweep_section(run: dict, summary: dict) -> list[str]:
    swept = [v for v in run["variants"] if v["draft_length"] is not None]
    if not swept:
        return []
    ks = sorted({v["draft_length"] for v in swept})
    methods = list(dict.fromkeys(v["method"] for v in swept))
    overall = summary["groups"]["overall"]
    lines = [
        "## Draft length sweep (overall, fixed k, adaptive control off)",
        "",
        "tok/s (accepted tokens per target forward)",
        "",
    ]
    rows = []
    for m in methods:
        cells = []
        for k in ks:
            r = overall.get(f"{m}@{k}")
            cells.append("–" if r is None else f"{r['tokens_per_second']:.2f} ({r['mean_accepted_tokens']:.2f})")
        rows.append([m, *cells])
    return lines + markdown_table(["method", *(f"k={k}" for k in ks)], rows) + [""]


def write_report(out: pathlib.Path, meta: dict, run: dict, summary: dict, plots: list[str]) -> pathlib.Path:
    s = meta["settings"]
    lines = [
        f"# leapdecode benchmark: {meta['model']} on suite `{s['suite']}`",
        "",
        f"{meta['timestamp']} · {s['turns']} measured turns from {s['questions']} questions · "
        f"{s['repeats']} repeat(s) per method, medians reported",
        "",
    ]
    lines += _mismatch_section(run, summary)
    lines += ["## Setup", ""] + markdown_table(["", ""], [[k, v] for k, v in meta["setup"].items()], align="-")
    labels, base, best = main_rows(run, summary), summary["baseline"], summary["oracle_best"]
    lines += ["", "## Overall", ""] + _table(summary["groups"]["overall"], labels, base, best) + [""]
    if summary.get("none_time_per_token_over_floor") is not None:
        lines += [
            f"Loop overhead: `none` (the full engine, no drafter) takes "
            f"{100 * summary['none_time_per_token_over_floor']:+.1f} % time per token against `{FLOOR_METHOD}` "
            "(the Runner's forward and an argmax per token, nothing else).",
            "",
        ]
    for c in summary["categories"]:
        title = CATEGORY_TITLES.get(c, c)
        lines += [f"### {title}" + (f" (`{c}`)" if title != c else ""), ""]
        lines += _table(summary["groups"][c], labels, base, best) + [""]
    lines += split_section(summary.get("splits", {}), labels)
    lines += _sweep_section(run, summary)
    if run.get("forward_cost"):
        lines += cost_table(run["forward_cost"], run["forward_cost_context"])
    if plots:
        lines += ["## Plots", ""] + [f"![{p}]({p})" for p in plots] + [""]
    lines += [
        "## Columns",
        "",
        "- **tok/s**: new tokens of the group / sum over turns of the median wall time (prompt ids in, token "
        "ids out; leapdecode methods include chat templating). **speedup**: tok/s over the baseline's in the "
        "same run and group. **% of oracle**: tok/s over the oracle's (the known greedy continuation drafted "
        "at the best fixed draft length: the ceiling for any drafter on this machine).",
        "- **accepted tok / target forward**: new tokens per target forward pass, prefill included (plain "
        "decoding: 1.00). **target forwards**: their sum over the group (median over repeats per turn).",
        "- **TTFT**: median over turns of the median time from the call to the first new token.",
        f"- **{FLOOR_METHOD}**: prefill, then one single-token forward with the warm KV cache and an argmax "
        "per token, in a bare loop: the floor for plain decoding.",
        "- **identical to greedy**: share of turns whose output equals the reference in every repeat.",
        "- **peak RSS MiB**: peak resident memory (VmHWM) of the process that ran the method: the bench process itself for HF's and "
        "leapdecode's methods (one process for all of them, so it is the peak of everything that ran before too: "
        "the HF model, the packed weights, every drafter), the peer's own worker process for a peer.",
        "- **peers** (`openvino`, `openvino-prompt-lookup`): OpenVINO GenAI in a process of its own, fed the same "
        "prompt token ids; wall time and TTFT measured in that process around its `generate` call (TTFT from its "
        "perf metrics). It does not report target forwards (–).",
        "",
    ]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path
