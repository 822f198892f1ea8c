"""GGUF files built in the test (gguf's GGUFWriter): a whole one loads with exactly its weights, through the cached
fp32 conversion and through the direct path that files over 2 GiB take; one missing a tensor or holding a misshapen
one is refused with one clear line on both paths (transformers would only log it and run random weights there)."""

from __future__ import annotations

import pytest
import torch
from tiny_gguf import tiny_llama, write_tiny_gguf

from leapdecode.errors import LeapDecodeError
from leapdecode.models import load_model
from leapdecode.models import loader as loader_module


@pytest.fixture
def tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LEAPDECODE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def reference():
    return tiny_llama(seed=5)


PATHS = ["cached conversion", "direct (over 2 GiB)"]


def _path(monkeypatch, which: str) -> None:
    if which != PATHS[0]:
        monkeypatch.setattr(loader_module, "GGUF_CACHE_MAX_BYTES", 0)  # as if the file were larger than the limit


@pytest.mark.parametrize("which", PATHS)
def test_a_whole_gguf_loads_exactly_its_weights(tmp_path, tmp_cache, monkeypatch, reference, which):
    _path(monkeypatch, which)
    loaded = load_model(str(write_tiny_gguf(tmp_path / "tiny.gguf", reference)))
    ids = torch.tensor([[1, 5, 9, 7, 3]])
    with torch.no_grad():
        assert torch.equal(loaded.model(ids).logits, reference(ids).logits)
    assert loaded.tokenizer.convert_ids_to_tokens(5) == "\u2581w2"


@pytest.mark.parametrize("which", PATHS)
@pytest.mark.parametrize(
    "broken, problem",
    [
        (dict(drop=("blk.1.ffn_up.weight",)), "missing model.layers.1.mlp.up_proj.weight"),
        (dict(drop=("output_norm.weight", "blk.0.attn_q.weight")), "missing model.layers.0.self_attn.q_proj.weight"),
        (dict(cut=("blk.0.attn_v.weight",)), "wrong shape model.layers.0.self_attn.v_proj.weight"),
    ],
    ids=["missing", "two missing", "wrong shape"],
)
def test_a_gguf_missing_a_tensor_or_misshapen_is_one_clear_error(
    tmp_path, tmp_cache, monkeypatch, reference, which, broken, problem
):
    _path(monkeypatch, which)
    path = write_tiny_gguf(tmp_path / "broken.gguf", reference, **broken)
    with pytest.raises(LeapDecodeError) as info:
        load_model(str(path))
    message = str(info.value)
    assert "\n" not in message and problem in message and str(path) in message, message
    assert "random weights" in message
    assert not list(tmp_cache.glob("gguf/broken-*")), "a refused file left a cache entry behind"
