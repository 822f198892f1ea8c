"""Peers in the benchmarks (OpenVINO GenAI): the method registry, the one-line error when the extra is absent, the
worker protocol, and how a peer is reported and counted — all without OpenVINO, through test doubles named
`Fake...` / `stub` below. One slow test runs the real peer where `leapdecode[peers]` is installed."""

from __future__ import annotations

import importlib.util
import json
import sys
import textwrap

import pytest
import torch
from conftest import tiny_model
from test_bench import SMALL, char_tokenizer, write_jsonl

from leapdecode.cli import main
from leapdecode.errors import LeapDecodeError
from leapdecode.lab.bench import batch as bench_batch
from leapdecode.lab.bench import batch_cli, peers
from leapdecode.lab.bench import run as bench_run
from leapdecode.lab.bench.cli import default_methods
from leapdecode.lab.bench.methods import ALL_METHODS, METHODS, parse_methods, truncate_at_eos
from leapdecode.lab.bench.peer_export import INSTALL_HINT, ensure_ir, ir_dir
from leapdecode.lab.bench.run import run_benchmark
from leapdecode.lab.bench.runner import BenchConfig
from leapdecode.lab.bench.suites import load_suite
from leapdecode.models import LoadedModel

HAS_OPENVINO = importlib.util.find_spec("openvino_genai") is not None


@pytest.fixture
def no_openvino(monkeypatch):
    """OpenVINO GenAI looks absent, whether or not it is installed here."""
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "openvino_genai" else real(name, *a)
    )


@pytest.fixture
def openvino_present(monkeypatch):
    monkeypatch.setattr(peers, "check_available", lambda: "2026.4.1")
    import leapdecode.lab.bench.methods as methods

    monkeypatch.setattr(methods, "check_available", lambda: "2026.4.1")


# ---------------------------------------------------------------- registry and the missing extra


def test_peer_methods_are_registered_but_never_default(openvino_present):
    assert set(peers.PEER_METHODS) == {"openvino", "openvino-prompt-lookup"}
    assert set(peers.PEER_METHODS) <= set(ALL_METHODS) and not set(peers.PEER_METHODS) & set(METHODS)
    assert not set(default_methods(has_draft=True, has_head=True).split(",")) & set(peers.PEER_METHODS)
    assert "openvino-cb" in bench_batch.METHODS
    assert parse_methods("hf-generate,openvino,openvino-prompt-lookup", has_draft=False)[-1] == "openvino-prompt-lookup"
    assert all(peers.is_peer(m) for m in ("openvino", "openvino-prompt-lookup", "openvino-cb"))
    assert not peers.is_peer("engine") and not peers.is_peer("none")


