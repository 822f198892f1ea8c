"""The native kernels of a decode step. The linear path (kernels.native_linear, csrc/panel_linear.c): F.linear's
products within fp32 rounding for any shape, bias and input strides; a row's bits independent of the other rows in
the call and of the thread count; with it (and the native attention), a verification forward of k rows returns bit
for bit the logits of k one-row steps. The decoder operations (kernels.decoder_ops): HF's RMSNorm, rotary embedding
and SiLU within rounding, rows alone. Where they cannot be built, torch's kernels run after a one-line notice."""

from __future__ import annotations

import logging

import pytest
import torch
from conftest import tiny_model

from leapdecode import kernels
from leapdecode.kernels import decoder_ops, native, native_linear
from leapdecode.kernels.native_linear import Panels
from leapdecode.runner import Runner


@pytest.fixture(autouse=True)
def private_cache(private_calibration):
    return private_calibration


@pytest.mark.parametrize("out_features,in_features", [(5, 3), (33, 64), (96, 40), (250, 129), (512, 576)])
@pytest.mark.parametrize("bias", [False, True])
def test_products_equal_f_linear_within_rounding(native_linear_lib, out_features, in_features, bias):
    gen = torch.Generator().manual_seed(out_features * 7 + in_features)
    weight = torch.randn(out_features, in_features, generator=gen)
    b = torch.randn(out_features, generator=gen) if bias else None
    panels = Panels(weight)
    for rows in (1, 2, 5, 12, 13, 31, 70):
        x = torch.randn(rows, in_features, generator=gen)
        got = panels(x, b)
        assert got.shape == (rows, out_features)
        torch.testing.assert_close(got, torch.nn.functional.linear(x, weight, b), rtol=1e-5, atol=1e-4)


def test_inputs_of_any_row_stride_and_non_contiguous_rows(native_linear_lib):
    gen = torch.Generator().manual_seed(3)
    weight = torch.randn(40, 24, generator=gen)
    panels = Panels(weight)
    wide = torch.randn(9, 50, generator=gen)
    for x in (wide[:, 3:27], torch.randn(24, 9, generator=gen).t(), wide[::2, :24]):
        torch.testing.assert_close(panels(x, None), x @ weight.t(), rtol=1e-5, atol=1e-4)


def test_a_row_gets_the_same_bits_alone_beside_other_rows_and_on_any_thread_count(native_linear_lib):
    gen = torch.Generator().manual_seed(5)
    weight, bias = torch.randn(300, 96, generator=gen), torch.randn(300, generator=gen)
    x = torch.randn(37, 96, generator=gen)
    panels = Panels(weight)
    together = panels(x, bias)
    for size in (1, 3, 12, 13):
        parts = torch.cat([panels(x[i : i + size], bias) for i in range(0, 37, size)])
        assert torch.equal(parts, together), size
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(panels(x, bias), together)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_a_verification_returns_the_logits_of_one_row_steps_bit_for_bit(native_linear_lib, arch):
    """With the native linear and attention kernels every row is computed from its own inputs alone, in a fixed
    order: the rows of a verification equal the one-row steps that would have produced them, so greedy speculative
    decoding is plain greedy decoding even at fp32 near-ties."""
    model = tiny_model(arch, seed=21, vocab=97)
    prompt = torch.randint(0, 97, (11,), generator=torch.Generator().manual_seed(4)).tolist()
    with kernels.configured(linear="native", attention="native", argmax_head="off"):
        runner = Runner(model)
        runner.prefill(prompt)
        tokens = torch.randint(0, 97, (6,), generator=torch.Generator().manual_seed(6)).tolist()
        steps = torch.stack([runner.forward([t])[0] for t in tokens])
        runner.rollback(len(tokens))
        verified = runner.forward(tokens)
    assert torch.equal(verified, steps)


