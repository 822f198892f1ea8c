"""Prompt lookup's copies: the tokens after the latest earlier occurrence of the context's last n tokens (longest n
first), found from a table the drafter extends as the context grows."""

import random

import pytest

from leapdecode.drafters.prompt_lookup import PromptLookupDrafter


def scan(context: list[int], k: int, max_ngram: int, min_ngram: int) -> list[int]:
    """The copy by a plain scan of the whole context."""
    for n in range(min(max_ngram, len(context) - 1), min_ngram - 1, -1):
        tail = context[-n:]
        for start in range(len(context) - n - 1, -1, -1):
            if context[start : start + n] == tail:
                return context[start + n : start + n + k]
    return []


@pytest.mark.parametrize("seed", range(4))
def test_copies_are_those_of_a_scan_of_the_whole_context(seed):
    rng = random.Random(seed)
    drafter = PromptLookupDrafter(max_ngram=3, min_ngram=1)
    drafter.floor = 0.0  # keep every copied token
    for _request in range(3):
        context = [rng.randrange(6) for _ in range(rng.randrange(1, 30))]
        drafter.start(context, None)
        for _step in range(60):
            drafter.min_ngram = rng.choice([1, 2, 3])  # the head's drafter switches it per step
            k = rng.randrange(1, 6)
            assert drafter.propose(context, k).tokens == scan(context, k, 3, drafter.min_ngram)
            context = context + [rng.randrange(6) for _ in range(rng.randrange(1, 4))]
    shorter = context[:5]  # a context the drafter never saw grow (no start): indexed afresh
    assert drafter.propose(shorter, 4).tokens == scan(shorter, 4, 3, drafter.min_ngram)
