"""The native decoder step (kernels.decoder_step, csrc/decoder_step.c): a decode or verification step through every
layer in one native call gives every row the bits the layer-by-layer forward gives it (logits and the keys/values it
writes), for one sequence and for a flat batch of many; it runs only where every piece is native, and steps it does
not take (prompt rows, other linear paths, the setting off, no compiler) run layer by layer."""

from __future__ import annotations

import logging

import pytest
import torch
from conftest import tiny_model

from leapdecode import kernels
from leapdecode.forward import ModelForward
from leapdecode.kernels import decoder_step, native, segment_attention
from leapdecode.kv.slots import FlatBatch, Segment, SequenceKV
from leapdecode.runner import Runner

NATIVE = dict(linear="native", attention="native", elementwise="native", argmax_head="off")


@pytest.fixture(autouse=True)
def private_cache(private_calibration):
    return private_calibration


@pytest.fixture
def steps(monkeypatch):
    """Whether each forward's native step ran (True) or handed the step to the layers (False)."""
    if decoder_step.library() is None:
        pytest.skip(f"native decoder step unavailable here: {decoder_step._library.why_not()}")
    ran, call = [], decoder_step.NativeStep.__call__

    def counted(self, *args):
        out = call(self, *args)
        ran.append(out is not None)
        return out

    monkeypatch.setattr(decoder_step.NativeStep, "__call__", counted)
    return ran


def decode(model, prompt, feeds, rollback_after=None):
    runner = Runner(model)
    logits = [runner.prefill(prompt)]
    for i, tokens in enumerate(feeds):
        logits.append(runner.forward(tokens))
        if i == rollback_after:
            runner.rollback(len(tokens) - 1)
    return logits, runner.kv_layers()


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_one_sequence_gets_the_bits_of_the_layer_by_layer_forward(arch, steps):
    model = tiny_model(arch, seed=31, vocab=97)
    gen = torch.Generator().manual_seed(8)
    prompt = torch.randint(0, 97, (13,), generator=gen).tolist()
    # past the buffers' first capacity: the step grows them (kv.slots.room_for)
    feeds = [torch.randint(0, 97, (n,), generator=gen).tolist() for n in (1, 5, 1, 3) + (1,) * 70]
    got = {}
    for step in ("layers", "native"):
        steps.clear()
        with kernels.configured(step=step, **NATIVE):
            got[step] = decode(model, prompt, feeds, rollback_after=1)
        assert steps == [step == "native"] * (1 + len(feeds))  # the prompt's rows too
    for a, b in zip(got["layers"][0], got["native"][0]):
        assert torch.equal(a, b)
    for a, b in zip(got["layers"][1], got["native"][1]):  # the keys/values it wrote, rollback included
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_a_flat_batch_of_sequences_gets_the_bits_of_the_layer_by_layer_forward(arch, steps):
    """The engine's case: sequences of different lengths, decoding and verifying in one step, each writing into its
    own buffers."""
    model = tiny_model(arch, seed=32, vocab=97)
    gen = torch.Generator().manual_seed(9)
    prompts = [torch.randint(0, 97, (n,), generator=gen).tolist() for n in (5, 17, 64)]
    news = [torch.randint(0, 97, (n,), generator=gen).tolist() for n in (1, 4, 3)]
    layers = model.config.num_hidden_layers
    got = {}
    for step in ("layers", "native"):
        with kernels.configured(step=step, **NATIVE):
            run = ModelForward(model)
            kvs = [SequenceKV(layers) for _ in prompts]
            for kv, prompt in zip(kvs, prompts):
                n = len(prompt)
                run(torch.tensor(prompt), torch.arange(n), FlatBatch([Segment(kv, 0, n, 0)]), torch.arange(n - 1, n))
            segments, ids, positions, first = [], [], [], 0
            for kv, prompt, new in zip(kvs, prompts, news):
                segments.append(Segment(kv, first, len(new), len(prompt)))
                ids += new
                positions += range(len(prompt), len(prompt) + len(new))
                first += len(new)
            steps.clear()
            logits, _ = run(torch.tensor(ids), torch.tensor(positions), FlatBatch(segments), torch.arange(first))
            assert steps == [step == "native"]
            got[step] = logits, [kv.layers() for kv in kvs]
    assert torch.equal(got["layers"][0], got["native"][0])
    for seq_a, seq_b in zip(got["layers"][1], got["native"][1]):
        for a, b in zip(seq_a, seq_b):
            assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


