"""Architectures beyond Llama and Qwen2, from tiny random configs: greedy decoding through `decode()` and the batched
Engine, on the packed-kernel path and on HF's own forward, equals HF `generate` greedy token for token, with drafts
really proposed, rejected and rolled back. GPT-2 (absolute positions, Conv1D layers, tied embeddings), Phi-3 (fused
q/k/v and gate/up), Gemma (tied, scaled embeddings), Qwen3 (q/k norms, tied) and GPT-NeoX (parallel residual, partial
rotary) run through HF's forward with leapdecode's attention. Models leapdecode cannot run exactly are refused with
one line; a sliding-window model is run only within its window."""

from __future__ import annotations

import pytest
import torch
from conftest import noisy_copy
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM, PreTrainedTokenizerFast

from leapdecode import generate
from leapdecode.controller import DraftLengthController
from leapdecode.decode import decode
from leapdecode.drafters import make_drafter
from leapdecode.engine import Engine
from leapdecode.errors import LeapDecodeError
from leapdecode.models.loader import LoadedModel
from leapdecode.runner import Runner
from leapdecode.sampling import SamplingConfig

V = 96
NO_SPECIAL = dict(bos_token_id=None, eos_token_id=None, pad_token_id=None)
COMMON = dict(
    vocab_size=V,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    **NO_SPECIAL,
)
ARCHITECTURES = {
    # tied models get larger random weights instead of a scaled head (scaling a tied head scales the embeddings too,
    # and such a model only repeats its last input token)
    "gpt2": dict(vocab_size=V, n_embd=64, n_layer=2, n_head=4, n_positions=256, initializer_range=0.3, **NO_SPECIAL),
    "phi3": dict(COMMON, tie_word_embeddings=False),
    "gemma": dict(COMMON, head_dim=16, initializer_range=0.3),
    "qwen3": dict(COMMON, head_dim=16, tie_word_embeddings=True, initializer_range=0.3),
    "gpt_neox": dict(
        vocab_size=V,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=256,
        **NO_SPECIAL,
    ),
}
PROMPTS = [[5, 6, 7, 8, 5, 6, 7, 9, 10, 5, 6], [11, 12, 13, 11, 12, 13, 11], list(range(20, 34)) + [20, 21]]


