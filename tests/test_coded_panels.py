"""Coded panels (kernels.native_linear.CodedPanels, csrc/panel_linear.c's coded_panel_linear): a weight that is exactly
a quantized weight widened to fp32 (per group of 32 inputs d q + m with 4-bit codes, a GGUF Q4_1 weight as the packaged
models load, or d q with 8-bit codes, Q8_0's) is multiplied from its codes with the very bits of the fp32 panel
kernel, at every row count, with and without bias; a weight that does not come back bit for bit keeps fp32 panels;
and a model whose weights have those forms decodes the same logits and keys/values from them, layer by layer and
through the native step, prompt rows and verified rows alike. So "native-q" changes speed, never a bit of the
output."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model

from leapdecode import kernels
from leapdecode.kernels import decoder_step, packed
from leapdecode.kernels.native_linear import GROUP, CodedPanels, Panels, coded_form, q4_form, q8_form
from leapdecode.runner import Runner


@pytest.fixture(autouse=True)
def private_cache(private_calibration):
    return private_calibration


def widened_4bit(weight: torch.Tensor) -> torch.Tensor:
    """The weight rounded to Q4_1 (per group of 32 inputs: m the minimum and d = (max - m) / 15, both in fp16, codes
    0..15) and widened back to fp32, as the GGUF loader does."""
    out, inp = weight.shape
    groups = weight.reshape(out, inp // GROUP, GROUP)
    low = groups.amin(-1, keepdim=True).half().float()
    d = ((groups.amax(-1, keepdim=True) - low) / 15).half().float()
    q = torch.round((groups - low) / torch.where(d > 0, d, 1.0)).clamp(0, 15)
    return (d * q + low).reshape(out, inp)


def widened_8bit(weight: torch.Tensor) -> torch.Tensor:
    """The weight rounded to Q8_0 (per group of 32 inputs: d = max |w| / 127 in fp16, codes -127..127), widened back."""
    out, inp = weight.shape
    groups = weight.reshape(out, inp // GROUP, GROUP)
    d = (groups.abs().amax(-1, keepdim=True) / 127).half().float()
    codes = torch.round(groups / torch.where(d > 0, d, 1.0)).clamp(-128, 127) + 0.0  # integers: no -0
    return (d * codes).reshape(out, inp)


WIDEN = {4: widened_4bit, 8: widened_8bit}


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("out_features,in_features", [(5, 32), (33, 64), (250, 128), (512, 576)])
@pytest.mark.parametrize("bias", [False, True])
def test_exact_codes_give_the_fp32_panels_bits_at_every_row_count(
    native_linear_lib, bits, out_features, in_features, bias
):
    gen = torch.Generator().manual_seed(out_features)
    source = torch.randn(out_features, in_features, generator=gen)
    source[-1, :GROUP] *= 1e-5  # a group whose scale is a subnormal fp16 value (the kernel widens fp16 scales)
    weight = WIDEN[bits](source)
    b = torch.randn(out_features, generator=gen) if bias else None
    coded = coded_form(weight)
    assert coded is not None and coded.bits == bits
    fp32 = Panels(weight)
    for rows in (1, 2, 3, 5, 8, 11, 12, 13, 16, 24, 25, 40):  # one tile, several, and a part tile after full ones
        x = torch.randn(rows, in_features, generator=gen)
        got, want = coded(x, b), fp32(x, b)
        assert torch.equal(got.view(torch.int32), want.view(torch.int32)), rows


def test_only_weights_that_come_back_bit_for_bit_have_codes(native_linear_lib):
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
    off_minimum = exact.clone()  # one group's codes with an m that is no fp16 value: the kernel keeps m in fp16
    m_off = m[9, 0] + 2**-20
    off_minimum[9, :GROUP] = d[9, 0] * codes[9, :GROUP].float() + m_off
    assert off_minimum[9, :GROUP].amin() == m_off and m_off.half().float() != m_off
    assert q4_form(off_minimum) is None
    assert q4_form(exact.double()) is None
    eight = widened_8bit(torch.randn(64, 96, generator=gen))
    codes, d = q8_form(eight)
    assert torch.equal(d.repeat_interleave(GROUP, 1) * codes.float(), eight)
    eight[3, 3] = torch.nextafter(eight[3, 3], torch.tensor(1.0))
    assert q8_form(eight) is None and coded_form(eight) is None
    eight = widened_8bit(torch.randn(64, 96, generator=gen))
    eight[7, 40] = -0.0  # a code's product is never -0: no form
    assert q8_form(eight) is None


def coded_model(arch: str, seed: int) -> torch.nn.Module:
    """A tiny model whose attention weights are Q8_0 and MLP and output head weights Q4_1, widened to fp32."""
    model = tiny_model(arch, seed=seed, vocab=97)
    with torch.no_grad():
        for name, module in model.named_modules():
            if type(module) is torch.nn.Linear:
                module.weight.copy_(WIDEN[8 if "self_attn" in name else 4](module.weight))
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
def test_a_model_with_exact_codes_decodes_the_same_bits_from_them(native_linear_lib, arch, step, monkeypatch):
    if step == "native" and decoder_step.library() is None:
        pytest.skip("native decoder step unavailable here")
    used = []
    call = CodedPanels.__call__
    monkeypatch.setattr(CodedPanels, "__call__", lambda self, *a: used.append(self.bits) or call(self, *a))
    model = coded_model(arch, seed=41)
    gen = torch.Generator().manual_seed(5)
    prompt = torch.randint(0, 97, (13,), generator=gen).tolist()
    feeds = [torch.randint(0, 97, (n,), generator=gen).tolist() for n in (1, 5, 1, 3, 1, 1)]
    got = {}
    for weights, linear in (("fp32", "native"), ("codes", "native-q")):
        with kernels.configured(
            linear=linear,
            attention="native",
            elementwise="native",
            step=step,
            argmax_head="off",
            native_weights=weights,
        ):
            got[weights] = decode(model, prompt, feeds)
            states = [packed._route(m, 1, True, False)[1] for m in packed.installed(model)]
            assert all(type(s) is (CodedPanels if weights == "codes" else Panels) for s in states)
    assert {4, 8} <= set(used) if step == "layers" else set(used) == {4}  # the native step's products run in C
    for a, b in zip(got["fp32"][0], got["codes"][0]):
        assert torch.equal(a, b)
    for a, b in zip(got["fp32"][1], got["codes"][1]):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
