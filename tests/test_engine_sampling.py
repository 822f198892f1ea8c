"""Sampling in the batched Engine keeps the target's distribution at every output position, under concurrency (many
requests per step), chunked prefill (prompts read a few rows at a time beside decoding streams) and the prefix cache
(requests sharing a cached prefix): the per-position conditional chi-square of tests/test_sampling_steps.py over the
engine's outputs, with the engine's default temperature 1.0 and a sampling draft model (q is a real distribution).
Controls: verifying one request's draft against another request's q, and a row replaying another row's generator,
must both be rejected by the same test."""

from __future__ import annotations

import pytest
import torch
from conftest import noisy_copy, tiny_model
from test_sampling_steps import ALPHA, V, buggy_accept, conditional_chi_square
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

import leapdecode.sequence as sequence_module
from leapdecode.drafters.base import Draft
from leapdecode.engine import Engine
from leapdecode.models.loader import LoadedModel
from leapdecode.sampling import SamplingConfig, probabilities

REQUESTS, PER_BATCH, MAX_NEW = 240, 8, 12
ENGINE_DEFAULT = SamplingConfig(temperature=1.0)  # what the engine and the server sample with by default
SHARED = [1, 2, 3, 4, 5, 0] * 3  # an 18-token common prefix: its first 16 tokens are a prefix-cache block


@pytest.fixture(scope="module")
def pair():
    target = tiny_model("llama", seed=3, head_scale=6.0, vocab=V)
    backend = Tokenizer(models.WordLevel({f"w{i}": i for i in range(V)}, unk_token="w0"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="w0")
    return LoadedModel(target, tokenizer, "tiny-v6", "memory"), noisy_copy(target, seed=4, noise=1.0)


def engine_records(pair, cfg=ENGINE_DEFAULT):
    """REQUESTS seeded requests, PER_BATCH at a time, through one engine; (row, previous token) groups as in
    test_sampling_steps; also how often the prefix cache served and how many steps read a prompt beside decoding."""
    loaded, draft = pair
    eng = Engine(
        loaded,
        drafter="draft-model",
        draft_model=draft,
        draft_dtype="float32",
        drafter_options={"confidence": 0.0},
        max_batch_tokens=32,  # eight prompts of 4-22 tokens are read in chunks, some beside decoding streams
        prefix_cache_tokens=64,
        adaptive_draft_length=False,
        draft_length=4,
    )
    outputs: dict[int, list] = {}
    prompts, records = {}, []
    for start in range(0, REQUESTS, PER_BATCH):
        for seed in range(start, start + PER_BATCH):
            prompt = (SHARED if seed % 2 else []) + [seed % V, 2, 3, (seed // V) % V]
            rid = eng.add_request(
                prompt,
                max_new_tokens=MAX_NEW,
                temperature=cfg.temperature,
                top_p=cfg.top_p,
                top_k=cfg.top_k,
                seed=seed,
                on_output=lambda o: outputs.setdefault(o.request_id, []).append(o),
            )
            prompts[rid] = prompt
        while eng.has_work:
            eng.step()
    target = loaded.model
    deepest = 0
    assert len(outputs) == REQUESTS
    for rid, outs in outputs.items():
        prompt, final = prompts[rid], outs[-1]
        assert final.finished and final.finish_reason == "length"
        out = [t for o in outs for t in o.new_token_ids]
        rows = [r for n in final.stats.accepted_per_step for r in range(n)]
        deepest = max(deepest, *final.stats.accepted_per_step)
        with torch.no_grad():
            logits = target(torch.tensor([prompt + out])).logits[0, len(prompt) - 1 : len(prompt) - 1 + len(out)]
        exact = probabilities(logits, cfg)
        records += [
            ((row, (prompt + out)[len(prompt) + j - 1]), tok, exact[j]) for j, (row, tok) in enumerate(zip(rows, out))
        ]
    assert deepest >= 3, "no step accepted two drafted tokens"
    assert eng.prefix_cache.hits > 0
    return records, eng


def test_engine_sampling_keeps_every_position_exact(pair):
    records, eng = engine_records(pair)
    assert conditional_chi_square(records) > ALPHA
    m = eng.metrics()
    assert m["spec_decode_num_draft_tokens"] > m["spec_decode_num_accepted_tokens"] > 0


def test_the_q_of_another_request_is_rejected(pair, monkeypatch):
    """Planted: each sequence is verified against the q rows of the sequence verified before it in the step."""
    accept, previous = sequence_module.SequenceState.accept, {}

    def swapped(self, logits, *args, **kwargs):
        mine = self.draft.probs
        other = previous.get("probs")
        if mine is not None and other is not None and other.shape == mine.shape:
            self.draft = Draft(self.draft.tokens, other)
        previous["probs"] = mine
        return accept(self, logits, *args, **kwargs)

    monkeypatch.setattr(sequence_module.SequenceState, "accept", swapped)
    records, _ = engine_records(pair)
    assert conditional_chi_square(records) < ALPHA


def test_a_row_replaying_another_rows_generator_is_rejected(pair, monkeypatch):
    """Planted: row i of a step draws with row i-1's randomness (the wrong generator row)."""
    monkeypatch.setattr(sequence_module, "speculative_accept", buggy_accept("generators shifted by one"))
    records, _ = engine_records(pair)
    assert conditional_chi_square(records) < ALPHA
