"""`leapdecode bench-serve` against a live tiny server: every request counted, tokens from the server's usage,
percentiles in order, results.json / report.md / PNGs written; bad options fail in one line before any traffic."""

from __future__ import annotations

import json
import os

import pytest
from tiny_hf import make_tiny_hf_dir

from leapdecode.cli import main
from leapdecode.engine import Engine
from leapdecode.lab.bench.serve import _pct, server_commands
from leapdecode.lab.bench.serve_common import scrape_step_counters, step_columns
from leapdecode.models import resolve_model
from leapdecode.serve.app import create_app
from leapdecode.serve.server import BackgroundServer


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    target = resolve_model(str(make_tiny_hf_dir(tmp_path_factory.mktemp("bench-serve") / "tiny", context=512)))
    app = create_app(Engine(target, drafter="prompt-lookup"), served_model_name="tiny")
    with BackgroundServer(app) as base:
        yield base
    app.state.server.close()


def test_bench_serve_measures_every_level(url, tmp_path, capsys):
    out = tmp_path / "out"
    assert (
        main(
            [
                "bench-serve",
                "--url",
                url,
                "--concurrency",
                "1,3",
                "--num-prompts",
                "5",
                "--max-tokens",
                "8",
                "--suite",
                "quick",
                "--out",
                str(out),
                "--label",
                "tiny",
            ]
        )
        == 0
    )
    data = json.loads((out / "results.json").read_text())
    (result,) = data["results"]
    assert result["model"] == "tiny" and result["label"] == "tiny"
    assert [r["concurrency"] for r in result["rows"]] == [1, 3]
    for row in result["rows"]:
        assert row["completed"] == 5 and row["failed"] == 0 and row["errors"] == []
        assert 5 <= row["output_tokens"] <= 5 * 8  # usage from the server, at most max_tokens each
        assert row["ttft_p50_ms"] <= row["ttft_p99_ms"] and row["e2e_p50_ms"] <= row["e2e_p99_ms"]
        assert row["ttft_p50_ms"] <= row["e2e_p99_ms"]
        assert row["output_tokens_per_s"] > 0 and row["requests_per_s"] > 0
        assert 0 < row["client_cpu_cores"] <= os.cpu_count()  # this process's CPU over the level (here, server too)
        assert row["engine_steps"] > 0 and row["step_ms"] >= row["forward_ms"] > 0  # the server's /metrics
    report = (out / "report.md").read_text()
    assert "| tiny | 1 |" in report and "TTFT p50 ms" in report and "engine step ms" in report
    for png in ("throughput.png", "ttft.png", "itl.png"):
        assert (out / png).stat().st_size > 1000
    assert "output tok/s" in capsys.readouterr().out


