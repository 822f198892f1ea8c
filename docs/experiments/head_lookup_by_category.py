"""Does tuning the draft head's own prompt lookup per category pay? (docs/draft-heads.md reports the result.)

For every first turn of the 13-category suite, SmolLM2-135M's shipped head drafts with lookup_ngram 0..3 (0 = no
lookup) at a fixed draft length of 6; the measure is accepted tokens per target forward, which does not depend on
machine load. The best setting per category is chosen on dev (2 questions each) and evaluated on held-out (1 each).

    python docs/experiments/head_lookup_by_category.py
"""

from collections import defaultdict

import torch

from leapdecode import generate
from leapdecode.drafters.factory import attached_head
from leapdecode.models import resolve_model
from leapdecode.lab.bench.suites import load_suite
from leapdecode.drafters import HeadDrafter

SETTINGS = (0, 1, 2, 3)
DEFAULT = 2

torch.set_num_threads(2)
target = resolve_model("smollm2-135m")
head = attached_head(target, target.name)
counts = {}  # split -> category -> setting -> [new tokens, target forwards]
for split, per_category in (("dev", 2), ("heldout", 1)):
    counts[split] = defaultdict(lambda: {n: [0, 0] for n in SETTINGS})
    for q in load_suite(split, per_category=per_category):
        for n in SETTINGS:
            r = generate(
                target,
                [{"role": "user", "content": q.turns[0]}],
                drafter=HeadDrafter(head, lookup_ngram=n),
                max_new_tokens=96,
                draft_length=6,
                max_draft_length=6,
                adaptive_draft_length=False,
            )
            counts[split][q.category][n][0] += r.stats.new_tokens
            counts[split][q.category][n][1] += r.stats.forward_passes


def per_forward(split, choice):
    """Accepted tokens per forward over all categories, with setting choice(category)."""
    d = counts[split]
    return sum(d[c][choice(c)][0] for c in d) / sum(d[c][choice(c)][1] for c in d)


best = {c: max(SETTINGS, key=lambda n: (d[n][0] / d[n][1], n == DEFAULT)) for c, d in counts["dev"].items()}
print("chosen on dev:", best)
for split in counts:
    print(
        f"{split}: one setting for all",
        {n: round(per_forward(split, lambda c: n), 3) for n in SETTINGS},  # noqa: B023 - called at once
        f"| per-category choice {per_forward(split, best.get):.3f}",
    )
