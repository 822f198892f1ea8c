"""generate() across calls: a prompt that repeats an earlier conversation (a chat's next turn) starts from the
keys/values the earlier call left in the prefix cache, and gets the very tokens of computing them afresh."""

from __future__ import annotations

import pytest
import torch
from tiny_hf import make_tiny_hf_dir

from leapdecode import generate
from leapdecode.kv import make_press
from leapdecode.kv.prefix_cache import PrefixCache
from leapdecode.models import resolve_model


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return resolve_model(str(make_tiny_hf_dir(tmp_path_factory.mktemp("prefix") / "tiny", context=256)))


def ids(n: int, seed: int) -> list[int]:
    return torch.randint(3, 60, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("drafter", ["none", "prompt-lookup"])
def test_a_next_turn_reuses_the_conversation_and_gets_the_same_tokens(target, drafter):
    cache = PrefixCache(4096)
    prompt = ids(37, 1)
    first = generate(target, prompt, drafter=drafter, max_new_tokens=40, prefix_cache=cache)
    assert first.stats.cached_prompt_tokens == 0
    for turn in range(3):  # each turn repeats the conversation so far and adds a message
        prompt = prompt + first.token_ids + ids(9, 10 + turn)
        again = generate(target, prompt, drafter=drafter, max_new_tokens=40, prefix_cache=cache)
        fresh = generate(target, prompt, drafter=drafter, max_new_tokens=40, prefix_cache=False)
        known = len(prompt) - 9 - 1  # the earlier prompt and output, less the output's last token (never fed)
        assert again.stats.cached_prompt_tokens == known // cache.block * cache.block > 0
        assert fresh.stats.cached_prompt_tokens == 0
        assert again.token_ids == fresh.token_ids
        first = again


def test_calls_share_a_cache_per_model_by_default_and_a_press_never_reads_it(target):
    prompt = ids(50, 2)
    generate(target, prompt, max_new_tokens=8)
    assert generate(target, prompt + ids(5, 3), max_new_tokens=8).stats.cached_prompt_tokens == 48
    pressed = generate(target, prompt + ids(5, 3), max_new_tokens=8, kv_press=make_press("snapkv", budget=0.5))
    assert pressed.stats.cached_prompt_tokens == 0
