"""Exact 4-bit panels (kernels.native_linear.Q4Panels, csrc/panel_linear.c's q4_panel_linear): a weight that is
exactly a 4-bit weight widened to fp32 (d q + m per group of 32 inputs, a GGUF Q4_1 weight as the packaged models load)
is multiplied from its codes with the very bits of the fp32 panel kernel, at every row count, with and without bias;
a weight that does not come back bit for bit keeps fp32 panels; and a model whose weights have that form decodes the
same logits and keys/values from them, layer by layer and through the native step, with prompt rows and verified rows
alike. So "native-q4" changes speed, never a bit of the output."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model

from leapdecode import kernels
from leapdecode.kernels import decoder_step, native_linear, packed
from leapdecode.kernels.native_linear import GROUP, Panels, Q4Panels, q4_form
from leapdecode.runner import Runner


@pytest.fixture
def lib():
    if native_linear.library() is None:
        pytest.skip(f"native linear kernel unavailable here: {native_linear.why_not()}")
    return native_linear.library()


@pytest.fixture(autouse=True)
def private_cache(private_calibration):
    return private_calibration


def widened_4bit(weight: torch.Tensor) -> torch.Tensor:
    """The weight rounded to Q4_1 (per group of 32 inputs: m the minimum, d = (max - m) / 15 in fp16, codes 0..15)
    and widened back to fp32, as the GGUF loader does."""
    out, inp = weight.shape
    groups = weight.reshape(out, inp // GROUP, GROUP)
    low = groups.amin(-1, keepdim=True)
    d = ((groups.amax(-1, keepdim=True) - low) / 15).half().float()
    q = torch.round((groups - low) / torch.where(d > 0, d, 1.0)).clamp(0, 15)
    return (d * q + low).reshape(out, inp)


@pytest.mark.parametrize("out_features,in_features", [(5, 32), (33, 64), (250, 128), (512, 576)])
@pytest.mark.parametrize("bias", [False, True])
def test_exact_4bit_weights_give_the_fp32_panels_bits_at_every_row_count(lib, out_features, in_features, bias):
    gen = torch.Generator().manual_seed(out_features)
    weight = widened_4bit(torch.randn(out_features, in_features, generator=gen))
    b = torch.randn(out_features, generator=gen) if bias else None
    form = q4_form(weight)
    assert form is not None
    fp32, q4 = Panels(weight), Q4Panels(*form)
    for rows in (1, 2, 3, 5, 8, 11, 12, 13, 16, 24, 25, 40):  # one tile, several, and a part tile after full ones
        x = torch.randn(rows, in_features, generator=gen)
        got, want = q4(x, b), fp32(x, b)
        assert torch.equal(got.view(torch.int32), want.view(torch.int32)), rows


def test_only_weights_that_come_back_bit_for_bit_have_a_4bit_form(lib):
    gen = torch.Generator().manual_seed(3)
    exact = widened_4bit(torch.randn(64, 96, generator=gen))
    exact[5, 32:64] = 0.25  # a constant group: d = 0
    codes, d, m = q4_form(exact)
    assert torch.equal((d.repeat_interleave(GROUP, 1) * codes.float() + m.repeat_interleave(GROUP, 1)), exact)
    nudged = exact.clone()
    nudged[40, 70] = torch.nextafter(nudged[40, 70], torch.tensor(1.0))  # one value one ulp off
    assert q4_form(nudged) is None
    assert q4_form(torch.randn(64, 96, generator=gen)) is None
    assert q4_form(exact[:, :80].contiguous()) is None  # inputs not in whole groups
    assert q4_form(exact.double()) is None


def exact_4bit_model(arch: str, seed: int) -> torch.nn.Module:
    model = tiny_model(arch, seed=seed, vocab=97)
    with torch.no_grad():
        for layer in model.model.layers:
            for module in layer.modules():
                if type(module) is torch.nn.Linear:
                    module.weight.copy_(widened_4bit(module.weight))
    return model


def decode(model, prompt, feeds):
    runner = Runner(model)
    logits = [runner.prefill(prompt)]
    for i, tokens in enumerate(feeds):
        logits.append(runner.forward(tokens))
        if i == 1:
            runner.rollback(len(tokens) - 1)
    return logits, runner.kv_layers()


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("step", ["layers", "native"])
def test_a_model_with_exact_4bit_weights_decodes_the_same_bits_from_them(lib, arch, step, monkeypatch):
    if step == "native" and decoder_step.library() is None:
        pytest.skip("native decoder step unavailable here")
    used = []
    call = Q4Panels.__call__
    monkeypatch.setattr(Q4Panels, "__call__", lambda self, *a: used.append(1) or call(self, *a))
    model = exact_4bit_model(arch, seed=41)
    gen = torch.Generator().manual_seed(5)
    prompt = torch.randint(0, 97, (13,), generator=gen).tolist()
    feeds = [torch.randint(0, 97, (n,), generator=gen).tolist() for n in (1, 5, 1, 3, 1, 1)]
    got = {}
    for weights, linear in (("fp32", "native"), ("q4", "native-q4")):
        with kernels.configured(
            linear=linear,
            attention="native",
            elementwise="native",
            step=step,
            argmax_head="off",
            native_weights=weights,
        ):
            got[weights] = decode(model, prompt, feeds)
            states = [packed._route(m, 1, True, False)[1] for m in packed.installed(model)[:-1]]  # the head: not q4
            assert all(type(s) is (Q4Panels if weights == "q4" else Panels) for s in states)
    if step == "layers":
        assert used  # the layer-by-layer forward multiplied from the codes
    for a, b in zip(got["fp32"][0], got["q4"][0]):
        assert torch.equal(a, b)
    for a, b in zip(got["fp32"][1], got["q4"][1]):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