def test_where_the_kernel_cannot_be_built_the_path_is_not_offered(monkeypatch, caplog):
    from leapdecode.kernels.ops import forget_checks

    monkeypatch.setattr(native, "compiler", lambda: None)
    native_linear.forget()
    forget_checks()  # notices are once per process
    try:
        model = tiny_model("llama", seed=22, vocab=97)
        ids = torch.randint(0, 97, (9,), generator=torch.Generator().manual_seed(1)).tolist()
        with caplog.at_level(logging.WARNING, logger="leapdecode"):
            with kernels.configured(linear="native"):  # forced: F.linear wherever it is not available
                runner = Runner(model)
                runner.prefill(ids[:4])
                forced = runner.forward(ids[4:])
            with kernels.configured(linear="auto"):
                Runner(model).prefill(ids)
                paths = {p for row in kernels.kernel_table(model) for _, _, p in row["linear"]}
        with kernels.configured(linear="hf"):
            runner = Runner(model)
            runner.prefill(ids[:4])
            assert torch.equal(forced, runner.forward(ids[4:]))
        assert "native" not in paths
        assert "no C compiler" in native_linear.why_not()
        notices = [r.getMessage() for r in caplog.records if "native linear" in r.getMessage()]
        assert len(notices) == 1 and "\n" not in notices[0]
    finally:
        native.forget_all()


@pytest.fixture
def ops_lib():
    if decoder_ops.library() is None:
        pytest.skip("native decoder operations unavailable here")
    return decoder_ops.library()


def test_decoder_operations_compute_hf_s_within_rounding_and_rows_alone(ops_lib):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm, apply_rotary_pos_emb

    gen = torch.Generator().manual_seed(9)
    rows, width, heads, kv_heads, d = 7, 96, 4, 2, 24
    norm = LlamaRMSNorm(width, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(width, generator=gen))
    x, delta = torch.randn(1, rows, width, generator=gen), torch.randn(1, rows, width, generator=gen)
    total, normed = decoder_ops.add_rms_norm(ops_lib, x, delta, norm)
    assert torch.equal(total, x + delta)
    torch.testing.assert_close(normed, norm(x + delta).detach(), rtol=1e-5, atol=1e-5)
    assert torch.equal(
        decoder_ops.add_rms_norm(ops_lib, x, None, norm)[1][0, 3],
        decoder_ops.add_rms_norm(ops_lib, x[:, 3:4].contiguous(), None, norm)[1][0, 0],
    )

    qkv = torch.randn(1, rows, (heads + 2 * kv_heads) * d, generator=gen)
    cos, sin = torch.randn(1, rows, d, generator=gen), torch.randn(1, rows, d, generator=gen)
    shape = (1, rows, -1, d)
    q, k, v = qkv.split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
    want_q, want_k = apply_rotary_pos_emb(q.view(shape).transpose(1, 2), k.view(shape).transpose(1, 2), cos, sin)
    rotated = qkv.clone()
    decoder_ops.rotary(ops_lib, rotated, heads, kv_heads, d, cos, sin)
    got_q, got_k, got_v = rotated.split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
    torch.testing.assert_close(got_q.view(shape).transpose(1, 2), want_q, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got_k.view(shape).transpose(1, 2), want_k, rtol=1e-6, atol=1e-6)
    assert torch.equal(got_v, v)  # values are not rotated

    gate_up = torch.randn(1, rows, 2 * 37, generator=gen) * 30  # large gates of both signs: no overflow
    gate, up = gate_up.chunk(2, dim=-1)
    got = decoder_ops.silu_mul(ops_lib, gate_up)
    torch.testing.assert_close(got, torch.nn.functional.silu(gate) * up, rtol=1e-5, atol=1e-5)
    assert torch.equal(got[0, 2], decoder_ops.silu_mul(ops_lib, gate_up[:, 2:3].contiguous())[0, 0])


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_the_fused_decoder_with_native_operations_matches_torch_s(arch, ops_lib):
    from leapdecode.kernels.fused_decoder import fused_decoder

    model = tiny_model(arch, seed=23, vocab=97)
    ids = torch.randint(0, 97, (10,), generator=torch.Generator().manual_seed(2)).tolist()
    outputs = {}
    for elementwise in ("native", "torch"):
        with kernels.configured(elementwise=elementwise, linear="hf"):
            runner = Runner(model)
            runner.prefill(ids[:6])
            outputs[elementwise] = runner.forward(ids[6:])
    assert fused_decoder(model).native_elementwise
    torch.testing.assert_close(outputs["native"], outputs["torch"], rtol=1e-4, atol=1e-4)
    assert not torch.equal(outputs["native"], outputs["torch"])  # the native operations really ran