def tokenizer() -> PreTrainedTokenizerFast:
    backend = Tokenizer(models.WordLevel({f"w{i}": i for i in range(V)}, unk_token="w0"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="w0")


def build(model_type: str, seed: int = 0, auto=AutoModelForCausalLM, **config) -> torch.nn.Module:
    torch.manual_seed(seed)
    model = auto.from_config(AutoConfig.for_model(model_type, **config)).eval()
    if not model.config.tie_word_embeddings:
        with torch.no_grad():  # a decisive argmax
            model.get_output_embeddings().weight.mul_(8)
    return model


def hf_greedy(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    with torch.no_grad():
        ids = torch.tensor([prompt])
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=0,
            eos_token_id=None,
        )
    return out[0, len(prompt) :].tolist()


@pytest.fixture(scope="module", params=list(ARCHITECTURES))
def pair(request):
    target = build(request.param, **ARCHITECTURES[request.param])
    assert len(set(hf_greedy(target, PROMPTS[0], 20))) > 3  # not a model that repeats one token
    return request.param, target, {noise: noisy_copy(target, seed=3, noise=noise) for noise in (0.02, 0.05, 0.1)}


@pytest.mark.parametrize("packed_weights", [True, False], ids=["leapdecode-kernels", "hf-forward"])
def test_decode_equals_hf_greedy(pair, packed_weights):
    name, target, draft = pair
    drafted = accepted = 0
    for prompt in PROMPTS[:2]:
        reference = hf_greedy(target, prompt, 20)
        for drafter in (
            make_drafter("prompt-lookup"),
            make_drafter("draft-model", draft_model=draft[0.1], confidence=0.0),
            make_drafter("draft-model", draft_model=draft[0.02], confidence=0.0),
        ):
            out, stats = decode(
                Runner(target, packed_weights=packed_weights),
                prompt,
                drafter,
                sampling=SamplingConfig(),
                controller=DraftLengthController(k_init=4, adaptive=False),
                max_new_tokens=20,
                eos_ids=set(),
                context_length=256,
            )
            assert out == reference, f"{name}, {drafter.name}: differs from HF greedy"
            drafted, accepted = drafted + stats.drafted_tokens, accepted + stats.accepted_draft_tokens
    assert drafted > accepted > 0, (name, drafted, accepted)  # drafts were verified, some rejected (rolled back)


@pytest.mark.parametrize("packed_weights", [True, False], ids=["leapdecode-kernels", "hf-forward"])
def test_engine_equals_hf_greedy(pair, packed_weights):
    name, target, draft = pair
    engine = Engine(
        LoadedModel(target, tokenizer(), name, name),
        drafter="draft-model",
        draft_model=draft[0.05],
        draft_dtype="float32",
        drafter_options={"confidence": 0.0},
        packed_weights=packed_weights,
        max_batch_tokens=8,  # the longer prompts are read in chunks beside the others' decoding
        adaptive_draft_length=False,
    )
    results = engine.generate_many(PROMPTS, max_new_tokens=16)
    assert [r.token_ids for r in results] == [hf_greedy(target, p, 16) for p in PROMPTS], name
    m = engine.metrics()
    assert m["spec_decode_num_draft_tokens"] > m["spec_decode_num_accepted_tokens"] > 0, (name, m)


REFUSED = {
    "mamba": (AutoModelForCausalLM, dict(vocab_size=V, hidden_size=32, num_hidden_layers=2, state_size=4)),
    "rwkv": (
        AutoModelForCausalLM,
        dict(
            vocab_size=V,
            hidden_size=32,
            num_hidden_layers=2,
            attention_hidden_size=32,
            intermediate_size=64,
            context_length=64,
        ),
    ),
    "bloom": (AutoModelForCausalLM, dict(vocab_size=V, hidden_size=32, n_layer=2, n_head=4, **NO_SPECIAL)),
    "t5": (AutoModelForSeq2SeqLM, dict(vocab_size=V, d_model=32, d_ff=64, num_layers=2, num_heads=2, d_kv=16)),
}


@pytest.mark.parametrize("model_type", list(REFUSED))
def test_architectures_leapdecode_cannot_run_exactly_are_refused_in_one_line(model_type):
    """Recurrent models (no KV cache to roll back), attention of a model's own (leapdecode's attention, which keeps
    the Engine's sequences apart, would not be used) and encoder-decoders: one LeapDecodeError line, never wrong
    tokens nor a traceback."""
    auto, config = REFUSED[model_type]
    model = build(model_type, auto=auto, **config)
    for run in (
        lambda: generate(model, [5, 6, 7], tokenizer=tokenizer(), max_new_tokens=4),
        lambda: Engine(model, tokenizer=tokenizer()),
    ):
        with pytest.raises(LeapDecodeError) as info:
            run()
        message = str(info.value)
        assert "\n" not in message and type(model).__name__ in message, message


@pytest.mark.parametrize(
    "model_type, config",
    [
        ("mistral", dict(COMMON, sliding_window=6, tie_word_embeddings=False)),
        (
            "qwen2",
            dict(COMMON, use_sliding_window=True, sliding_window=6, max_window_layers=0, tie_word_embeddings=False),
        ),
    ],
)
def test_a_sliding_window_model_runs_only_within_its_window(model_type, config):
    """leapdecode's attention attends to every earlier position: the model's own attention only while the sequence
    fits in the window. So the window is the context: output stops there ("context"), equal to HF greedy."""
    model = build(model_type, **config)
    result = generate(model, [5, 6, 7], tokenizer=tokenizer(), drafter="prompt-lookup", max_new_tokens=20)
    assert result.token_ids == hf_greedy(model, [5, 6, 7], 3) and result.stats.stop_reason == "context"
    with pytest.raises(LeapDecodeError, match="context of 6"):
        generate(model, list(range(5, 15)), tokenizer=tokenizer(), max_new_tokens=4)
    no_window = build(
        model_type, **{k: v for k, v in config.items() if k != "sliding_window"} | {"sliding_window": None}
    )
    assert generate(no_window, [5, 6, 7], tokenizer=tokenizer(), max_new_tokens=20).stats.stop_reason == "length"
