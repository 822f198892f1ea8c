"""`bench-serve --compare ... --rounds N`: leapdecode's servers with speculation on and off, measured in turns.

On a small shared host the speed of the machine itself drifts by several percent over minutes, so two servers
measured one after the other differ by that much before either does anything differently. Here both of leapdecode's
servers are up at once (an idle one sleeps: it takes no CPU from the one measured) and every concurrency level is
measured on each in turn, round after round, the order reversed every other round. Each round then gives a paired
ratio on ÷ off at each level, taken minutes apart at most; the report shows every round's ratio beside the median.
Each row of the result is the round with the median throughput of that server at that level, and carries every
round's tok/s.
"""

from __future__ import annotations

import statistics

from . import serve_peers

ROUNDS_KEY = "rounds_output_tokens_per_s"


def run_interleaved(servers, measure_level, levels: list[int], rounds: int, say=print) -> list[dict]:
    """Start every server, then for each round and level measure the level on each server in turn
    (`measure_level(url, model, label, level, round)` → one row), the order reversed every other round; stop them all.
    Returns one result per server as run_servers does (an error and no rows for one that could not start or broke)."""
    results, running = {}, []
    try:
        for server in servers:
            entry, started = serve_peers.launch(server, say)
            results[server.label] = entry
            if started is not None:
                entry["rounds"] = []
                running.append((server, started))
        for r in range(rounds):
            order = running if r % 2 == 0 else running[::-1]
            for level in levels:
                for server, _ in order:
                    entry = results[server.label]
                    if "error" in entry:
                        continue
                    say(f"round {r + 1}/{rounds}, {server.label}")
                    try:
                        row = measure_level(f"http://127.0.0.1:{server.port}", server.model, server.label, level, r + 1)
                        entry["rounds"].append(dict(row, round=r + 1))
                    except Exception as e:  # reported; the other server goes on
                        serve_peers.failed_while_measured(entry, e, say)
    finally:
        for _, started in running:
            serve_peers.stop(*started)
    out = []
    for result in results.values():
        by_level = result.pop("rounds", [])
        if "error" not in result:
            result["rows"] = [median_row([row for row in by_level if row["concurrency"] == c]) for c in levels]
        out.append(result)
    return out


def median_row(rows: list[dict]) -> dict:
    """The row of the round with the median throughput (the lower middle for an even count), with every round's
    tok/s in round order."""
    ranked = sorted(rows, key=lambda row: row["output_tokens_per_s"])
    chosen = dict(ranked[(len(ranked) - 1) // 2])
    chosen[ROUNDS_KEY] = [row["output_tokens_per_s"] for row in sorted(rows, key=lambda row: row["round"])]
    chosen.pop("round", None)
    return chosen


def paired_ratios(results: list[dict]) -> list[dict]:
    """Per level: speculation on ÷ off in each round (the first leapdecode result over the one labelled
    'speculation off'), where both have every round."""
    ours = [r for r in results if r.get("peer") == "leapdecode" and r.get("rows")]
    off = next((r for r in ours if "speculation off" in r["label"]), None)
    on = next((r for r in ours if r is not off), None)
    if on is None or off is None:
        return []
    table = []
    for a, b in zip(on["rows"], off["rows"]):
        pairs = list(zip(a.get(ROUNDS_KEY, []), b.get(ROUNDS_KEY, [])))
        if pairs and all(y > 0 for _, y in pairs):
            ratios = [x / y for x, y in pairs]
            table.append({"concurrency": a["concurrency"], "ratios": ratios, "median": statistics.median(ratios)})
    return table


def markdown(results: list[dict]) -> list[str]:
    """The report's section on the paired rounds (nothing when there were none)."""
    table = paired_ratios(results)
    if not table:
        return []
    lines = [
        "Speculation on ÷ off, measured in turns (both servers up, each level on one then the other, the order "
        "reversed every other round):",
        "",
        "| concurrency | on ÷ off per round | median |",
        "|---:|---|---:|",
    ]
    lines += [
        f"| {t['concurrency']} | {', '.join(f'{x:.2f}' for x in t['ratios'])} | {t['median']:.2f} |" for t in table
    ]
    return lines + [""]