def test_the_setting_and_a_missing_compiler_keep_torch_s_operations(monkeypatch, caplog):
    from leapdecode.kernels.ops import forget_checks

    with kernels.configured(elementwise="torch"):
        assert decoder_ops.library() is None
    with pytest.raises(ValueError, match="elementwise must be one of"):
        kernels.configure(elementwise="fast")
    monkeypatch.setattr(native, "compiler", lambda: None)
    decoder_ops.forget()
    forget_checks()
    try:
        with caplog.at_level(logging.WARNING, logger="leapdecode"):
            assert decoder_ops.library() is None and decoder_ops.library() is None
        notices = [r.getMessage() for r in caplog.records if "decoder operations" in r.getMessage()]
        assert len(notices) == 1 and "\n" not in notices[0]
    finally:
        native.forget_all()


def test_the_argmax_heads_native_exact_step_gives_the_panel_kernels_bits_on_every_candidate(native_linear_lib):
    """csrc/argmax_head.c: every token the bound cannot rule out gets the native fp32 head's exact logit, bit for bit
    (so its argmax is that head's, near-ties included); every other token stays below the largest; the torch version
    of the same step finds the same argmax. Features as peaked as a real model's and as flat as noise."""
    from leapdecode.kernels import argmax_head

    if argmax_head._library.get() is None:
        pytest.skip("the argmax head's native step is unavailable here")
    gen = torch.Generator().manual_seed(9)
    weight = torch.randn(3000, 64, generator=gen) * 0.3
    weight[7] = weight[5]  # an exact tie: broken at the first index
    head, panels = argmax_head.ArgmaxOutputHead(weight, packed=False), Panels(weight)
    x = torch.cat([torch.randn(6, 64, generator=gen), weight[[5, 11, 40]] * 20])  # flat rows, then peaked ones
    got, exact = head(x), panels(x, None)
    candidates = got == exact
    assert bool(candidates.all(dim=-1).logical_not().all())  # the bound rules most tokens out ...
    low = head.bf16_logits(x).float()  # the bound's floor, as argmax_head.py states it
    top = low.amax(-1, keepdim=True)
    reach = top - 2 * head.slack * x.norm(dim=-1, keepdim=True) - argmax_head.BF16_ROUNDING * top.abs()
    floor = torch.where(reach >= 0, reach / (1 + argmax_head.BF16_ROUNDING), reach / (1 - argmax_head.BF16_ROUNDING))
    # every token it could not rule out; the kernel sums |h| in its own order, so a token within a few ulps of the
    # floor may fall either side (both sound: the bound's margins are far wider)
    near = (low - floor).abs() <= 1e-5 * top.abs()
    assert torch.equal(candidates | (low < floor) | near, torch.ones_like(candidates))
    assert bool((candidates.sum(-1) >= 1).all())
    assert torch.equal(got.argmax(-1), exact.argmax(-1)) and int(got[6].argmax()) == 5
    top = got.gather(1, got.argmax(-1, keepdim=True))
    assert bool((got[~candidates] < top.expand_as(got)[~candidates]).all())  # ... and they stay below the largest
    saved = argmax_head._library.get
    try:
        argmax_head._library.get = lambda: None  # the torch version of the step
        assert torch.equal(head(x).argmax(-1), got.argmax(-1))
    finally:
        argmax_head._library.get = saved
