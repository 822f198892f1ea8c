"""Does prompt lookup with a draft model pay? (docs/benchmarks.md, "Prompt lookup with the draft model", reports it.)

For every first turn of a split (held-out unless a third argument names another), one run times HF `generate` and
leapdecode's draft-model drafter with lookup "off" (the draft model writes every draft token), "first" (a copy from
the request, then the draft model) and "after" (the draft model, then a copy where it stops unsure), greedy, 96 new
tokens, the order rotating per question. It prints per category and overall: speedup over HF generate (summed
times) and target tokens per forward, and fails if any output differs from HF's.

    python docs/experiments/draft_model_lookup.py smollm2-135m smollm2-135m        # quantized self (int8 draft)
    python docs/experiments/draft_model_lookup.py qwen2.5-coder-1.5b qwen2.5-coder-0.5b
    python docs/experiments/draft_model_lookup.py qwen2.5-coder-1.5b qwen2.5-coder-0.5b dev
"""

import sys
import time
from collections import defaultdict

import torch

from leapdecode import generate
from leapdecode.prompt import encode_prompt
from leapdecode.models import resolve_model
from leapdecode.lab.bench.methods import BenchContext, Variant, run_hf
from leapdecode.lab.bench.suites import load_suite
from leapdecode.drafters import DraftModelDrafter

SETTINGS = ("off", "first", "after")
MAX_NEW = 96
SPLIT = sys.argv[3] if len(sys.argv) > 3 else "heldout"

torch.set_num_threads(2)
target = resolve_model(sys.argv[1])
draft = resolve_model(sys.argv[2], dtype="int8")
ctx = BenchContext(target=target, max_new_tokens=MAX_NEW)
totals = defaultdict(lambda: defaultdict(lambda: [0.0, 0, 0]))  # category -> method -> [seconds, tokens, forwards]
warm_up = [{"role": "user", "content": "Say hello."}]
generate(target, warm_up, drafter=DraftModelDrafter(draft.model), max_new_tokens=8)  # kernel choice, first-call costs
run_hf(ctx, Variant("hf-generate"), encode_prompt(target.tokenizer, warm_up))
METHODS = ["hf-generate", *SETTINGS]
for i, q in enumerate(load_suite(SPLIT, per_category=1)):
    messages = [{"role": "user", "content": q.turns[0]}]
    outputs = {}
    for method in METHODS[i % len(METHODS) :] + METHODS[: i % len(METHODS)]:
        if method == "hf-generate":
            m = run_hf(ctx, Variant("hf-generate"), encode_prompt(target.tokenizer, messages))
            outputs[method], seconds, forwards = m.token_ids, m.wall_time, m.forward_passes
        else:
            drafter = DraftModelDrafter(draft.model, lookup=method)
            start = time.perf_counter()
            r = generate(target, messages, drafter=drafter, max_new_tokens=MAX_NEW, max_draft_length=16)
            outputs[method], seconds, forwards = list(r.token_ids), time.perf_counter() - start, r.stats.forward_passes
        for key in (q.category, "all"):
            t = totals[key][method]
            t[0], t[1], t[2] = t[0] + seconds, t[1] + len(outputs[method]), t[2] + forwards
    assert all(outputs[m] == outputs["hf-generate"] for m in METHODS), f"{q.category}: an output differs from HF's"
    print(
        q.category, {m: round(totals[q.category]["hf-generate"][0] / totals[q.category][m][0], 2) for m in METHODS[1:]}
    )

print(f"\n{sys.argv[1]} drafted by {sys.argv[2]} (int8), {SPLIT} first turns: speedup over HF generate, tokens/forward")
for category, by_method in totals.items():
    hf = by_method["hf-generate"][0]
    cells = [f"lookup {m}: {hf / s:.2f}x {n / f:.2f}" for m, (s, n, f) in by_method.items() if m != "hf-generate"]
    print(f"{category:>16}  " + "  ".join(cells))