def test_steps_it_does_not_take_run_layer_by_layer(steps, monkeypatch):
    model = tiny_model("llama", seed=33, vocab=97)
    prompt = list(range(3, 12))
    with kernels.configured(**NATIVE):
        reference, _ = decode(model, prompt, [[5], [6, 7]])
    for settings in (dict(step="layers"), dict(linear="hf"), dict(attention="sdpa")):
        steps.clear()
        with kernels.configured(**{**NATIVE, **settings}):
            logits, _ = decode(model, prompt, [[5], [6, 7]])
        assert True not in steps, settings
        if "step" in settings:  # F.linear and SDPA round differently from the native kernels
            assert all(torch.equal(a, b) for a, b in zip(logits, reference)), settings
    monkeypatch.setattr(segment_attention, "MAX_ROWS", 8)
    steps.clear()
    with kernels.configured(**NATIVE):  # more new rows than the native attention takes: a long prompt run
        runner = Runner(model)
        runner.prefill(prompt)
        runner.forward(list(range(8)))
        assert steps == [False, True]


def test_without_a_compiler_steps_run_layer_by_layer_after_one_notice(monkeypatch, caplog):
    from leapdecode.kernels.ops import forget_checks

    model = tiny_model("qwen2", seed=34, vocab=97)
    with kernels.configured(**NATIVE):
        reference, _ = decode(model, list(range(3, 12)), [[5], [6, 7]])
    monkeypatch.setattr(native, "compiler", lambda: None)
    decoder_step.forget()
    forget_checks()
    try:
        with caplog.at_level(logging.WARNING, logger="leapdecode"):
            with kernels.configured(**NATIVE):
                logits, _ = decode(model, list(range(3, 12)), [[5], [6, 7]])
        assert decoder_step.library() is None and "layer by layer" in decoder_step.describe()
        notices = [r.getMessage() for r in caplog.records if "decoder step" in r.getMessage()]
        assert len(notices) == 1 and "\n" not in notices[0]
        for a, b in zip(logits, reference):  # the other kernels, loaded before, run layer by layer: the same bits
            assert torch.equal(a, b)
    finally:
        native.forget_all()


def test_the_native_step_follows_weights_changed_in_place_or_replaced(steps):
    """Its address tables are rebuilt when a weight changes in place or is replaced: the step then computes with the
    new weights, as the layer-by-layer forward does."""
    model = tiny_model("llama", seed=33, vocab=97)
    prompt = [5, 6, 7, 8]
    with kernels.configured(**NATIVE):
        before = Runner(model).prefill(prompt)
        runner = Runner(model)
        runner.prefill(prompt)
        one = runner.forward([9])
        with torch.no_grad():
            model.model.layers[1].mlp.down_proj.weight.mul_(3.0)  # in place: its version counter moves
        changed = Runner(model)
        changed.prefill(prompt)
        two = changed.forward([9])
        layer = model.model.layers[0].self_attn.o_proj
        new = torch.nn.Parameter(layer.weight.detach() * 0.5, requires_grad=False)
        with torch.no_grad():
            while new._version < layer.weight._version:  # the same version count: only its identity tells
                new.add_(0)
        layer.weight = new  # replaced
        replaced = Runner(model)
        replaced.prefill(prompt)
        three = replaced.forward([9])
    native_steps = list(steps)
    with kernels.configured(**NATIVE, step="layers"):
        layered = Runner(model)
        layered.prefill(prompt)
        reference = layered.forward([9])
    assert native_steps and all(native_steps)
    assert not torch.equal(one, two) and not torch.equal(two, three) and not torch.equal(before, three)
    assert torch.equal(three, reference)