def test_absent_peer_fails_with_one_line(no_openvino, tmp_path, capsys):
    with pytest.raises(LeapDecodeError, match=r"pip install 'leapdecode\[peers\]'"):
        parse_methods("none,openvino", has_draft=False)
    out = str(tmp_path / "o")
    # both commands refuse before loading any model ('x' does not exist)
    assert main(["bench", "--model", "x", "--methods", "hf-generate,openvino", "--out", out]) == 2
    assert main(["bench-batch", "--model", "x", "--methods", "engine,openvino-cb", "--out", out]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2 and all(line.startswith("leapdecode: error: ") and INSTALL_HINT in line for line in lines)
    assert "Traceback" not in "".join(lines)


def test_conversion_refuses_a_model_that_is_no_directory(monkeypatch):
    monkeypatch.setattr("leapdecode.lab.bench.peer_export.openvino_version", lambda: "2026.4.1")
    from types import SimpleNamespace

    with pytest.raises(LeapDecodeError, match="model directory with config.json"):
        ensure_ir(SimpleNamespace(name="tiny", path="memory"))


def test_ir_cache_key_follows_the_model(tmp_path, monkeypatch):
    monkeypatch.setenv("LEAPDECODE_CACHE", str(tmp_path / "cache"))
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text('{"a": 1}')
    first = ir_dir("org/Model", tmp_path / "m", "2026.4.1")
    assert first.parent == tmp_path / "cache" / "openvino" and first.name.startswith("Model-")
    assert first.name.endswith("-ov2026.4.1") and ir_dir("org/Model", tmp_path / "m", "2026.5.0") != first
    (tmp_path / "m" / "config.json").write_text('{"a": 2}')
    assert ir_dir("org/Model", tmp_path / "m", "2026.4.1") != first


# ---------------------------------------------------------------- the worker protocol (stub worker: a test double)

STUB = textwrap.dedent(
    """
    # TEST DOUBLE of peer_worker.py: answers the protocol without OpenVINO
    import json, sys
    for line in sys.stdin:
        req = json.loads(line)
        if req["op"] == "die":
            print("stub worker: fatal problem", file=sys.stderr)
            sys.exit(1)
        if req["op"] == "boom":
            print(json.dumps({"error": "RuntimeError: bad input", "peak_rss_mb": 10.0}), flush=True)
        else:
            print(json.dumps({"echo": req, "peak_rss_mb": 12.5}), flush=True)
    """
)


def test_worker_protocol_and_its_errors(tmp_path):
    stub = tmp_path / "stub_worker.py"
    stub.write_text(STUB)
    worker = peers.PeerWorker([sys.executable, str(stub)])
    try:
        answer = worker.call("generate", ids=[1, 2, 3])
        assert answer["echo"] == {"op": "generate", "ids": [1, 2, 3]} and worker.peak_rss_mb == 12.5
        assert 0 < worker.private_mb() < 1000  # its own memory, read from the OS (the answer's peak where it cannot)
        with pytest.raises(LeapDecodeError, match="failed during 'boom': RuntimeError: bad input"):
            worker.call("boom")
        with pytest.raises(LeapDecodeError, match="worker exited during 'die': stub worker: fatal problem"):
            worker.call("die")
    finally:
        worker.close()


LOGGING_STUB = textwrap.dedent(
    """
    # TEST DOUBLE of peer_worker.py: logs each request with its process id, answers load and generate
    import json, os, sys
    for line in sys.stdin:
        req = json.loads(line)
        with open(sys.argv[1], "a") as log:
            log.write(json.dumps({"pid": os.getpid(), **req}) + "\\n")
        if req["op"] == "load":
            print(json.dumps({"peak_rss_mb": 6000.0, "cpu_defaults": {}, "properties": {}}), flush=True)
        else:
            print(json.dumps({"tokens": [7], "wall": 0.1, "ttft": 0.05, "peak_rss_mb": 6000.0}), flush=True)
    """
)


@pytest.mark.parametrize("free_mb", [20000, 7000])
def test_peers_load_one_at_a_time_where_memory_holds_one(tmp_path, monkeypatch, free_mb):
    import leapdecode.host

    stub, log = tmp_path / "stub_worker.py", tmp_path / "log.jsonl"
    stub.write_text(LOGGING_STUB)
    monkeypatch.setattr(peers, "check_available", lambda: "2026.4.1")
    monkeypatch.setattr(peers, "ensure_ir", lambda target, console=None: tmp_path / "ir")
    monkeypatch.setattr(peers, "peer_precision", lambda target: ("fp32", "f32"))
    monkeypatch.setattr(leapdecode.host, "available_memory", lambda: free_mb << 20)
    monkeypatch.setattr(peers.PeerWorker, "private_mb", lambda self: 6000.0)  # a 1.5B pipeline's own memory
    group = peers.Peers(command=[sys.executable, str(stub), str(log)])
    group.start(["none", "openvino", "openvino-prompt-lookup"], None, 2)
    try:
        for prompt in ([1, 2], [3, 4], [5, 6]):  # the first is the run's warm-up call
            for method in ("openvino", "openvino-prompt-lookup"):
                assert group.generate(method, prompt, None, 8, [0])["tokens"] == [7]
    finally:
        group.close()
    requests = [json.loads(line) for line in log.read_text().splitlines()]
    loads = [r for r in requests if r["op"] == "load"]
    generates = [r for r in requests if r["op"] == "generate"]
    lookup = [r["prompt_lookup"] for r in loads]
    one_at_a_time = free_mb < 1.25 * 6000
    assert group.one_at_a_time is one_at_a_time
    if not one_at_a_time:  # both loaded once, side by side
        assert lookup == [False, True] and len(generates) == 6
        assert group.load_count == {"openvino": 1, "openvino-prompt-lookup": 1}
        return
    assert lookup == [False, True] * 3  # every call for the other peer reloads it
    by_pid = {}
    for r in requests:
        by_pid.setdefault(r["pid"], []).append(r)
    assert len(by_pid) == 6  # and each load is a process of its own (the last one closed before the next)
    for i, calls in enumerate(by_pid.values()):
        ops = [(c["op"], tuple(c.get("ids", ()))) for c in calls]
        warm = [("generate", (1, 2))] if i else []  # a reload repeats the warm-up call before its own
        assert ops == [("load", ()), *warm, ("generate", ((1, 2), (3, 4), (5, 6))[i // 2])]
        drafts = {c.get("num_assistant_tokens") for c in calls if c["op"] == "generate"}
        assert drafts == ({4} if calls[0]["prompt_lookup"] else {None})  # the warm-up is its own peer's call
    assert group.load_count == {"openvino": 3, "openvino-prompt-lookup": 3}


# ---------------------------------------------------------------- reporting a peer (FakePeers: a test double)


class FakePeers:
    """TEST DOUBLE for peers.Peers: both peers decode with the tiny HF model itself; 'openvino' then changes token
    `corrupt_from` of every answer longer than that, so the accounting of a peer that differs is seen."""

    corrupt_from = 3

    def __init__(self, target):
        self.target, self.calls = target, 0
        self.workers = {}

    def start(self, methods, target, threads, console=None):
        self.workers = {m: object() for m in methods if m in peers.PEER_METHODS}
        return self

    def generate(self, method, prompt_ids, text, max_new_tokens, eos_ids):
        self.calls += 1
        with torch.inference_mode():
            out = self.target.model.generate(
                torch.tensor([prompt_ids]), max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=list(eos_ids)
            )
        tokens = truncate_at_eos(out[0, len(prompt_ids) :].tolist(), set(eos_ids))
        if method == "openvino" and len(tokens) > self.corrupt_from:
            i = self.corrupt_from
            tokens = tokens[:i] + [(tokens[i] + 1) % len(self.target.tokenizer)] + tokens[i + 1 :]
        return {"tokens": tokens, "wall": 0.01, "ttft": 0.001, "peak_rss_mb": 321.0}

    def describe(self):
        return {m: "TEST DOUBLE (no OpenVINO)" for m in self.workers}

    def close(self):
        pass


@pytest.fixture(scope="module")
def tiny_target():
    tok = char_tokenizer()
    return LoadedModel(model=tiny_model("llama", seed=3, vocab=len(tok)), tokenizer=tok, name="tiny", path="memory")


def test_a_differing_peer_is_shown_and_counted_apart(tiny_target, tmp_path, monkeypatch, openvino_present):
    fake = FakePeers(tiny_target)
    monkeypatch.setattr(bench_run, "Peers", lambda: fake)
    questions = load_suite(write_jsonl(tmp_path / "s.jsonl", SMALL))
    cfg = BenchConfig(
        methods=["hf-generate", "none", "openvino", "openvino-prompt-lookup"], max_new_tokens=10, repeats=2
    )
    res = run_benchmark(tiny_target, questions, cfg, tmp_path / "out", suite="s", progress=False)
    data = json.loads(res.results.read_text())
    summary, overall = data["summary"], data["summary"]["groups"]["overall"]
    assert fake.calls == 2 * (1 + 3 * 2)  # two peers: warm-up, then 3 turns x 2 repeats
    assert summary["mismatched_outputs"] == 0 and summary["outputs"] == 2 * 3 * 2  # ours: lossless
    differing = [r for r in data["records"] if r["method"] == "openvino" and not r["identical"]]
    assert len(differing) >= 2 and all(r["new_tokens"] > FakePeers.corrupt_from for r in differing)
    assert summary["peer_outputs"] == 2 * 3 * 2 and summary["peer_mismatched_outputs"] == len(differing)
    assert overall["openvino"]["identical_share"] < 1 and overall["openvino-prompt-lookup"]["identical_share"] == 1
    assert overall["openvino"]["mean_accepted_tokens"] is None and overall["openvino"]["peak_rss_mb"] == 321.0
    assert overall["none"]["peak_rss_mb"] > 0  # the bench process's own
    assert differing[0]["first_difference"] == 3 and differing[0]["divergence"]["position"] == 3
    assert data["meta"]["setup"]["peer openvino"] == "TEST DOUBLE (no OpenVINO)"
    report = res.report.read_text()
    top = report.split("## Setup")[0]
    assert "MISMATCH" not in top and "Peers whose outputs differ" in top
    assert f"Peers: {12 - len(differing)} of 12 outputs identical" in top
    overall_table = report.split("## Overall")[1]
    row = next(line for line in overall_table.splitlines() if line.startswith("| openvino |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[4:6] == ["–", "–"] and "differs** (peer)" in cells[7] and cells[8] == "321"
    assert "peak RSS MiB" in report and "| openvino-prompt-lookup |" in report


def test_bench_batch_reports_a_peer_that_differs_without_failing(tmp_path, monkeypatch, capsys):
    from tiny_hf import make_tiny_hf_dir

    model_dir = make_tiny_hf_dir(tmp_path / "tiny", context=512)
    monkeypatch.setattr(batch_cli, "check_available", lambda: "2026.4.1")
    monkeypatch.setattr(batch_cli, "ensure_ir", lambda target, console=None: tmp_path / "ir")

    def fake_run_cb(target, prompts, c, max_new_tokens, **kw):  # TEST DOUBLE of peers.run_cb
        ref = bench_batch.run_hf_generate(target, prompts, max_new_tokens)
        tokens = [list(t) for t in ref["tokens"]]
        tokens[0][0] = (tokens[0][0] + 1) % 60
        n = len(prompts)
        answer = {"tokens": tokens, "sent": [0.0] * n, "first": [0.1] * n, "end": [0.5] * n, "wall": 0.5}
        info = {
            "openvino_genai": "TEST DOUBLE",
            "ir": "none",
            "weights": "fp32",
            "properties": {"INFERENCE_NUM_THREADS": 1, "INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"},
            "cpu_defaults": {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "u8"},
        }
        return dict(answer, peak_rss_mb=99.0), info

    monkeypatch.setattr(batch_cli, "run_cb", fake_run_cb)
    out = tmp_path / "bb"
    argv = ["bench-batch", "--model", str(model_dir), "--suite", "quick", "--concurrency", "1,2", "--requests", "2"]
    argv += ["--max-new-tokens", "5", "--methods", "engine,openvino-cb", "--no-progress", "--fail-on-mismatch"]
    assert main(argv + ["--out", str(out)]) == 0  # a peer that differs is shown, never fails our check
    runs = json.loads((out / "results.json").read_text())["runs"]
    cb = [r for r in runs if r["method"] == "openvino-cb"]
    assert [r["concurrency"] for r in cb] == [1, 2] and all(r["identical"] == 1 and r["peak_rss_mb"] == 99 for r in cb)
    assert all(r["identical"] == 2 and r["peak_rss_mb"] > 0 for r in runs if r["method"] == "engine")
    report = (out / "report.md").read_text()
    assert "| openvino-cb | 2 |" in report and "1 of 2 | 99 |" in report and "Outputs that differ" in report
    assert "openvino-cb: OpenVINO GenAI TEST DOUBLE ContinuousBatchingPipeline" in report


# ---------------------------------------------------------------- the real peer


@pytest.mark.slow
def test_real_openvino_peer_on_smollm2(tmp_path):
    if not HAS_OPENVINO:
        pytest.skip(f"OpenVINO GenAI is not installed ({INSTALL_HINT})")
    import pathlib

    from leapdecode.lab.bench.peer_export import openvino_version
    from leapdecode.models import load_model
    from leapdecode.models.registry import is_cached, read_manifest
    from leapdecode.prompt import encode_prompt

    if not is_cached("smollm2-135m"):
        pytest.skip("smollm2-135m is not cached: leapdecode models pull smollm2-135m")
    target = load_model("smollm2-135m")
    if read_manifest(ir_dir(target.name, pathlib.Path(target.path), openvino_version())) is None:
        pytest.skip(
            "its OpenVINO IR is not converted yet (a one-off ~1.5 GB exporter venv): run "
            "leapdecode bench --methods openvino --suite quick --out DIR once"
        )
    questions = load_suite("quick")[:1]
    turns = len(questions[0].turns)
    cfg = BenchConfig(methods=["hf-generate", "openvino", "openvino-prompt-lookup"], max_new_tokens=24, repeats=1)
    torch.set_num_threads(2)
    res = run_benchmark(target, questions, cfg, tmp_path / "out", suite="quick", progress=False)
    data = json.loads(res.results.read_text())
    overall = data["summary"]["groups"]["overall"]
    assert data["summary"]["peer_outputs"] == 2 * turns
    for method in ("openvino", "openvino-prompt-lookup"):
        assert overall[method]["new_tokens"] > 0 and overall[method]["peak_rss_mb"] > 100
        setup = data["meta"]["setup"][f"peer {method}"]
        assert "inference precision f32, KV cache f32" in setup and f"same ids on {turns} of {turns} distinct" in setup
    prompts = [encode_prompt(target.tokenizer, q.turns[0]) for q in load_suite("quick")[:3]]
    answer, info = peers.run_cb(target, prompts, 2, 8, threads=2)
    assert len(answer["tokens"]) == 3 and all(answer["tokens"])
    assert info["properties"]["KV_CACHE_PRECISION"] == "f32" and answer["peak_rss_mb"] > 100
