"""Generated tasks with exact, checkable answers, a tiny character vocabulary, and a deterministic held-out split.

Two families, in the spirit of ParallelBench and the dLLM papers:

* **single-answer** tasks (copy, reverse, sort, add, lookup, record): one correct output. A capable model is confident
  everywhere, so they show whether a decoder *keeps* accuracy (add, with carries, is the hardest of them).
* **several-valid-answer** tasks whose tokens must agree with each other (pick3, oneword, pair): the model's
  per-position marginals are spread over several valid answers, so committing many positions in one forward mixes
  two valid answers into an invalid one (a repeated item, a word spliced from two words, a key with another key's
  value). These are the tasks that rank parallel decoders.

Each task's checker accepts *any* valid answer. Held-out examples are those whose prompt hashes into the held-out
bucket; training never sees them.
"""
from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from typing import Callable

from ..errors import require

PAD, MASK, EOS = "<pad>", "<mask>", "<eos>"
SPECIAL = [PAD, MASK, EOS]
CHARS = list("0123456789abcdefghijklmnopqrstuvwxyz ,:;=+?{}|")
GEN_LEN = 16          # answer region (answer + <eos> + <pad>s) used by the suite
MAX_LEN = 64          # model context: prompt + answer region must fit
HELDOUT_BUCKETS = 10  # 1 bucket in 10 is held out
PROMPT_WIDTH = 24     # prompts are left-padded to this width, so the answer region starts at a fixed column


class CharTokenizer:
    """One token per character plus <pad>, <mask> and <eos>."""

    def __init__(self) -> None:
        self.vocab = SPECIAL + CHARS
        self.index = {tok: i for i, tok in enumerate(self.vocab)}
        self.pad_id, self.mask_id, self.eos_id = (self.index[t] for t in SPECIAL)

    def __len__(self) -> int:
        return len(self.vocab)

    def encode(self, text: str) -> list[int]:
        bad = sorted({c for c in text if c not in self.index})
        require(not bad, f"characters outside the model's vocabulary: {''.join(bad)!r} (allowed: {''.join(CHARS)!r})")
        return [self.index[c] for c in text]

    def decode(self, ids: list[int], stop_at_eos: bool = True) -> str:
        """Text of the ids, stopping at the first <eos>; <pad> is dropped and an uncommitted <mask> shows as '_'."""
        out = []
        for i in ids:
            if i == self.eos_id and stop_at_eos:
                break
            if i == self.pad_id:
                continue
            out.append("_" if i == self.mask_id else self.vocab[i] if i > self.eos_id else "")
        return "".join(out)


@dataclass(frozen=True)
class Example:
    task: str
    prompt: str
    answer: str  # one valid answer (training target); the checker accepts any valid one


@dataclass(frozen=True)
class Task:
    name: str
    multi_answer: bool                          # several valid answers whose tokens must agree
    make: Callable[[random.Random], tuple[str, str]]
    check: Callable[[str, str], bool]           # (prompt, output) -> valid?


def _digits(rng: random.Random, lo: int, hi: int) -> str:
    return "".join(rng.choice("0123456789") for _ in range(rng.randint(lo, hi)))


def _word(rng: random.Random, lo: int, hi: int) -> str:
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(lo, hi)))


def _payload(prompt: str) -> str:
    return prompt.split(" ", 1)[1]


# ---- single-answer tasks -------------------------------------------------------------------------------------------
def _copy(rng):
    s = _digits(rng, 8, 8)
    return f"copy {s}", s


def _reverse(rng):
    s = _digits(rng, 8, 8)
    return f"rev {s}", s[::-1]


def _sort(rng):
    s = _digits(rng, 8, 8)
    return f"sort {s}", "".join(sorted(s))


def _add(rng):
    # the sum is written with 5 digits (leading zero when < 10000), so answer digit i always sits in the same column
    # relative to the operands' digits: the model has to learn carries, not where the answer starts
    a, b = rng.randint(1000, 9999), rng.randint(1000, 9999)
    return f"add {a}+{b}", f"{a + b:05d}"


def _add_check(prompt, out):
    a, b = _payload(prompt).split("+")
    return out.isdigit() and int(out) == int(a) + int(b)


def _lookup(rng):
    keys = rng.sample("abcdefghijklmnopqrstuvwxyz", 3)
    vals = [_word(rng, 3, 3) for _ in keys]
    k = rng.randrange(3)
    table = " ".join(f"{key}={v}" for key, v in zip(keys, vals))
    return f"get {table} ?{keys[k]}", vals[k]


def _lookup_check(prompt, out):
    body, q = _payload(prompt).rsplit(" ?", 1)
    return dict(kv.split("=") for kv in body.split(" ")).get(q) == out


