"""On a GPU (skipped without CUDA): the single-request loop and the batched Engine build their tensors on the
model's device and still return plain greedy decoding's tokens (HF `generate` on the same GPU model). Off the CPU the
forward keeps HF's operations: leapdecode's native kernels read CPU memory by address (a CUDA tensor handed to them
crashed the process on the first GPU host this suite ran on)."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model
from tiny_hf import make_tiny_hf_dir

from leapdecode import generate
from leapdecode.engine import Engine
from leapdecode.forward import ModelForward
from leapdecode.models import resolve_model

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_a_model_off_the_cpu_runs_without_leapdecodes_kernels():
    """Runs everywhere: the decision is made from where the weights are (the meta device stands in for a GPU)."""
    assert ModelForward(tiny_model("llama", seed=1)).packed_weights
    assert not ModelForward(tiny_model("llama", seed=1).to("meta")).packed_weights


def hf_greedy(model, prompt: list[int], n: int) -> list[int]:
    ids = torch.tensor([prompt], device=model.device)
    out = model.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0
    )
    return out[0, len(prompt) :].tolist()


@needs_cuda
def test_single_request_and_engine_on_cuda(tmp_path):
    target = resolve_model(str(make_tiny_hf_dir(tmp_path / "tiny", context=256)))
    target.model.to("cuda")
    prompts = [[5, 6, 7, 8, 5, 6], [9, 10], list(range(4, 40))]
    expected = [hf_greedy(target.model, p, 16) for p in prompts]
    for drafter in ("none", "prompt-lookup", "ngram"):
        assert [generate(target, p, drafter=drafter, max_new_tokens=16).token_ids for p in prompts] == expected
    engine = Engine(target, drafter="prompt-lookup", max_batch_tokens=16)
    assert [r.token_ids for r in engine.generate_many(prompts, max_new_tokens=16)] == expected


@needs_cuda
def test_qwen2_on_cuda_with_a_draft_model():
    target = tiny_model("qwen2", seed=4).to("cuda")
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    result = generate(
        target,
        prompt,
        tokenizer=_Tokenizer(),
        drafter="draft-model",
        draft_model=target,
        draft_dtype="float32",
        max_new_tokens=12,
    )
    assert result.token_ids == hf_greedy(target, prompt, 12)


class _Tokenizer:
    """Just enough of a tokenizer for token-id prompts."""

    chat_template = None
    eos_token_id = None

    def __len__(self):
        return 96

    def get_vocab(self):
        return {str(i): i for i in range(96)}

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))
