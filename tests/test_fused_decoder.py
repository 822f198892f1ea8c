"""The fused decoder forward: the model's own computation (logits, hidden states, KV cache) in fewer calls, for the
Runner and the Engine alike, leaving the model's HF forward and state dict as they were."""

import pytest
import torch
from conftest import tiny_model

from leapdecode import kernels
from leapdecode.kernels.fused_decoder import fused_decoder
from leapdecode.runner import Runner


def _run(runner: Runner, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits and hidden states of a prefill, a 5-row forward, a rollback and 1-row forwards over ids."""
    runner.keep_hidden = True
    logits, hidden = [runner.prefill(ids[:4])[None]], [runner.hidden]
    logits.append(runner.forward(ids[4:9]))
    hidden.append(runner.hidden)
    runner.rollback(3)
    for token in ids[6:]:
        logits.append(runner.forward([token]))
        hidden.append(runner.hidden)
    return torch.cat(logits), torch.cat(hidden)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_fused_decoder_computes_what_the_models_forward_does(arch):
    model = tiny_model(arch, seed=21, vocab=97)
    ids = torch.randint(0, 97, (12,)).tolist()
    with kernels.configured(decoder="hf"):
        plain = Runner(model)
    fused = Runner(model)
    assert plain.decoder is None and fused.decoder is not None
    (want, want_hidden), (got, got_hidden) = _run(plain, ids), _run(fused, ids)
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5) and torch.equal(got.argmax(-1), want.argmax(-1))
    assert torch.allclose(got_hidden, want_hidden, atol=1e-5, rtol=1e-5)
    assert plain.cache_length == fused.cache_length == len(ids)


def test_fusing_leaves_the_models_own_forward_and_state_dict_alone():
    model = tiny_model("qwen2", seed=22, vocab=97)  # q/k/v with biases
    ids = torch.randint(0, 97, (1, 9))
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.inference_mode():
        before = model(ids).logits
        Runner(model)
        after = model(ids).logits
    assert torch.equal(before, after)
    assert state.keys() == model.state_dict().keys()
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())


def test_a_replaced_projection_is_picked_up_and_unsupported_modules_keep_hf_forward():
    model = tiny_model("llama", seed=23, vocab=97)
    ids = torch.randint(0, 97, (10,)).tolist()
    first = fused_decoder(model)
    attn = model.model.layers[1].self_attn
    with torch.no_grad():
        attn.v_proj.weight = torch.nn.Parameter(attn.v_proj.weight * 3)  # replaced, not changed in place
    runner = Runner(model)
    assert runner.decoder is not None and runner.decoder is not first
    with kernels.configured(decoder="hf"):
        want = _run(Runner(model), ids)[0]
    assert torch.allclose(_run(runner, ids)[0], want, atol=1e-5, rtol=1e-5)

    class Scaled(torch.nn.Linear):  # a projection the fused decoder does not know
        pass

    other = tiny_model("llama", seed=24, vocab=97)
    proj = other.model.layers[0].mlp.up_proj
    other.model.layers[0].mlp.up_proj = Scaled(proj.in_features, proj.out_features, bias=False)
    assert Runner(other).decoder is None
    assert Runner(other).prefill(ids).shape == (97,)


def test_decoder_setting_is_checked():
    with pytest.raises(ValueError, match="decoder must be one of fused, hf"):
        kernels.configure(decoder="fast")


@pytest.mark.parametrize(
    "rope", [None, {"rope_type": "linear", "factor": 2.0}, {"rope_type": "dynamic", "factor": 2.0}]
)
def test_rotary_rows_are_those_of_the_models_own_rotary_embedding(rope):
    """The fused forward reads cos/sin from a table for fixed frequencies (and calls the model's rotary for dynamic
    ones): every position, in any order and past the table's first size, gets the bits of a call for it alone."""
    model = tiny_model("llama", seed=24, vocab=97)
    if rope is not None:
        model.config.rope_parameters = {"rope_theta": model.config.rope_parameters["rope_theta"], **rope}
        model.model.rotary_emb = type(model.model.rotary_emb)(model.config)
    decoder = fused_decoder(model)
    x = torch.zeros(1, 1, model.config.hidden_size)
    for positions in ([0], [7, 8, 9, 10], [1500], list(range(300, 556)), [3, 2000, 1]):
        p = torch.tensor(positions)
        want, got = model.model.rotary_emb(x, p[None]), decoder.rotary(x, p)
        assert all(torch.equal(w, g) for w, g in zip(want, got)), positions
    assert (decoder._rope_table is None) == (rope is not None and rope["rope_type"] == "dynamic")
