"""The Runner's pre-packed linear path: active only inside its own forwards, numerically F.linear up to rounding."""
import pytest
import torch

from conftest import tiny_model
from leapdecode.runner import Runner


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_linear_only_inside_runner_and_matches_linear(dtype):
    model = tiny_model("llama", seed=3, vocab=97).to(dtype)
    ids = torch.randint(0, 97, (1, 9))
    with torch.inference_mode():
        reference = model(ids).logits[0].float()          # a plain call: HF's F.linear everywhere
    runner = Runner(model)
    with torch.inference_mode():
        linear = next(m for m in model.modules() if type(m) is torch.nn.Linear)
        x = torch.randn(5, linear.in_features, dtype=dtype)
        assert torch.equal(linear(x), torch.nn.functional.linear(x, linear.weight, linear.bias))  # outside: HF's
    tol = 1e-4 if dtype == torch.float32 else 0.05
    runner.prefill(ids[0, :4].tolist())
    logits = runner.forward(ids[0, 4:].tolist())          # 5 rows through the packed weights
    assert torch.allclose(logits.float(), reference[4:], atol=tol, rtol=tol)
    runner.rollback(5)
    one = [runner.forward([t])[0] for t in ids[0, 4:].tolist()]  # one row at a time (zero-padded to four rows)
    assert torch.allclose(torch.stack(one).float(), reference[4:], atol=tol, rtol=tol)
    runner.rollback(5)
    few = torch.cat([runner.forward(ids[0, 4:6].tolist()), runner.forward(ids[0, 6:].tolist())])  # 2 + 3 rows
    assert torch.allclose(few.float(), reference[4:], atol=tol, rtol=tol)


def test_packed_weights_follow_weight_changes_and_can_be_turned_off():
    model = tiny_model("llama", seed=4, vocab=97)
    ids = torch.randint(0, 97, (12,)).tolist()
    before = Runner(model).prefill(ids)
    with torch.no_grad():
        model.lm_head.weight.mul_(2.0)                     # in place: the packed copy must be rebuilt
    after = Runner(model).prefill(ids)
    assert not torch.allclose(before, after)
    with torch.inference_mode():
        plain = model(torch.tensor([ids]), logits_to_keep=1).logits[0, -1]
    assert torch.allclose(after, plain, atol=1e-4, rtol=1e-4)
    assert torch.equal(Runner(model, packed_weights=False).prefill(ids), plain)
