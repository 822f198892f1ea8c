"""Kernel choice: every linear path gives the same greedy tokens, calibration picks the fastest path per shape and
row count and caches it per host, and missing or failing oneDNN ops fall back to F.linear with a one-line notice."""

import json
import logging
import os
import subprocess
import sys
import time

import pytest
import torch
from conftest import tiny_model

from leapdecode import kernels
from leapdecode.kernels import calibrate, native_linear, ops, whole_step
from leapdecode.kernels.calibrate import Plan
from leapdecode.lab.report_kit import other_load
from leapdecode.runner import Runner


@pytest.fixture(autouse=True)
def private_cache(private_calibration):
    return private_calibration


def _greedy(runner: Runner, prompt: list[int], n: int) -> tuple[list[int], torch.Tensor]:
    """n greedy tokens one forward at a time, then the argmaxes of one forward over all of them (a verification)."""
    tokens = [int(runner.prefill(prompt).argmax())]
    for _ in range(n - 1):
        tokens.append(int(runner.forward([tokens[-1]])[0].argmax()))
    runner.rollback(n - 1)
    return tokens, runner.forward(tokens).argmax(-1)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_every_kernel_path_gives_the_same_greedy_tokens(arch):
    model = tiny_model(arch, seed=11, vocab=97)
    prompt = torch.randint(0, 97, (7,), generator=torch.Generator().manual_seed(2)).tolist()
    with torch.no_grad():
        reference = model.generate(
            torch.tensor([prompt]),
            max_new_tokens=12,
            do_sample=False,
            attention_mask=torch.ones(1, 7, dtype=torch.long),
        )[0, 7:].tolist()
    seen = set()
    for linear in kernels.MODES:
        for argmax_head in ("off", "on"):
            with kernels.configured(linear=linear, argmax_head=argmax_head):
                runner = Runner(model)
                runner.argmax_only = True
                tokens, verified = _greedy(runner, prompt, 12)
                seen |= {kernels.chosen_path(model.get_output_embeddings(), rows, True, True) for rows in (1, 12)}
            assert tokens == reference, (linear, argmax_head)
            assert verified[:-1].tolist() == tokens[1:], (linear, argmax_head)
    every = {"packed", "packed-pad", "hf"} | ({"native"} if native_linear.library() is not None else set())
    assert set(kernels.ARGMAX_PATHS) & seen and every <= seen  # every path really ran


def test_plan_takes_the_fastest_path_at_the_nearest_bucket_and_prefers_f_linear_on_near_ties():
    linear = {
        "buckets": [1, 4, 16],
        "ms": {"hf": [1.0, 2.0, 3.0], "packed": [0.5, 1.99, None], "packed-pad": [0.4, None, None]},
    }
    plan = Plan(linear)
    assert [plan.linear(r) for r in (1, 2, 3, 4, 9, 10, 16, 500)] == [
        "packed-pad",
        "packed-pad",
        "hf",
        "hf",
        "hf",
        "hf",
        "hf",
        "hf",
    ]  # 1.99 is within the margin of 2.0
    assert plan.ranges() == [(1, 2, "packed-pad"), (3, 16, "hf")]
    argmax = {
        "buckets": [1, 4, 16],
        "ms": {"argmax-bf16-packed": [0.3, 2.5, None], "argmax-bf16-linear": [0.2, 3.0, 9]},
    }
    plan = Plan(linear, argmax)
    assert [plan.argmax(r) for r in (1, 4, 16)] == ["argmax-bf16-linear", "hf", "hf"]
    assert [plan.argmax_variant(r) for r in (1, 4, 16)] == [
        "argmax-bf16-linear",
        "argmax-bf16-packed",
        "argmax-bf16-linear",
    ]
    assert plan.linear(0) == "packed-pad"  # an empty call still finds a bucket
    coarse = Plan(linear, {"buckets": [1, 16], "ms": {"argmax-bf16-linear": [0.2, 1.0]}})  # fewer row counts timed
    assert [coarse.argmax(r) for r in (1, 4, 16)] == ["argmax-bf16-linear", "argmax-bf16-linear", "argmax-bf16-linear"]


