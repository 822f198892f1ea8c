"""The whole benchmark as one call: measure a suite, then write results.json, report.md and the PNG plots."""

from __future__ import annotations

import datetime
import os
import pathlib
from dataclasses import asdict, dataclass

import torch

from ...drafters.factory import attached_head
from ...errors import LeapDecodeError
from ...models.quantize import dtype_name
from ...prompt import encode_prompt
from ..report_kit import environment, other_load, oversubscribed
from .forward_cost import forward_costs
from .methods import BenchContext
from .peers import Peers
from .plots import plot_draft_length, plot_speedup
from .report import main_rows, summarize, write_report, write_results
from .runner import BenchConfig, run_suite
from .suites import Question


@dataclass
class BenchOutput:
    summary: dict
    results: pathlib.Path
    report: pathlib.Path
    plots: list[pathlib.Path]


def machine_setup(ctx: BenchContext, cfg: BenchConfig, suite: str, questions: list[Question]) -> dict:
    """Everything a reader needs to judge the numbers: machine, versions, dtype, settings (the shared header of
    `report_kit.environment`, with the command line kept last)."""
    env = environment(torch.get_num_threads())
    return {
        "machine": env["machine"],
        "torch threads": env["torch threads"],
        "versions": env["versions"],
        "target model": f"{ctx.target.name} ({sum(p.numel() for p in ctx.target.model.parameters()) / 1e6:.0f}M "
        f"parameters, {ctx.target.path})",
        "draft model": f"{ctx.draft.name} ({ctx.draft.path}), {dtype_name(ctx.draft.model)} for hf-assisted and draft-model"
        if ctx.draft
        else "none",
        "dtype": dtype_name(ctx.target.model) + " (target, all methods)",
        "suite": f"{suite}: {len(questions)} questions, {sum(len(q.turns) for q in questions)} turns, categories "
        + ", ".join(dict.fromkeys(q.category for q in questions)),
        "decoding": f"greedy, max_new_tokens {cfg.max_new_tokens}, eos ids {list(ctx.target.eos_token_ids)}",
        "reference": "HF `generate` greedy (untimed run per turn); later turns carry its answers",
        "timing": f"{'warm-up of every method, ' if cfg.warmup else 'no warm-up, '}{cfg.repeats} repeat(s), "
        "method order rotated per turn and repeat, median per turn",
        "leapdecode drafters": f"adaptive k starting at {cfg.draft_length}, at most {cfg.max_draft_length}; ngram "
        "store fresh per repeat (learns across the suite, never from its own earlier repeat)",
        "draft-length sweep": f"k in {sorted(set(cfg.draft_lengths))} for oracle"
        + "".join(f", {m}" for m in cfg.sweep)
        + " (adaptive off)",
        "prefix cache": "leapdecode methods: one per method and repeat, so a question's later turns reuse its "
        "earlier turns' keys/values (as OpenVINO GenAI's pipelines do); hf-* methods: none",
        "hf-prompt-lookup": f"prompt_lookup_num_tokens={cfg.hf_prompt_lookup_tokens}",
        "draft head": _head_source(ctx) if "head" in cfg.methods else "not measured",
        "linear kernels": (
            "chosen per layer shape and row count by calibration on this host for leapdecode methods "
            "(see 'kernels chosen'), HF's F.linear for hf-* methods"
            if cfg.packed_weights
            else "HF's F.linear for all methods (--hf-kernels)"
        ),
        "decoder forward": (
            "leapdecode's fused decoder (kernels.fused_decoder) for leapdecode methods where the model is supported, "
            "HF's forward otherwise and for hf-* methods"
            if cfg.packed_weights
            else "HF's forward for all methods (--hf-kernels)"
        ),
        "command": env["command"],
    }


def _head_source(ctx: BenchContext) -> str:
    head = attached_head(ctx.target, ctx.head or ctx.target.name)
    summary = head.meta.get("summary", {})
    return (
        f"{ctx.head or 'shipped head of ' + ctx.target.name}: {head.size() / 1e6:.1f}M weights in {head.precision} "
        f"(the fastest here{', one native call a step' if head.native_step else ''}), {len(head.vocab_ids)} output "
        f"tokens, trained on {summary.get('answer_tokens', '?')} answer "
        "tokens of the project's own prompts (none from the suites)"
    )


def run_benchmark(
    target,
    questions: list[Question],
    cfg: BenchConfig,
    out: str | pathlib.Path,
    *,
    draft=None,
    suite: str = "",
    progress: bool = True,
    console=None,
) -> BenchOutput:
    """Measure `questions` with every method of `cfg` on the loaded `target` (and `draft`), write DIR/results.json,
    DIR/report.md, DIR/speedup.png and DIR/draft_length.png; return the summary and the paths."""
    out = pathlib.Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise LeapDecodeError(f"cannot create output directory {out}: {e.strerror or e}") from None
    peers = Peers().start(cfg.methods, target, torch.get_num_threads(), console)  # converts the model once
    ctx = BenchContext(target=target, draft=draft, packed_weights=cfg.packed_weights, head=cfg.head, peers=peers)
    setup = machine_setup(ctx, cfg, suite, questions)
    from transformers.utils import logging as tlog

    load_start = other_load()
    level = tlog.get_verbosity()
    tlog.set_verbosity_error()  # HF generate warns about flags it ignores; nothing a reader needs
    try:
        with torch.inference_mode():
            run = run_suite(ctx, questions, cfg, progress=progress, console=console)
        first = run["references"][0]
        context = encode_prompt(target.tokenizer, [{"role": "user", "content": questions[0].turns[0]}])
        run["forward_cost"] = forward_costs(target.model, context + first["token_ids"])
        run["forward_cost_context"] = len(context) + len(first["token_ids"])
    finally:
        tlog.set_verbosity(level)
        peers.close()
    setup.update({f"peer {method}": text for method, text in peers.describe().items()})
    summary = summarize(run)
    if cfg.packed_weights:
        from ...kernels import describe_kernels, kernel_table

        setup["kernels chosen"] = "; ".join(describe_kernels(target.model))
        run["kernels"] = kernel_table(target.model)
    loads = (load_start, other_load())
    setup["other processes' running tasks"] = f"{loads[0]} at start, {loads[1]} at end on {os.cpu_count()} CPUs" + (
        ": a busy machine, timings are noisy" if any(oversubscribed(x, torch.get_num_threads()) for x in loads) else ""
    )
    meta = {
        "model": target.name,
        "timestamp": datetime.datetime.now().isoformat(timespec="seconds"),
        "setup": setup,
        "config": asdict(cfg),
        "settings": {
            "suite": suite,
            "questions": len(questions),
            "turns": sum(len(q.turns) for q in questions),
            "repeats": cfg.repeats,
        },
    }
    plots = [
        p for p in (plot_speedup(out, summary, main_rows(run, summary)), plot_draft_length(out, run, summary)) if p
    ]
    results = write_results(out, meta, [q.as_dict() for q in questions], run, summary)
    report = write_report(out, meta, run, summary, plots)
    return BenchOutput(summary, results, report, [out / p for p in plots])
