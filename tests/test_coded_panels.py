"""Coded panels (kernels.native_linear.CodedPanels, csrc/panel_linear.c's coded_panel_linear): a weight that is exactly
a quantized weight widened to fp32 (per group of 32 inputs d q + m with 4-bit codes, a GGUF Q4_1 weight as the packaged
models load, or d q with 8-bit codes, Q8_0's and Q5_0's; per 16 inputs d q with fp32 d, Q6_K's) is multiplied from
its codes with the very bits of the fp32 panel kernel, at every row count, with and without bias; a weight that
does not come back bit for bit keeps fp32 panels; and a model whose weights have those forms decodes the same logits
and keys/values from them, layer by layer and through the native step, prompt rows and verified rows alike. So "native-q" changes speed, never a bit of the
output."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model

from leapdecode import kernels
from leapdecode.kernels import decoder_step, packed
from leapdecode.kernels.native_linear import (
    GROUP,
    Q4K,
    Q6_GROUP,
    Q6M,
    CodedPanels,
    Panels,
    coded_form,
    q4_form,
    q4k_form,
    q6_form,
    q6m_form,
    q8_form,
)
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


def widened_5bit(weight: torch.Tensor) -> torch.Tensor:
    """The weight rounded to Q5_0 (per group of 32 inputs: d = the extreme value / -16 in fp16, so d < 0 where the
    extreme is positive, codes -16..15) and widened back: a zero code times a negative d is -0."""
    out, inp = weight.shape
    groups = weight.reshape(out, inp // GROUP, GROUP)
    extreme = groups.gather(-1, groups.abs().argmax(-1, keepdim=True))
    d = (extreme / -16).half().float()
    return (d * torch.round(groups / torch.where(d != 0, d, 1.0)).clamp(-16, 15)).reshape(out, inp)


def widened_6bit(weight: torch.Tensor) -> torch.Tensor:
    """The weight rounded to the form of Q6_K and widened back: per 16 inputs d = D s, D an fp16 value per row, s an
    8-bit sub-scale (so d is exact in fp32 and most often no fp16 value), codes -32..31."""
    out, inp = weight.shape
    groups = weight.reshape(out, inp // Q6_GROUP, Q6_GROUP)
    row = (weight.abs().amax(-1) / 32 / 127).half().float()[:, None, None]
    s = torch.round(groups.abs().amax(-1, keepdim=True) / 32 / row).clamp(1, 127)
    d = row * s
    return (d * (torch.round(groups / d).clamp(-32, 31) + 0.0)).reshape(out, inp)


def widened_4bit_k(weight: torch.Tensor, low_shift: int = 0) -> torch.Tensor:
    """The weight rounded to the form of Q4_K and widened back: per 32 inputs d = D s and m = -M t, D and M fp16 values
    per row (GGUF's per 256 inputs), s and t 6-bit sub-scales (so d and m are exact in fp32 and most often no fp16
    value), codes 0..15. m is not the group's minimum: t is rounded (and raised by `low_shift`), so a group's smallest
    code need not be 0."""
    out, inp = weight.shape
    groups = weight.reshape(out, inp // GROUP, GROUP)
    low = groups.amin(-1, keepdim=True).clamp(max=0)
    scale = (groups.amax(-1, keepdim=True) - low) / 15
    big_d = (scale.amax(1, keepdim=True) / 63).half().float()
    big_m = ((-low).amax(1, keepdim=True) / 63).half().float()
    d = big_d * torch.round(scale / torch.where(big_d > 0, big_d, 1.0)).clamp(1, 63)
    m = -big_m * (torch.round(-low / torch.where(big_m > 0, big_m, 1.0)) + low_shift).clamp(0, 63)
    return (d * torch.round((groups - m) / d).clamp(0, 15) + m).reshape(out, inp)


def widened_4bit_k_over_6bit(weight: torch.Tensor) -> torch.Tensor:
    """The first half of the rows in Q4_K's form, the rest in Q6_K's (a fused q/k/v of Qwen2.5-Coder-1.5B's kind)."""
    half = (weight.shape[0] + 1) // 2
    return torch.cat([widened_4bit_k(weight[:half]), widened_6bit(weight[half:])])


WIDEN = {4: widened_4bit, 8: widened_8bit, 5: widened_5bit, 6: widened_6bit, Q4K: widened_4bit_k}
WIDEN[Q6M] = widened_4bit_k_over_6bit
STORED = {4: 4, 8: 8, 5: 8, 6: 6, Q4K: Q4K, Q6M: Q6M}  # Q5_0's codes fit 8-bit ones


@pytest.mark.parametrize("bits", [4, 8, 5, 6, Q4K, Q6M])
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
    assert coded is not None and coded.bits == STORED[bits]
    fp32 = Panels(weight)
    for rows in (1, 2, 3, 5, 8, 11, 12, 13, 16, 24, 25, 40, 60):  # one tile, several, a part tile, panels rebuilt
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
    eight[7, 40] = -0.0  # comes back as +0, which leaves every sum's bits as they are
    assert q8_form(eight) is not None
    x = torch.randn(3, 96, generator=gen)
    assert torch.equal(coded_form(eight)(x, None).view(torch.int32), Panels(eight)(x, None).view(torch.int32))
    six = widened_6bit(torch.randn(64, 96, generator=gen))
    codes, d = q6_form(six)
    assert torch.equal(d.repeat_interleave(Q6_GROUP, 1) * codes.float(), six)
    assert not torch.equal(d.half().float(), d)  # scales no fp16 value holds: the 8-bit form cannot take them
    assert q8_form(six) is None
    six[1, 1] = torch.nextafter(six[1, 1], torch.tensor(1.0))
    assert q6_form(six) is None
    k_form = widened_4bit_k(torch.randn(64, 96, generator=gen), low_shift=8)
    codes, d, m = q4k_form(k_form)
    assert torch.equal(d.repeat_interleave(GROUP, 1) * codes.float() + m.repeat_interleave(GROUP, 1), k_form)
    assert (codes.reshape(64, -1, GROUP).amin(-1) > 0).float().mean() > 0.1  # groups whose smallest code is not 0
    assert q4_form(k_form) is None  # no fp16 d and m
    assert coded_form(exact).bits == 4  # a Q4_1 weight has that form too: the fp16 form, the smaller, is chosen
    k_form[60, 95] = torch.nextafter(k_form[60, 95], torch.tensor(-1.0))
    assert q4k_form(k_form) is None and q4k_form(eight) is None and q4k_form(six) is None
    mixed = widened_4bit_k_over_6bit(torch.randn(64, 96, generator=gen))
    codes, d, m = q6m_form(mixed)
    assert torch.equal(d.repeat_interleave(Q6_GROUP, 1) * codes.float() + m.repeat_interleave(Q6_GROUP, 1), mixed)
    assert q4k_form(mixed) is None and q6_form(mixed) is None
    mixed[50, 3] = torch.nextafter(mixed[50, 3], torch.tensor(1.0))
    assert q6m_form(mixed) is None


def coded_model(arch: str, seed: int) -> torch.nn.Module:
    """A tiny model whose q/k weights are Q4_K and v weights Q6_K's form (fused: Q6M), output projections Q5_0, down
    projections Q6_K's form, up projections Q4_K's (fused with the Q4_1 gates: the fused weight has Q4_K's form) and
    the output head Q4_1, widened to fp32 (a GGUF file mixes such types)."""
    model = tiny_model(arch, seed=seed, vocab=97)
    kinds = {"o_proj": 5, "down_proj": 6, "q_proj": Q4K, "k_proj": Q4K, "v_proj": 6, "up_proj": Q4K}
    with torch.no_grad():
        for name, module in model.named_modules():
            if type(module) is torch.nn.Linear:
                module.weight.copy_(WIDEN[kinds.get(name.rsplit(".", 1)[-1], 4)](module.weight))
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
    assert {4, 6, 8, Q4K, Q6M} <= set(used) if step == "layers" else set(used) == {4}  # the native step's run in C
    for a, b in zip(got["fp32"][0], got["codes"][0]):
        assert torch.equal(a, b)
    for a, b in zip(got["fp32"][1], got["codes"][1]):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


@pytest.mark.slow
def test_the_packaged_qwen_runs_from_its_codes_and_decodes_hf_greedy(native_linear_lib):
    """Qwen2.5-Coder-0.5B (pulled from PyPI on first use) is a GGUF of Q5_0 layers with Q6_K down projections and a
    Q8_0 embedding: every layer has codes, and greedy decoding from them (alone and verifying prompt-lookup drafts)
    gives HF greedy's tokens."""
    from hf_reference import hf_greedy_with

    from leapdecode import generate
    from leapdecode.models.resolve import resolve_model
    from leapdecode.prompt import encode_prompt

    target = resolve_model("qwen2.5-coder-0.5b")
    layer = target.model.model.layers[0]
    parts = {**dict(layer.self_attn.named_children()), **dict(layer.mlp.named_children())}
    bits = {name: getattr(coded_form(m.weight), "bits", None) for name, m in parts.items() if hasattr(m, "weight")}
    assert bits == {"q_proj": 8, "k_proj": 8, "v_proj": 8, "o_proj": 8, "gate_proj": 8, "up_proj": 8, "down_proj": 6}
    messages = [{"role": "user", "content": "Write a Python function that reverses a string, then explain it."}]
    want = hf_greedy_with(target, encode_prompt(target.tokenizer, messages), 24)
    for drafter in ("none", "prompt-lookup"):
        got = generate(target, messages, drafter=drafter, max_new_tokens=24, prefix_cache=False).token_ids
        assert got == want, drafter


@pytest.mark.slow
def test_the_packaged_qwen_1_5b_layers_have_exact_codes(native_linear_lib):
    """Qwen2.5-Coder-1.5B (pulled from PyPI on first use; only its first layer is read) mixes Q4_K layers with Q6_K
    value and down projections: each has codes, so does their fused q/k/v (Q6M), and products from them keep the fp32
    panels' bits."""
    from safetensors import safe_open

    from leapdecode.models.loader import pull_model

    directory = pull_model("qwen2.5-coder-1.5b", progress=False)
    with safe_open(str(directory / "model.safetensors"), "pt") as weights:
        layer = {
            name.split(".")[-2]: weights.get_tensor(name)
            for name in weights.keys()
            if name.startswith("model.layers.0.") and name.endswith("proj.weight")
        }
    coded = {name: coded_form(w) for name, w in layer.items()}
    assert {name: getattr(c, "bits", None) for name, c in coded.items()} == {
        **dict.fromkeys(("q_proj", "k_proj", "o_proj", "gate_proj", "up_proj"), Q4K),
        **dict.fromkeys(("v_proj", "down_proj"), 6),
    }
    layer["qkv"] = torch.cat([layer["q_proj"], layer["k_proj"], layer["v_proj"]])  # as the fused decoder joins them
    coded["qkv"] = coded_form(layer["qkv"])
    assert coded["qkv"].bits == Q6M
    x = torch.randn(3, layer["o_proj"].shape[1], generator=torch.Generator().manual_seed(0))
    for name in ("o_proj", "k_proj", "qkv"):
        assert torch.equal(coded[name](x, None).view(torch.int32), Panels(layer[name])(x, None).view(torch.int32))