def test_calibration_is_cached_on_disk_per_host_and_inspectable(private_cache, monkeypatch):
    model = tiny_model("llama", seed=12, vocab=97)
    runner = Runner(model)
    table = kernels.kernel_table(model)
    linears = [m for part in (model, runner.decoder) for m in part.modules() if type(m) is torch.nn.Linear]
    running = [m for m in linears if not getattr(m, "_leapdecode_fused_part", False)]  # fused parts do not run
    shapes = {(m.out_features, m.in_features) for m in running}
    assert len(shapes) == 5  # o_proj, down_proj, the head, the fused q/k/v (the gate's shape) and gate/up
    assert {tuple(map(int, row["shape"].split("x"))) for row in table} == shapes
    timed = {tuple(map(int, k.split("|")[-2].split("x"))) for k in calibrate._memory if "|linear" in k}
    assert timed == shapes  # the parts' own shapes (k/v here) untimed: the fused layers run in their place
    for row in table:
        assert row["cached"] and row["linear"][0][0] == 1 and row["linear"][-1][1] == kernels.BUCKETS[-1]
        assert {path for _, _, path in row["linear"]} <= set(kernels.LINEAR_PATHS)
    assert sum("argmax" in row for row in table) == 1
    lines = kernels.describe_kernels(model)
    assert len(lines) == len(table) + 1 and lines[-1].startswith("whole steps (timed): ")  # kernels.whole_step's
    assert kernels.cache_file().exists()

    measured = []
    real = calibrate._measure
    monkeypatch.setattr(calibrate, "_measure", lambda *a: measured.append(a[0][0].shape) or real(*a))
    calibrate.forget()  # a new process: plans come from the disk cache
    Runner(tiny_model("llama", seed=13, vocab=97))
    assert measured == []
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)  # another thread count is another host key
    try:
        Runner(tiny_model("llama", seed=13, vocab=97))
    finally:
        torch.set_num_threads(threads)
    # every shape that runs (not the fused parts' own), and the head's argmax variants
    assert len(measured) == len(shapes) + 1


def test_a_cached_entry_measured_with_paths_of_another_version_is_measured_again(private_cache, monkeypatch):
    Runner(tiny_model("llama", seed=12, vocab=97))
    cached = json.loads(kernels.cache_file().read_text())
    for entry in cached.values():
        if "ms" in entry and "native" in entry["ms"]:
            entry["ms"]["native-old"] = entry["ms"].pop("native")  # a path this version does not have
    kernels.cache_file().write_text(json.dumps(cached))
    measured = []
    real = calibrate._measure
    monkeypatch.setattr(calibrate, "_measure", lambda *a: measured.append(a[0][0].shape) or real(*a))
    calibrate.forget()
    runner = Runner(tiny_model("llama", seed=13, vocab=97))
    runner.prefill([1, 2, 3])  # routes work: no unknown path is taken
    assert measured


def test_a_model_set_up_again_keeps_its_routes_and_native_step_tables():
    """Each request builds its Runner (and a draft head's drafter installs the head's kernels): installing the same
    plans again must not make every layer work out its path again, nor drop the native step's tables (it did, once
    per request)."""
    model = tiny_model("llama", seed=12, vocab=97)
    runner = Runner(model)
    runner.prefill([1, 2, 3])
    runner.forward([4])
    epoch, tables = kernels.packed._epoch[0], dict(runner.decoder.native_step._tables)
    assert tables
    again = Runner(model)
    again.prefill([1, 2, 3])
    again.forward([4])
    assert kernels.packed._epoch[0] == epoch
    assert all(again.decoder.native_step._tables.get(rows) is table for rows, table in tables.items())


def test_an_instruction_set_cap_is_another_host(monkeypatch):
    for name in calibrate.ISA_LIMITS:
        monkeypatch.delenv(name, raising=False)
    plain = calibrate.host_key()
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    capped = calibrate.host_key()
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "DEFAULT")
    assert len({plain, capped, calibrate.host_key()}) == 3


def test_timings_from_a_busy_machine_serve_the_process_but_are_not_cached(monkeypatch):
    monkeypatch.setattr(calibrate, "_quiet", lambda: False)
    model = tiny_model("llama", seed=14, vocab=97)
    Runner(model)
    assert not any(row["cached"] for row in kernels.kernel_table(model))
    assert "busy machine" in kernels.describe_kernels(model)[0]
    assert not kernels.cache_file().exists()
    monkeypatch.setattr(calibrate, "_quiet", lambda: True)
    Runner(tiny_model("llama", seed=14, vocab=101))  # quiet now: only its new output head shape is measured
    import json

    cached = json.loads(kernels.cache_file().read_text())
    per_shape = [key for key in cached if "|whole-step|" not in key]
    assert len(per_shape) == 2 and all("|101x64|" in key for key in per_shape)  # the head's linear and argmax timings
    assert len(cached) == 3  # and the new model's whole-step check (kernels.whole_step)


def test_forced_and_unknown_settings():
    model = tiny_model("llama", seed=15, vocab=97)
    with kernels.configured(linear="packed"):
        Runner(model)
        assert {row["linear"][0][2] for row in kernels.kernel_table(model)} == {"packed"}
    with pytest.raises(ValueError):
        kernels.configure(linear="fastest")
    with pytest.raises(ValueError):
        kernels.configure(argmax_head="yes")
    assert kernels.settings()["linear"] == "auto"
    assert isinstance(kernels.bf16_pays(), bool)