@pytest.mark.parametrize("endpoint", ["completions", "responses"])
def test_other_endpoints_and_poisson_rate(url, tmp_path, endpoint):
    out = tmp_path / "out"
    assert (
        main(
            [
                "bench-serve",
                "--url",
                url,
                "--concurrency",
                "2",
                "--num-prompts",
                "4",
                "--max-tokens",
                "4",
                "--suite",
                "quick",
                "--endpoint",
                endpoint,
                "--rate",
                "50",
                "--poisson",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    row = json.loads((out / "results.json").read_text())["results"][0]["rows"][0]
    assert row["completed"] == 4 and row["failed"] == 0
    assert row["output_tokens"] == 4 * 4  # the server's usage (the tiny model never ends before max tokens here)


def test_failed_requests_are_counted_not_fatal(url, tmp_path):
    out = tmp_path / "out"
    assert (
        main(
            [
                "bench-serve",
                "--url",
                url,
                "--model",
                "not-served",
                "--concurrency",
                "2",
                "--num-prompts",
                "3",
                "--suite",
                "quick",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    row = json.loads((out / "results.json").read_text())["results"][0]["rows"][0]
    assert row["completed"] == 0 and row["failed"] == 3 and "NotFoundError" in row["errors"][0]


def test_json_object_asks_for_json(tmp_path):
    """--json-object sends response_format: a server on a byte-level tokenizer answers JSON objects."""
    from tiny_hf import make_tiny_bpe_dir

    target = resolve_model(str(make_tiny_bpe_dir(tmp_path / "bpe", context=512)))
    app = create_app(Engine(target, drafter="prompt-lookup"), served_model_name="tiny")
    seen = []
    real_submit = app.state.server.thread.submit

    def submit(prompt, queue=None, **params):
        seen.append(params.get("structured_output"))
        return real_submit(prompt, queue=queue, **params)

    app.state.server.thread.submit = submit
    with BackgroundServer(app) as base:
        argv = ["bench-serve", "--url", base, "--concurrency", "2", "--num-prompts", "3", "--max-tokens", "8"]
        assert main(argv + ["--suite", "quick", "--json-object", "--out", str(tmp_path / "out")]) == 0
    app.state.server.close()
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    assert data["settings"]["response_format"] == "json_object"
    assert data["results"][0]["rows"][0]["completed"] == 3
    assert seen and all(s is not None and s.kind == "json" for s in seen)


def test_sampling_settings_reach_the_server(url, tmp_path):
    """--temperature and --top-p go with every request (greedy by default) and the report names them."""
    from leapdecode.lab.bench import serve as bench_serve

    seen, real = [], bench_serve.streamed_call

    class Client:  # records each call's keywords, then makes it
        def __init__(self, client):
            self.client, self.chat = client, self
            self.completions = self

        def create(self, **kw):
            seen.append({k: kw.get(k) for k in ("temperature", "top_p")})
            return self.client.chat.completions.create(**kw)

    bench_serve.streamed_call = lambda client, *a: real(Client(client), *a)
    try:
        argv = ["bench-serve", "--url", url, "--concurrency", "2", "--num-prompts", "3", "--max-tokens", "6"]
        assert (
            main(argv + ["--suite", "quick", "--temperature", "0.8", "--top-p", "0.9", "--out", str(tmp_path / "s")])
            == 0
        )
        calls = len(seen)  # the level's requests and the warm-up before them
        assert main(argv + ["--suite", "quick", "--out", str(tmp_path / "g")]) == 0
    finally:
        bench_serve.streamed_call = real
    assert calls >= 3 and seen[:calls] == [{"temperature": 0.8, "top_p": 0.9}] * calls
    assert seen[calls:] == [{"temperature": 0.0, "top_p": None}] * calls
    sampled = json.loads((tmp_path / "s" / "results.json").read_text())
    assert sampled["settings"]["sampling"] == "Sampled (unseeded): temperature 0.8, top_p 0.9"
    assert sampled["results"][0]["rows"][0]["completed"] == 3
    assert "Sampled (unseeded): temperature 0.8, top_p 0.9, streamed" in (tmp_path / "s" / "report.md").read_text()
    assert json.loads((tmp_path / "g" / "results.json").read_text())["settings"]["sampling"] == "Greedy (temperature 0)"


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--temperature", "-1"], "--temperature"),
        (["--top-p", "0"], "--top-p"),
        (["--concurrency", "0"], "--concurrency"),
        (["--concurrency", "a,b"], "--concurrency"),
        (["--poisson"], "--poisson goes with --rate"),
        (["--suite", "/no/such/file"], "suite"),
        (["--num-prompts", "0"], "--num-prompts"),
    ],
)
def test_bad_options_fail_in_one_line(argv, message, capsys, tmp_path):
    assert main(["bench-serve", "--url", "http://127.0.0.1:9", "--out", str(tmp_path), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


def test_percentile_interpolates_like_numpy():
    assert _pct([], 50) is None
    assert _pct([3.0, 1.0, 2.0], 50) == 2.0
    assert _pct(list(map(float, range(1, 101))), 99) == pytest.approx(99.01)
    assert _pct([1.0, 2.0], 50) == pytest.approx(1.5)
    assert _pct([5.0], 99) == 5.0


def test_compare_runs_three_servers_on_one_directory():
    labels = [label for label, _, _ in server_commands("/m", 8765, 2)]
    assert labels == [
        "leapdecode serve (speculation on: auto)",
        "leapdecode serve (speculation off)",
        "transformers serve --continuous-batching",
    ]
    commands = [c for _, c, _ in server_commands("/m", 8765, 2, "head", "smollm2-135m")]
    assert commands[0][-4:] == ["--drafter", "head", "--head", "smollm2-135m"]
    assert commands[1][-2:] == ["--drafter", "none"]
    assert all("/m" in c and "8765" in c for c in commands)
    assert "--continuous-batching" in commands[2] and "127.0.0.1" in commands[2]


def test_step_columns_only_where_steps_ran():
    before = {"steps": 10, "step_seconds": 1.0, "forward_seconds": 0.8}
    after = {"steps": 30, "step_seconds": 2.0, "forward_seconds": 1.6}
    assert step_columns(before, after) == {"engine_steps": 20, "step_ms": 50.0, "forward_ms": 40.0}
    served = step_columns({**before, "handover_seconds": 0.1}, {**after, "handover_seconds": 0.14})
    assert served == {"engine_steps": 20, "step_ms": 50.0, "forward_ms": 40.0, "handover_ms": 2.0}
    assert step_columns(None, after) == {} and step_columns(before, before) == {}  # a peer; a level without a step


def test_a_server_without_step_counters_reads_as_none(url):
    assert scrape_step_counters(url + "/nothing-here") is None  # /metrics not found there
    assert set(scrape_step_counters(url)) == {"steps", "step_seconds", "forward_seconds", "handover_seconds"}