def _record(rng):
    name, age = _word(rng, 3, 3), rng.randint(10, 99)
    return f"rec {name} {age}", f"{{n:{name},a:{age}}}"


# ---- several-valid-answer tasks (tokens must agree) ----------------------------------------------------------------
def _pick3(rng):
    items = rng.sample("abcdefghijklmnopqrstuvwxyz0123456789", 6)
    return f"pick3 {''.join(items)}", ",".join(rng.sample(items, 3))


def _pick3_check(prompt, out):
    items, parts = set(_payload(prompt)), out.split(",")
    return len(parts) == 3 and all(len(p) == 1 and p in items for p in parts) and len(set(parts)) == 3


def _oneword(rng):
    words = [_word(rng, 4, 4) for _ in range(3)]
    return f"any {' '.join(words)}", rng.choice(words)


def _pair(rng):
    keys = [_word(rng, 2, 2) for _ in range(3)]
    vals = [_word(rng, 2, 2) for _ in range(3)]
    k = rng.randrange(3)
    return f"pair {' '.join(f'{a}:{b}' for a, b in zip(keys, vals))}", f"{keys[k]} is {vals[k]}"


def _pair_check(prompt, out):
    pairs = {tuple(p.split(":")) for p in _payload(prompt).split(" ")}
    parts = out.split(" is ")
    return len(parts) == 2 and tuple(parts) in pairs


TASKS: dict[str, Task] = {t.name: t for t in [
    Task("copy", False, _copy, lambda p, o: o == _payload(p)),
    Task("reverse", False, _reverse, lambda p, o: o == _payload(p)[::-1]),
    Task("sort", False, _sort, lambda p, o: o == "".join(sorted(_payload(p)))),
    Task("add", False, _add, _add_check),
    Task("lookup", False, _lookup, _lookup_check),
    Task("record", False, _record, lambda p, o: o == "{n:%s,a:%s}" % tuple(_payload(p).split(" "))),
    Task("pick3", True, _pick3, _pick3_check),
    Task("oneword", True, _oneword, lambda p, o: o in _payload(p).split(" ")),
    Task("pair", True, _pair, _pair_check),
]}


def is_heldout(prompt: str) -> bool:
    """Deterministic split by prompt hash: the same prompt is always on the same side."""
    return int(hashlib.sha256(prompt.encode()).hexdigest()[:8], 16) % HELDOUT_BUCKETS == 0


def resolve_tasks(names: list[str] | None) -> list[str]:
    if not names:
        return list(TASKS)
    unknown = [n for n in names if n not in TASKS]
    require(not unknown, f"unknown task {unknown[:1]}; choose from {', '.join(TASKS)}")
    return names


def sample(task: str, rng: random.Random, heldout: bool) -> Example:
    """One example from the requested side of the split (rejection sampling on the prompt hash)."""
    while True:
        prompt, answer = TASKS[task].make(rng)
        if is_heldout(prompt) == heldout:
            return Example(task, prompt, answer)


def heldout_set(tasks: list[str], per_task: int, seed: int = 1234) -> list[Example]:
    """The fixed held-out evaluation set: `per_task` examples per task, identical for a given seed."""
    rng = random.Random(seed)
    return [sample(t, rng, heldout=True) for t in tasks for _ in range(per_task)]


def check(example: Example, output: str) -> bool:
    return TASKS[example.task].check(example.prompt, output)


def encode_prompts(tok: CharTokenizer, prompts: list[str], width: int = PROMPT_WIDTH) -> "torch.LongTensor":
    """Left-pad prompts with <pad> to `width` (or the longest prompt), so the answer region starts at a fixed column:
    the model was trained with that layout and is much less accurate with prompts at other offsets."""
    import torch

    ids = [tok.encode(p) for p in prompts]
    width = max([width] + [len(i) for i in ids])
    return torch.tensor([[tok.pad_id] * (width - len(i)) + i for i in ids], dtype=torch.long)


def encode_training_batch(tok: CharTokenizer, examples: list[Example], gen_len: int = GEN_LEN):
    """(tokens, answer_mask): left-padded prompt, then answer + <eos> + <pad>s filling `gen_len` positions."""
    import torch

    prompts = encode_prompts(tok, [e.prompt for e in examples])
    answers = []
    for e in examples:
        a = tok.encode(e.answer) + [tok.eos_id]
        require(len(a) <= gen_len, f"answer of {len(a)} tokens does not fit gen_len={gen_len}")
        answers.append(a + [tok.pad_id] * (gen_len - len(a)))
    tokens = torch.cat([prompts, torch.tensor(answers, dtype=torch.long)], dim=1)
    answer_mask = torch.zeros_like(tokens, dtype=torch.bool)
    answer_mask[:, prompts.shape[1]:] = True
    return tokens, answer_mask
