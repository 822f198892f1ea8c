"""The Runner's few-row linear path: active only inside its own multi-token forwards, numerically equal to F.linear."""
import torch

from conftest import tiny_model
from leapdecode.runner import Runner


def test_skinny_linear_only_inside_runner_and_matches_linear():
    model = tiny_model("llama", seed=3, vocab=97)
    runner = Runner(model)
    ids = torch.randint(0, 97, (1, 9))
    with torch.inference_mode():
        reference = model(ids).logits[0]          # a plain call: the original F.linear everywhere
        linear = next(m for m in model.modules() if type(m) is torch.nn.Linear)
        x = torch.randn(5, linear.in_features)
        assert torch.equal(linear(x), torch.nn.functional.linear(x, linear.weight, linear.bias))
    runner.prefill(ids[0, :4].tolist())
    logits = runner.forward(ids[0, 4:].tolist())   # 5 rows: the skinny path
    assert torch.allclose(logits, reference[4:], atol=1e-4, rtol=1e-4)
    runner.rollback(5)
    one = [runner.forward([t])[0] for t in ids[0, 4:].tolist()]  # one row at a time: F.linear
    assert torch.allclose(torch.stack(one), reference[4:], atol=1e-4, rtol=1e-4)
