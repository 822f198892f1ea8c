"""Long prompts for bench-kv, made here: needle prompts (a key/value fact hidden at a chosen depth in generated
filler, then a question about it) and long documents (Python's own reference text, shipped with the interpreter)
whose greedy continuations are compared between the full and the compressed cache."""

from __future__ import annotations

import random
from dataclasses import dataclass

ADJECTIVES = (
    "quiet bright old small heavy green distant warm narrow sudden silver patient crooked gentle hollow "
    "rusty early tidy loud pale"
).split()
NOUNS = (
    "river teacher window garden engine letter market violin ladder harbor lantern meadow kettle bridge "
    "notebook carpenter orchard tunnel compass village"
).split()
VERBS = (
    "watches follows carries paints opens repairs visits finds crosses builds measures ignores remembers "
    "borrows sketches"
).split()
PLACES = (
    "near the station|behind the old mill|after the long rain|before the market opens|under the grey sky|"
    "beside the frozen lake|at the edge of town|during the quiet evening"
).split("|")
KEYS = (
    "Paris Oslo Lima Cairo Tokyo Quito Dakar Hanoi Riga Perth Accra Bern Delhi Kyiv Lagos Minsk Nairobi Sofia "
    "Tunis Zagreb"
).split()


@dataclass
class Sample:
    kind: str  # "needle" or "document"
    text: str
    answer: str  # the needle's value ("" for documents)
    depth: float  # where the fact sits, as a fraction of the filler (0 for documents)
    tokens: int  # prompt length in tokens


def sentence(rng: random.Random) -> str:
    return (
        f"The {rng.choice(ADJECTIVES)} {rng.choice(NOUNS)} {rng.choice(VERBS)} the {rng.choice(ADJECTIVES)} "
        f"{rng.choice(NOUNS)} {rng.choice(PLACES)}."
    )


def _count(tokenizer, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def needle_prompt(tokenizer, length: int, depth: float, seed: int) -> Sample:
    """About `length` tokens: filler with "The special magic number for KEY is NNNNN." at `depth` (0 = start,
    1 = end), then the question, which ends where the model should write the number."""
    rng = random.Random(seed)
    key, value = rng.choice(KEYS), str(rng.randint(10000, 99999))
    fact = f"The special magic number for {key} is {value}."
    question = f"\nWhat is the special magic number for {key}? The special magic number for {key} is"
    room = length - _count(tokenizer, fact) - _count(tokenizer, question) - 2
    sentences, used = [], 0
    while True:
        s = sentence(rng)
        cost = _count(tokenizer, " " + s)
        if used + cost > room:
            break
        sentences.append(s)
        used += cost
    sentences.insert(round(depth * len(sentences)), fact)
    text = " ".join(sentences) + question
    return Sample("needle", text, value, depth, len(tokenizer(text)["input_ids"]))


def document_prompt(tokenizer, length: int, index: int) -> Sample:
    """About `length` tokens of Python's reference documentation (pydoc topics), starting at topic 7 * index."""
    from pydoc_data.topics import topics

    names = sorted(topics)
    start = (7 * index) % len(names)
    text, i = "", 0
    while len(text) < 8 * length:  # enough characters for `length` tokens, without tokenizing all of it
        text += topics[names[(start + i) % len(names)]] + "\n\n"
        i += 1
    ids = tokenizer(text, add_special_tokens=False)["input_ids"][:length]
    text = tokenizer.decode(ids)
    return Sample("document", text, "", 0.0, len(tokenizer(text)["input_ids"]))


def depths(count: int) -> list[float]:
    """Evenly spread depths in (0, 1): 1 -> [0.5], 4 -> [0.125, 0.375, 0.625, 0.875]."""
    return [(i + 0.5) / count for i in range(count)]
