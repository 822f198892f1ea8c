"""Generated tasks with exact, checkable answers, a tiny character vocabulary, and a deterministic held-out split.

Two families, in the spirit of ParallelBench and the dLLM papers:

* **single-answer** tasks (copy, reverse, sort, add, nth, record): one correct output. A capable model is confident
  everywhere, so they show whether a decoder *keeps* accuracy (add, with carries, is the hardest of them).
* **several-valid-answer** tasks whose tokens must agree with each other (sum: two digits with a given sum; likes: a
  templated sentence with several valid fillers; fmt: a record in any of four formats): the model's per-position
  marginals are spread over several valid answers, so committing many positions in one forward splices two valid
  answers into an invalid one ("xyz:3+3" for sum 12, "likes tan", a name in another format's columns). These are the
  tasks that rank parallel decoders.

Every task is solvable by routing on positions (which column to copy, given the prompt's fixed layout and the answer
tokens committed so far). Tasks that need matching by content instead (a key looked up by its letters, "any three
distinct items of a list", "any one of these words") stayed at 2-8 % for a 0.9M model after 24 CPU minutes, so they
could not show what parallel decoding loses; they were dropped from the suite.

Each task's checker accepts *any* valid answer. Held-out examples are those whose prompt hashes into the held-out
bucket; training never sees them.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from ...errors import require

if TYPE_CHECKING:
    import torch

PAD, MASK, EOS = "<pad>", "<mask>", "<eos>"
SPECIAL = [PAD, MASK, EOS]
CHARS = list("0123456789abcdefghijklmnopqrstuvwxyz ,:;=+?{}|")
GEN_LEN = 16  # answer region (answer + <eos> + <pad>s) used by the suite
MAX_LEN = 64  # model context: prompt + answer region must fit
HELDOUT_BUCKETS = 10  # 1 bucket in 10 is held out
PROMPT_WIDTH = 24  # prompts are left-padded to this width, so the answer region starts at a fixed column


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
    multi_answer: bool  # several valid answers whose tokens must agree
    make: Callable[[random.Random], tuple[str, str]]
    check: Callable[[str, str], bool]  # (prompt, output) -> valid?


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


def _nth(rng):
    # templated question answering: the index names which of three words to return
    words = [_word(rng, 3, 3) for _ in range(3)]
    k = rng.randrange(3)
    return f"nth {k + 1} {' '.join(words)}", words[k]


def _nth_check(prompt, out):
    k, *words = _payload(prompt).split(" ")
    return out == words[int(k) - 1]


def _record(rng):
    name, age = _word(rng, 3, 3), rng.randint(10, 99)
    return f"rec {name} {age}", f"{{n:{name},a:{age}}}"


# ---- several-valid-answer tasks (tokens must agree) ----------------------------------------------------------------
def _sum(rng):
    # two digits with the given sum, tagged with the prompt's label: "sum 12 xyz" -> xyz:3+9, xyz:4+8, ..., xyz:9+3
    # (each digit fixes the other; the label makes the prompts many, so the held-out split holds unseen prompts)
    a, b, tag = rng.randint(0, 9), rng.randint(0, 9), _word(rng, 3, 3)
    return f"sum {a + b:02d} {tag}", f"{tag}:{a}+{b}"


def _sum_check(prompt, out):
    total, tag = _payload(prompt).split(" ")
    head, _, expr = out.partition(":")
    parts = expr.split("+")
    return (
        head == tag
        and len(parts) == 2
        and all(len(p) == 1 and p.isdigit() for p in parts)
        and int(parts[0]) + int(parts[1]) == int(total)
    )


# the valid fillers of the `likes` template, chosen so that the per-position majority letters ("t", "a", "n") spell a
# word that is not one of them: a decoder that commits every position from the marginals in one forward writes "tan"
LIKES = ("tea", "tin", "ton", "ban", "fan")


def _likes(rng):
    name = _word(rng, 3, 3)
    return f"likes {name}", f"{name} likes {rng.choice(LIKES)}"


def _likes_check(prompt, out):
    return out in {f"{_payload(prompt)} likes {x}" for x in LIKES}


def _formats(name: str, age: str) -> set[str]:
    return {f"{{n:{name},a:{age}}}", f"{name}={age}", f"{name} is {age}", f"{age}:{name}"}


def _fmt(rng):
    # a record in any of four formats: the name's and age's columns depend on which format the answer uses
    name, age = _word(rng, 3, 3), str(rng.randint(10, 99))
    return f"fmt {name} {age}", rng.choice(sorted(_formats(name, age)))


TASKS: dict[str, Task] = {
    t.name: t
    for t in [
        Task("copy", False, _copy, lambda p, o: o == _payload(p)),
        Task("reverse", False, _reverse, lambda p, o: o == _payload(p)[::-1]),
        Task("sort", False, _sort, lambda p, o: o == "".join(sorted(_payload(p)))),
        Task("add", False, _add, _add_check),
        Task("nth", False, _nth, _nth_check),
        Task("record", False, _record, lambda p, o: o == "{n:%s,a:%s}" % tuple(_payload(p).split(" "))),
        Task("sum", True, _sum, _sum_check),
        Task("likes", True, _likes, _likes_check),
        Task("fmt", True, _fmt, lambda p, o: o in _formats(*_payload(p).split(" "))),
    ]
}


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
    answer_mask[:, prompts.shape[1] :] = True
    return tokens, answer_mask