def _f_linear_reference(model, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """What a fallback must compute: the Runner's own forward with every layer on F.linear (the same path, hence the
    same bits on any host), and HF's forward of the model (another path: fused q/k/v products and another attention
    round differently where torch dispatches to AVX2 kernels, so only its greedy tokens must agree)."""
    with kernels.configured(linear="hf"):
        runner = Runner(model)
        runner.prefill(ids[:4])
        reference = runner.forward(ids[4:])
    with torch.inference_mode():
        hf_logits = model(torch.tensor([ids])).logits[0, 4:]
    return reference, hf_logits


@pytest.mark.parametrize("failure", ["missing", "failing", "wrong"])
def test_broken_mkldnn_ops_fall_back_to_f_linear_with_a_one_line_notice(monkeypatch, caplog, failure):
    def broken(flat, packed, bias):
        if failure == "wrong":
            return flat.new_zeros(flat.shape[0], packed.shape[0])
        if failure == "missing":
            raise AttributeError("'_OpNamespace' 'mkldnn' object has no attribute '_linear_pointwise'")
        raise RuntimeError("could not create a primitive\nfrom a long multi-line oneDNN message")

    model = tiny_model("llama", seed=16, vocab=97)
    ids = torch.randint(0, 97, (9,)).tolist()
    reference, hf_logits = _f_linear_reference(model, ids)
    monkeypatch.setattr(ops, "linear_pointwise", broken)
    monkeypatch.setattr(whole_step, "check", lambda *args: None)  # "auto" here: the per-layer plans alone
    ops.forget_checks()
    caplog.clear()  # the reference's own notices (no bf16 packing on an AVX2-only host) are not the fallback's
    with caplog.at_level(logging.WARNING, logger="leapdecode"):
        for linear in ("auto", "packed-pad"):
            with kernels.configured(linear=linear):
                runner = Runner(model)
                runner.prefill(ids[:4])
                fallback = runner.forward(ids[4:])
            assert torch.equal(fallback, reference), linear  # the same path (F.linear): the same bits
            assert torch.equal(fallback.argmax(-1), hf_logits.argmax(-1)), linear  # another path: the same tokens
    assert not kernels.packed_ops()
    notices = [r for r in caplog.records if "oneDNN" in r.getMessage()]
    assert len(notices) == 1 and "\n" not in notices[0].getMessage() and notices[0].exc_info is None


def test_a_packed_call_failing_at_run_time_falls_back_for_that_layer(monkeypatch, caplog):
    assert kernels.packed_ops()  # the check passed; later calls break
    model = tiny_model("llama", seed=17, vocab=97)
    ids = torch.randint(0, 97, (9,)).tolist()
    with kernels.configured(linear="packed"):
        runner = Runner(model)
        runner.prefill(ids[:4])  # the prompt's keys/values come through the packed path, as below
        with kernels.configured(linear="hf"):
            reference = runner.forward(ids[4:])
    with torch.inference_mode():
        hf_logits = model(torch.tensor([ids])).logits[0, 4:]
    with kernels.configured(linear="packed"):
        runner = Runner(model)
        runner.prefill(ids[:4])
        monkeypatch.setattr(ops, "linear_pointwise", lambda *a: (_ for _ in ()).throw(RuntimeError("bad\nshape")))
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="leapdecode"):
            fallback = runner.forward(ids[4:])
    assert torch.equal(fallback, reference)  # the same paths (packed prefill, then F.linear): the same bits
    assert torch.equal(fallback.argmax(-1), hf_logits.argmax(-1))  # HF's own forward: the same greedy tokens
    assert len({r.getMessage() for r in caplog.records}) == 1 and all(r.exc_info is None for r in caplog.records)


def test_a_process_competing_for_the_cores_is_seen_at_once():
    """Runnable tasks are sampled now, not averaged over the last minute."""
    if not os.path.exists("/proc/stat"):
        pytest.skip("no /proc/stat on this OS")
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        assert other_load() >= 1
    finally:
        spinner.kill()
        spinner.wait()


def test_a_step_that_keeps_no_logits_leaves_the_argmax_head_working(tmp_path, caplog):
    """An engine step that only reads part of a long prompt keeps no rows: the output head gets none. It once
    raised there (a reshape of 0 rows), and the fallback then ran the head in fp32 for the rest of the process."""
    from tiny_hf import make_tiny_hf_dir

    from leapdecode import generate
    from leapdecode.engine import Engine

    target = str(make_tiny_hf_dir(tmp_path / "tiny", context=512))
    prompt = [5 + i % 40 for i in range(70)]  # read in chunks of max_batch_tokens: the first steps keep no rows
    with kernels.configured(argmax_head="on"), caplog.at_level(logging.WARNING, logger="leapdecode"):
        engine = Engine(target, max_batch_tokens=16)
        result = engine.generate_many([prompt], max_new_tokens=8)[0]
    head = engine.model.get_output_embeddings()
    assert not getattr(head, "_leapdecode_broken", False)
    assert not [r for r in caplog.records if "failed" in r.getMessage()]  # (AVX2: "no bf16 packing" is expected)
    assert result.token_ids == generate(target, prompt, max_new_tokens=8).token_ids
