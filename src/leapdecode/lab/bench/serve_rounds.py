"""`bench-serve --compare ... --rounds N`: leapdecode's servers with speculation on and off, measured in turns.

On a small shared host the speed of the machine itself drifts by several percent over minutes, so two servers
measured one after the other differ by that much before either does anything differently. Here both of leapdecode's
servers are up at once (an idle one sleeps: it takes no CPU from the one measured) and every concurrency level is
measured on each in turn, round after round, the order reversed every other round. Each round then gives a paired
ratio on ÷ off at each level, taken minutes apart at most; the report shows every round's ratio beside the median
and a ~95 % interval over the rounds (intervals.py): where it spans 1, the rounds cannot tell the two apart.
The engine without HTTP (serve_inprocess.Worker) takes its turn beside them, so server ÷ engine is paired per round
too. Each row of the result is the round with the median throughput of that server at that level, and carries every
round's tok/s.
"""

from __future__ import annotations

import functools
import statistics

from . import serve_peers
from .intervals import ratio_interval

ROUNDS_KEY = "rounds_output_tokens_per_s"


def run_interleaved(servers, measure_level, levels: list[int], rounds: int, say=print, engine=None) -> list[dict]:
    """Start every server, then for each round and level measure the level on each server in turn
    (`measure_level(url, model, label, level, round)` → one row), the order reversed every other round; stop them all.
    `engine` (serve_inprocess.Worker) takes its turn after the servers in every round, so that server ÷ engine pairs
    per round as well. Returns one result per participant as run_servers does (an error and no rows for one that
    could not start or broke)."""
    results, running = {}, []  # running: (label, measure(level, round) -> row, stop())
    try:
        for server in servers:
            entry, started = serve_peers.launch(server, say)
            results[server.label] = entry
            if started is not None:
                url = f"http://127.0.0.1:{server.port}"
                measure = functools.partial(measure_level, url, server.model, server.label)
                running.append((server.label, measure, functools.partial(serve_peers.stop, *started)))
        if engine is not None:
            results[engine.label] = engine.start(say)
            if "error" not in results[engine.label]:
                running.append((engine.label, engine.measure, engine.stop))
        for r in range(rounds):
            order = running if r % 2 == 0 else running[::-1]
            for level in levels:
                for label, measure, _ in order:
                    entry = results[label]
                    if "error" in entry:
                        continue
                    say(f"round {r + 1}/{rounds}, {label}")
                    try:
                        entry.setdefault("rounds", []).append(dict(measure(level, r + 1), round=r + 1))
                    except Exception as e:  # reported; the others go on
                        serve_peers.failed_while_measured(entry, e, say)
    finally:
        for _, _, stop in running:
            stop()
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
    return _pair(on, off)


def engine_ratios(results: list[dict]) -> list[tuple[str, list[dict]]]:
    """(server label, per level: server ÷ engine in process in each round) for each leapdecode server, where the
    engine took its turn in the same rounds."""
    engine = next((r for r in results if r.get("peer") == "in-process" and r.get("rows")), None)
    ours = [r for r in results if r.get("peer") == "leapdecode" and r.get("rows")]
    return [(r["label"], table) for r in ours if (table := _pair(r, engine))]


def _pair(a: dict | None, b: dict | None) -> list[dict]:
    if a is None or b is None:
        return []
    table = []
    for x, y in zip(a["rows"], b["rows"]):
        pairs = list(zip(x.get(ROUNDS_KEY, []), y.get(ROUNDS_KEY, [])))
        if pairs and all(d > 0 for _, d in pairs):
            ratios = [n / d for n, d in pairs]
            table.append(
                {
                    "concurrency": x["concurrency"],
                    "ratios": ratios,
                    "median": statistics.median(ratios),
                    "interval": ratio_interval(ratios),
                }
            )
    return table


def summary(results: list[dict]) -> dict:
    """The paired ratios for results.json: on ÷ off and, per leapdecode server, server ÷ engine (empty where the
    run had no rounds)."""
    return {"on_off": paired_ratios(results), "server_engine": dict(engine_ratios(results))}


def markdown(results: list[dict]) -> list[str]:
    """The report's sections on the paired rounds (nothing when there were none)."""
    lines = []
    table = paired_ratios(results)
    if table:
        lines += [
            "Speculation on ÷ off, measured in turns (both servers up, each level on one then the other, the order "
            "reversed every other round; the interval: t over the logs of the rounds' ratios, none under two rounds):",
            "",
            *_rows("on ÷ off", table),
        ]
    by_server = engine_ratios(results)
    if by_server:
        lines += [
            "Server ÷ engine in process, measured in the same turns (the engine's process up beside the servers, "
            "idle while they are measured):",
            "",
        ]
        for label, table in by_server:
            lines += [f"{label}:", "", *_rows("server ÷ engine", table)]
    return lines


def _rows(what: str, table: list[dict]) -> list[str]:
    lines = [f"| concurrency | {what} per round | median | ~95 % interval |", "|---:|---|---:|---:|"]
    for t in table:
        interval = "–" if t["interval"] is None else "{:.2f}–{:.2f}".format(*t["interval"])
        lines.append(
            f"| {t['concurrency']} | {', '.join(f'{x:.2f}' for x in t['ratios'])} | {t['median']:.2f} | {interval} |"
        )
    return lines + [""]
