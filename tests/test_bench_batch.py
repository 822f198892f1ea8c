"""`leapdecode bench-batch` end to end on a tiny local model (no downloads): every method runs at every concurrency,
outputs are checked against solo greedy, the report files are written; the scenarios run. Timings never asserted."""

from __future__ import annotations

import json

import pytest
from tiny_hf import make_tiny_hf_dir

from leapdecode.cli import main


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return make_tiny_hf_dir(tmp_path_factory.mktemp("bb") / "tiny", context=512)


def test_bench_batch_writes_a_checked_report(tiny_dir, tmp_path):
    out = tmp_path / "bb"
    code = main(
        [
            "bench-batch",
            "--model",
            str(tiny_dir),
            "--suite",
            "quick",
            "--concurrency",
            "1,3",
            "--requests",
            "3",
            "--max-new-tokens",
            "6",
            "--methods",
            "hf-generate,engine,engine-prompt-lookup,engine-ngram",
            "--no-progress",
            "--fail-on-mismatch",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    runs = json.loads((out / "results.json").read_text())["runs"]
    assert {(r["method"], r["concurrency"]) for r in runs} == {
        (m, c) for m in ("hf-generate", "engine", "engine-prompt-lookup", "engine-ngram") for c in (1, 3)
    }
    assert all(r["identical"] == 3 and r["output_tokens"] > 0 for r in runs)
    # each engine run records what its speculation gate measured per load level (its arms: none, draft)
    levels = [level for r in runs if r["method"].startswith("engine-") for level in r["speculation"].values()]
    assert levels and all(set(level["rates"]) <= {"none", "draft"} for level in levels)
    assert "| engine-ngram | 3 |" in (out / "report.md").read_text() and (out / "throughput.png").stat().st_size > 0


def test_bench_batch_fails_on_a_planted_mismatch(tiny_dir, tmp_path, monkeypatch):
    import leapdecode.lab.bench.batch as batch

    real = batch.run_engine

    def corrupted(*args, **kwargs):
        record = real(*args, **kwargs)
        record["tokens"][0] = [(record["tokens"][0][0] + 1) % 60] + record["tokens"][0][1:]
        return record

    monkeypatch.setattr("leapdecode.lab.bench.batch_cli.run_engine", corrupted)
    code = main(
        [
            "bench-batch",
            "--model",
            str(tiny_dir),
            "--suite",
            "quick",
            "--concurrency",
            "2",
            "--requests",
            "2",
            "--max-new-tokens",
            "4",
            "--methods",
            "engine",
            "--no-progress",
            "--fail-on-mismatch",
            "--out",
            str(tmp_path / "bad"),
        ]
    )
    assert code == 3
    assert "differ from solo greedy" in (tmp_path / "bad" / "report.md").read_text()


def test_repeats_interleave_the_methods_and_report_medians_and_paired_ratios(tiny_dir, tmp_path):
    from leapdecode.lab.bench.batch import combine_repeats, interleaved_runs

    assert interleaved_runs(["hf-generate", "engine", "engine-head"], [1, 4], 2) == [
        ("hf-generate", 1),
        *[("engine", 1), ("engine-head", 1), ("engine", 4), ("engine-head", 4)],
        *[("engine-head", 1), ("engine", 1), ("engine-head", 4), ("engine", 4)],  # the order rotates per repeat
    ]

    def run(rate, identical=2):
        return {"output_tok_s": rate, "identical": identical, "mismatches": [{}] * (2 - identical)}

    rows = combine_repeats(
        {
            ("engine", 4): [run(100), run(50), run(80)],
            ("engine-head", 4): [run(90), run(60, identical=1), None],
        }
    )
    assert rows[("engine", 4)]["output_tok_s"] == 80 and rows[("engine", 4)]["runs_tok_s"] == [100, 50, 80]
    head = rows[("engine-head", 4)]
    assert head["output_tok_s"] == 60 and head["vs_engine_runs"] == [0.9, 1.2]  # paired by repeat
    assert head["identical"] == 1 and len(head["mismatches"]) == 1  # the worst repeat counts

    out = tmp_path / "rep"
    argv = ["bench-batch", "--model", str(tiny_dir), "--suite", "quick", "--concurrency", "2", "--requests", "2"]
    argv += ["--max-new-tokens", "4", "--methods", "engine,engine-prompt-lookup", "--repeats", "2", "--no-progress"]
    assert main([*argv, "--out", str(out)]) == 0
    runs = json.loads((out / "results.json").read_text())["runs"]
    assert [len(r["runs_tok_s"]) for r in runs] == [2, 2] and all(len(r["vs_engine_runs"]) == 2 for r in runs)
    assert "| engine-prompt-lookup | 2 |" in (out / "report.md").read_text()
    assert main([*argv[:-3], "--repeats", "0", "--out", str(out)]) == 2


@pytest.mark.parametrize("scenario", ["prefill-stall", "prefix-reuse"])
def test_bench_batch_scenarios(tiny_dir, tmp_path, scenario):
    out = tmp_path / scenario
    assert (
        main(
            [
                "bench-batch",
                "--model",
                str(tiny_dir),
                "--suite",
                "quick",
                "--scenario",
                scenario,
                "--streams",
                "2",
                "--long-prompt-tokens",
                "200",
                "--prefix-tokens",
                "64",
                "--max-new-tokens",
                "12",
                "--max-batch-tokens",
                "32",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    table = json.loads((out / "results.json").read_text())["table"]
    if scenario == "prefix-reuse":
        assert table["engine"]["cache hits"] == 1
    else:
        assert len(table) == 3


def test_the_paired_scenario_interleaves_engine_methods_slice_by_slice(tiny_dir, tmp_path, monkeypatch):
    """Every slice of 2 x C requests runs on every method's engine and on a second plain engine (the A/A control),
    built once per concurrency, the order rotated per slice; each output is checked against solo greedy; ratios are
    to `engine` over the same slices, with an interval where there are two slices or more."""
    from leapdecode.lab.bench import batch_scenarios

    calls = []
    real = batch_scenarios.closed_loop
    monkeypatch.setattr(
        batch_scenarios,
        "closed_loop",
        lambda engine, prompts, c, n, **kw: (
            calls.append((engine.drafter_name, c, len(prompts))) or real(engine, prompts, c, n, **kw)
        ),
    )
    out = tmp_path / "paired"
    args = ["bench-batch", "--model", str(tiny_dir), "--suite", "quick", "--scenario", "paired", "--requests", "5"]
    args += ["--methods", "engine,engine-prompt-lookup", "--concurrency", "1,2", "--max-new-tokens", "8"]
    assert main(args + ["--out", str(out)]) == 0
    table = json.loads((out / "results.json").read_text())["table"]
    control = "engine (A/A control)"
    assert list(table) == [f"{m} @ {c}" for c in (1, 2) for m in ("engine", "engine-prompt-lookup", control)]
    assert [row["slices"] for row in table.values()] == [3, 3, 3, 2, 2, 2]  # 5 requests in slices of 2 and of 4
    assert all(row["identical to solo greedy"] == "5 of 5" for row in table.values())
    assert table["engine @ 2"]["x engine"] == 1.0 and table["engine @ 2"]["x engine, ~95 % interval"] is None
    low, high = table[f"{control} @ 1"]["x engine, ~95 % interval"]
    assert 0 < low <= high
    plain, lookup = "none", "prompt-lookup"
    turns = [plain, lookup, plain, lookup, plain, plain, plain, plain, lookup]  # engine, lookup, control rotated
    assert [d for d, _, _ in calls] == turns + turns[:6]
    assert [n for _, _, n in calls] == [2] * 6 + [1] * 3 + [4] * 3 + [1] * 3
    assert main(args[:-4] + ["--methods", "engine-prompt-lookup,engine", "--out", str(out)]) == 2  # engine first


def test_the_paired_scenario_samples_each_request_with_its_own_seed(tiny_dir, tmp_path, monkeypatch):
    """With --temperature every request samples (top_p too), seeded by its index: a seeded request draws the same
    tokens whatever was drafted, so every arm's outputs are checked against `engine`'s. An arm that drew with other
    seeds reads as different."""
    from leapdecode.lab.bench import batch_scenarios

    calls, real = [], batch_scenarios.closed_loop

    def recording(engine, prompts, c, n, seeds=None, **kw):
        calls.append((engine.drafter_name, seeds, kw))
        if shifted and engine.drafter_name == "prompt-lookup":
            seeds = [s + 1000 for s in seeds]
        return real(engine, prompts, c, n, seeds=seeds, **kw)

    monkeypatch.setattr(batch_scenarios, "closed_loop", recording)
    args = ["bench-batch", "--model", str(tiny_dir), "--suite", "quick", "--scenario", "paired", "--requests", "5"]
    args += ["--methods", "engine,engine-prompt-lookup", "--concurrency", "2", "--max-new-tokens", "12"]
    args += ["--temperature", "1.5", "--top-p", "0.95"]
    column = "identical to engine, same seeds"
    for shifted in (False, True):
        out = tmp_path / f"sampled-{shifted}"
        assert main(args + ["--out", str(out)]) == 0
        results = json.loads((out / "results.json").read_text())
        table = results["table"]
        identical = {label: int(row[column].split()[0]) for label, row in table.items()}
        if not shifted:
            assert set(identical.values()) == {5}, table
            assert (
                "Sampled (each request seeded by its index): temperature 1.5, top_p 0.95" in results["meta"]["settings"]
            )
        else:
            assert identical["engine-prompt-lookup @ 2"] < 5 and identical["engine (A/A control) @ 2"] == 5
    assert all(kw == {"temperature": 1.5, "top_p": 0.95} for _, _, kw in calls)
    assert sorted(s for _, seeds, _ in calls[:3] for s in seeds) == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]


def test_a_ratio_interval_is_t_over_the_logs_of_the_slices():
    """Identical slices give a point; a ratio's inverse gets the mirrored interval; two slices get t's wide 12.71."""
    import math

    from leapdecode.lab.bench.intervals import ratio_interval

    assert ratio_interval([1.02]) is None
    assert ratio_interval([0.95, 0.95, 0.95]) == pytest.approx((0.95, 0.95))
    ratios = [0.91, 1.04, 0.97, 1.10, 0.99]
    low, high = ratio_interval(ratios)
    inv_low, inv_high = ratio_interval([1 / r for r in ratios])
    assert (inv_low, inv_high) == pytest.approx((1 / high, 1 / low))
    logs = [math.log(r) for r in ratios]
    mean, se = sum(logs) / 5, (sum((x - sum(logs) / 5) ** 2 for x in logs) / 4 / 5) ** 0.5
    assert (low, high) == pytest.approx((math.exp(mean - 2.78 * se), math.exp(mean + 2.78 * se)))
    low2, high2 = ratio_interval([0.98, 1.02])
    assert high2 / low2 > 1.5  # two slices say little


def test_bench_batch_bad_input_is_one_line(tiny_dir, tmp_path, capsys):
    assert main(["bench-batch", "--model", str(tiny_dir), "--methods", "engine-nope", "--out", str(tmp_path)]) == 2
    assert "unknown method" in capsys.readouterr().err
    assert main(["bench-batch", "--model", str(tiny_dir), "--temperature", "0.7", "--out", str(tmp_path)]) == 2
    assert "--scenario paired" in capsys.readouterr().err
    paired = ["bench-batch", "--model", str(tiny_dir), "--scenario", "paired", "--out", str(tmp_path)]
    assert main(paired + ["--temperature", "0.7", "--top-p", "0"]) == 2
    assert "--top-p must be in (0, 1]" in capsys.readouterr().err
    assert main(paired + ["--top-p", "0.9"]) == 2
    assert "--top-p goes with --temperature" in capsys.readouterr().err
