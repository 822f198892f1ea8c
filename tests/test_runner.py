"""The Runner's pre-packed linear path: active only inside its own forwards, numerically F.linear up to rounding."""

import pytest
import torch
from conftest import tiny_model

from leapdecode.runner import Runner


@pytest.mark.parametrize("kernels", ["packed", "packed-pad", "auto"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_linear_only_inside_runner_and_matches_linear(dtype, kernels):
    model = tiny_model("llama", seed=3, vocab=97).to(dtype)
    ids = torch.randint(0, 97, (1, 9))
    with torch.inference_mode():
        reference = model(ids).logits[0].float()  # a plain call: HF's F.linear everywhere
    runner = Runner(model, packed_weights=kernels)
    with torch.inference_mode():
        linear = next(m for m in model.modules() if type(m) is torch.nn.Linear)
        x = torch.randn(5, linear.in_features, dtype=dtype)
        assert torch.equal(linear(x), torch.nn.functional.linear(x, linear.weight, linear.bias))  # outside: HF's
    tol = 1e-4 if dtype == torch.float32 else 0.05
    runner.prefill(ids[0, :4].tolist())
    logits = runner.forward(ids[0, 4:].tolist())  # 5 rows through the packed weights
    assert torch.allclose(logits.float(), reference[4:], atol=tol, rtol=tol)
    runner.rollback(5)
    one = [runner.forward([t])[0] for t in ids[0, 4:].tolist()]  # one row at a time (padded to 4 with packed-pad)
    assert torch.allclose(torch.stack(one).float(), reference[4:], atol=tol, rtol=tol)
    runner.rollback(5)
    few = torch.cat([runner.forward(ids[0, 4:6].tolist()), runner.forward(ids[0, 6:].tolist())])  # 2 + 3 rows
    assert torch.allclose(few.float(), reference[4:], atol=tol, rtol=tol)


def test_packed_weights_follow_weight_changes_and_can_be_turned_off():
    model = tiny_model("llama", seed=4, vocab=97)
    ids = torch.randint(0, 97, (12,)).tolist()
    before = Runner(model, packed_weights="packed").prefill(ids)
    with torch.no_grad():
        model.lm_head.weight.mul_(2.0)  # in place: the packed copy must be rebuilt
    after = Runner(model, packed_weights="packed").prefill(ids)
    assert not torch.allclose(before, after)
    with torch.inference_mode():
        plain = model(torch.tensor([ids]), logits_to_keep=1).logits[0, -1]
    assert torch.allclose(after, plain, atol=1e-4, rtol=1e-4)
    assert torch.equal(Runner(model, packed_weights=False).prefill(ids), plain)


def test_buffered_cache_layer_behaves_like_hf_dynamic_layer():
    """Same keys/values as DynamicLayer through growth past its spare room, rollbacks, and a press replacing them."""
    from transformers.cache_utils import DynamicLayer

    from leapdecode.kv.buffered import SPARE, BufferedLayer

    torch.manual_seed(0)
    buffered, plain = BufferedLayer(), DynamicLayer()
    for step in range(40):
        n = int(torch.randint(1, 40, ()))
        k, v = torch.randn(1, 2, n, 8), torch.randn(1, 2, n, 8)
        got, want = buffered.update(k, v), plain.update(k, v)
        assert all(torch.equal(a, b) for a, b in zip(got, want))
        if step % 3 == 0:
            drop = -int(torch.randint(0, n + 1, ()))
            buffered.crop(drop)
            plain.crop(drop)
        if step == 20:  # what a KV press does: hand over pruned tensors
            keep = torch.arange(0, plain.get_seq_length(), 2)
            for layer in (buffered, plain):
                layer.keys, layer.values = layer.keys[:, :, keep].contiguous(), layer.values[:, :, keep].contiguous()
        assert buffered.get_seq_length() == plain.get_seq_length()
    assert buffered.key_buffer.shape[-2] > SPARE  # it grew past its first allocation


def test_runner_attention_switch_does_not_leak():
    """leapdecode's attention is switched on only inside Runner forwards: the model and the environment are left as
    they were, and HF's own forward gives the same logits afterwards."""
    import os

    model = tiny_model("llama", seed=5, vocab=97)
    before, environ = model.config._attn_implementation, dict(os.environ)
    ids = torch.tensor([[1, 2, 3, 4, 5, 6]])
    with torch.no_grad():
        reference = model(ids).logits[0]
    runner = Runner(model, packed_weights=False)
    prefill = runner.prefill([1, 2, 3])
    step = runner.forward([4, 5, 6])
    assert model.config._attn_implementation == before and dict(os.environ) == environ
    assert torch.allclose(torch.cat([prefill[None], step]), reference[2:], atol=1e-5)


@pytest.mark.parametrize("packed", [True, False])
def test_argmax_output_head_keeps_the_fp32_argmax_under_near_ties(packed):
    """Two output rows with logits 1 and 1.002 whose weights are large and differ orthogonally to the input: bf16
    rounding of the dot products (~0.05) misorders them about half the time; the fp32 argmax must still come out.
    Forced on for both bf16 variants on every host (slower where the CPU lacks fast bf16, still exact)."""
    from leapdecode import kernels
    from leapdecode.kernels import ArgmaxOutputHead

    if packed and not kernels.packed_ops(torch.bfloat16):
        pytest.skip("no packed oneDNN bf16 kernels in this torch build")
    torch.manual_seed(1)
    wrong_in_bf16 = 0
    for _ in range(60):
        x = torch.randn(1, 64) * 3
        big = torch.randn(2, 64) * 3
        big -= (big @ x.T) / (x @ x.T) * x  # orthogonal to x: logit 0
        pair = big + torch.tensor([[1.0], [1.002]]) * x / (x @ x.T)  # logits 1 and 1.002
        weight = torch.cat([0.01 * torch.randn(200, 64), pair])
        head = ArgmaxOutputHead(weight, packed=packed)
        assert int(head(x).argmax()) == int((x @ weight.T).argmax()) == 201
        wrong_in_bf16 += int(head.bf16_logits(x).argmax()) != 201
    assert wrong_in_bf16 > 10  # the bf16 logits alone do get it wrong
    model = tiny_model("llama", seed=6, vocab=97)
    ids = torch.randint(0, 97, (20,)).tolist()
    variant = "argmax-bf16-packed" if packed else "argmax-bf16-linear"
    with kernels.configured(argmax_head="on"):
        runner = Runner(model)
        full = runner.prefill(ids[:12]), runner.forward(ids[12:])
        runner.argmax_only = True
        plan = model.lm_head._leapdecode_plan
        plan._variant = [variant] * len(plan._variant)  # this variant at every row count
        argmax = runner.prefill(ids[:12]), runner.forward(ids[12:])
    assert all(torch.equal(a.argmax(-1), b.argmax(-1)) for a, b in zip(full, argmax))
    assert not torch.equal(full[1], argmax[1])  # the cheap head really ran
