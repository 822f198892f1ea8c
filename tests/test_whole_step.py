"""Kernel choice checked on whole steps (kernels.whole_step): per row count the faster of the per-layer plans and the
panel kernel everywhere, by timing the forward itself; layers routed by the outcome; the outcome cached per host,
model and settings; and the model's tokens unchanged by whichever way runs."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model

from leapdecode import kernels
from leapdecode.kernels import BUCKETS, calibrate, packed, whole_step
from leapdecode.runner import Runner


@pytest.fixture(autouse=True)
def private_cache(private_calibration):
    return private_calibration


def prepared(seed: int, vocab: int = 97):
    """A tiny Llama with its kernels installed and calibrated (a Runner made on it), its layers' plans forced to
    F.linear at every row count (so that both ways differ everywhere), and the layers a forward runs."""
    model = tiny_model("llama", seed=seed, vocab=vocab)
    runner = Runner(model)
    layers = whole_step.layers_of(model, runner.decoder)
    for layer in layers:
        plan = layer._leapdecode_plan
        plan._linear = plan._argmax = ["hf"] * len(plan.buckets)
        layer.__dict__.pop("_leapdecode_native_rows", None)
    model.__dict__.pop("_leapdecode_whole_step", None)
    for key in [k for k in calibrate._memory if "|whole-step|" in k]:  # the Runner's own check, forgotten
        del calibrate._memory[key]
    packed.forget_routes()
    return model, layers


class Clock:
    """whole_step's clock in these tests: it moves only by what a stand-in forward says it took, so a tie is a tie
    however busy the machine (real sleeps overshoot by more than calibration's margin under load)."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    fake = Clock()
    monkeypatch.setattr(whole_step, "time", fake)
    return fake


def sleeping(clock, native_s, plan_s, calls=None):
    """A stand-in forward that takes `native_s(rows)` seconds on `clock` with every layer forced onto the panel
    kernel and `plan_s(rows)` otherwise."""

    def forward(rows: int) -> None:
        if calls is not None:
            calls.append(rows)
        clock.now += native_s(rows) if kernels.settings()["linear"] == "native-q" else plan_s(rows)

    return forward


def test_each_row_count_takes_the_way_its_whole_forward_ran_faster(clock):
    model, layers = prepared(seed=1)
    forward = sleeping(clock, lambda rows: 0.003 if rows <= 8 else 0.001, lambda rows: 0.002)
    entry = whole_step.measure(layers, forward)
    assert entry["buckets"] == list(BUCKETS)
    assert entry["native"] == [rows > 8 for rows in BUCKETS]
    assert all(p is not None and n is not None for p, n in zip(entry["ms"]["plan"], entry["ms"]["native"]))


def test_a_tie_goes_to_the_panel_kernel_and_rows_it_already_runs_are_not_timed(clock):
    model, layers = prepared(seed=2)
    on_panels = {b for b in BUCKETS if b >= 32}
    for layer in layers:  # the plan itself takes the panel kernel from 32 rows on
        plan = layer._leapdecode_plan
        want = "native-q" if packed.coded_bits(layer) else "native"
        plan._linear = plan._argmax = [want if b in on_panels else "hf" for b in plan.buckets]
    packed.forget_routes()
    calls = []
    entry = whole_step.measure(layers, sleeping(clock, lambda rows: 0.002, lambda rows: 0.002, calls))
    assert all(entry["native"])  # within the margin: the panel kernel (one native call, the same bits per row)
    assert set(calls) == set(BUCKETS) - on_panels
    table = whole_step.NativeRows(entry["native"])
    assert table(1) and table(BUCKETS[-1]) and not table(BUCKETS[-1] + 1)  # past the timed rows: the plans


def test_the_outcome_routes_every_layer_and_is_read_from_the_cache_afterwards(clock):
    model, layers = prepared(seed=3)
    calls = []
    forward = sleeping(clock, lambda rows: 0.0005 if rows < 16 else 0.003, lambda rows: 0.0015, calls)
    table = whole_step.check(model, layers, lambda: forward)
    assert calls and table.native == tuple(rows < 16 for rows in BUCKETS)
    head = model.lm_head
    for layer in layers:
        assert layer._leapdecode_native_rows is table
    for rows, native in ((1, True), (9, True), (16, False), (64, False)):
        path = packed.chosen_path(head, rows, True, argmax_only=True)
        assert (path == "native-q") == native, rows
    calibrate._save()
    again, again_layers = prepared(seed=3)  # the same model again: the outcome from the disk cache, nothing timed
    calibrate.forget()
    calls.clear()
    assert whole_step.check(again, again_layers, lambda: forward).native == table.native and not calls
    with kernels.configured(step="layers"):  # other settings: another outcome, measured anew
        whole_step.check(again, again_layers, lambda: forward)
    assert calls


def test_greedy_tokens_are_the_same_whichever_way_runs():
    """A real check on a tiny model (both ways timed), then a verification forward and one-row steps: the panel
    kernel wherever it was chosen gives the verified rows the one-row steps' bits; every token equals F.linear's."""
    model = tiny_model("llama", seed=4, vocab=97)
    ids = torch.randint(0, 97, (14,), generator=torch.Generator().manual_seed(4)).tolist()
    with kernels.configured(linear="hf"):
        reference = Runner(model)
        reference.argmax_only = True
        reference.prefill(ids[:6])
        want = reference.forward(ids[6:]).argmax(-1)
    runner = Runner(model)  # "auto": whole_step.check has run for this model
    assert model._leapdecode_whole_step is not None
    runner.argmax_only = True
    runner.prefill(ids[:6])
    verified = runner.forward(ids[6:])
    runner.rollback(len(ids) - 6)
    alone = torch.cat([runner.forward([t]) for t in ids[6:]])
    assert torch.equal(verified.argmax(-1), want) and torch.equal(alone.argmax(-1), want)
    native = model.lm_head._leapdecode_native_rows
    if native(1) and native(len(ids) - 6):
        assert torch.equal(verified, alone)


def test_every_weight_a_call_can_take_is_derived_when_the_model_is_prepared(monkeypatch):
    """Codes, panels and packed or bf16 copies are built when a Runner is made (whole_step.check prepares every layer's
    routes), never by the first call at a row count: mid-request, that call would wait for the build (seconds on a
    0.5B model's output head; calibration read from the disk cache times nothing, so nothing was built before)."""
    if not packed.available("packed", torch.float32):
        pytest.skip("no packed fp32 kernels here")
    prepares = []
    real_prepare_routes = whole_step.prepare_routes
    monkeypatch.setattr(
        whole_step, "prepare_routes", lambda m, rows: prepares.append(m) or real_prepare_routes(m, rows)
    )
    model = tiny_model("llama", seed=31, vocab=97)
    runner = Runner(model)
    layers = whole_step.layers_of(model, runner.decoder)
    assert set(map(id, prepares)) == set(map(id, layers))
    runner.prefill(list(range(40)))
    for layer in layers:  # a plan of two paths, as real models have, and nothing derived yet
        layer._leapdecode_plan._linear = ["native" if b <= 8 else "packed" for b in layer._leapdecode_plan.buckets]
        layer.__dict__.pop("_leapdecode_native_rows", None)
        packed.drop_derived(layer, set())
        packed._derived.get(layer, {}).pop("native-q", None)
    packed.forget_routes()
    built = []
    real_prepare = packed.prepare
    monkeypatch.setattr(packed, "prepare", lambda path, weight: built.append(path) or real_prepare(path, weight))

    def calls():
        for rows in (1, 2, 7, 13, 24, 48, 130, 300):  # every bucket's neighbourhood, and past the largest
            runner.forward([i % 97 for i in range(rows)])
            runner.rollback(rows)

    calls()
    assert {"native", "packed"} <= set(built)  # built by the calls themselves
    for layer in layers:
        packed.drop_derived(layer, set())
        packed._derived.get(layer, {}).pop("native-q", None)
        real_prepare_routes(layer, (*BUCKETS, BUCKETS[-1] + 1))
    built.clear()
    calls()
    assert built == []
