"""Run a suite: warm-up, one untimed greedy reference per turn, then every method variant `repeats` times in an
order that rotates from turn to turn and repeat to repeat (so slow drift on a shared machine hits all methods alike).

Each turn of a multi-turn question is its own measured generation: later turns carry the reference answers of the
earlier ones as assistant messages. Raw measurements go to `records`; medians and tables are `report.py`'s job.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from ...errors import require
from ...prompt import encode_prompt
from .methods import SWEEPABLE, BenchContext, Measurement, Variant, divergence, first_difference, run_hf, run_variant
from .peers import is_peer
from .suites import Question


@dataclass
class BenchConfig:
    methods: list[str]
    max_new_tokens: int = 128
    repeats: int = 3
    draft_lengths: list[int] = field(default_factory=lambda: [4, 8, 16])
    sweep: list[str] = field(default_factory=list)  # methods also run at each fixed draft length (oracle always is)
    warmup: bool = True
    draft_length: int = 4  # leapdecode's initial k for the adaptive (default) variants
    max_draft_length: int = 16
    hf_prompt_lookup_tokens: int = 10
    packed_weights: bool = True  # leapdecode methods run on pre-packed weights (HF methods always use F.linear)
    head: str | None = None  # draft head directory for method 'head' (None: the target's shipped head)

    def __post_init__(self) -> None:
        require(self.max_new_tokens > 0, f"--max-new-tokens must be positive, got {self.max_new_tokens}")
        require(self.repeats > 0, f"--repeats must be positive, got {self.repeats}")
        require(
            self.draft_lengths and all(k > 0 for k in self.draft_lengths),
            f"--draft-lengths must be positive integers, got {self.draft_lengths}",
        )
        for m in self.sweep:
            require(m in SWEEPABLE, f"cannot sweep '{m}' over draft lengths: choose from {', '.join(SWEEPABLE)}")
            require(m in self.methods, f"--sweep lists '{m}', which is not among --methods")


def plan_variants(cfg: BenchConfig) -> list[Variant]:
    """Each method at its default, then the fixed-k variants: the oracle at every draft length (its best one is
    the ceiling), and any method named in `sweep`."""
    variants = [Variant(m) for m in cfg.methods if m != "oracle"]
    swept = [m for m in cfg.methods if m == "oracle" or m in cfg.sweep]
    variants += [Variant(m, k) for m in swept for k in sorted(set(cfg.draft_lengths))]
    return variants


@dataclass
class Turn:
    """One measured generation: question `question_id`, turn `turn` (0-based), its chat messages."""

    question: Question
    turn: int
    messages: list[dict]


def _progress(enabled: bool):
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return Progress(
        TextColumn("[bold]bench[/]"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.description}"),
        disable=not enabled,
    )


def run_suite(
    ctx: BenchContext, questions: list[Question], cfg: BenchConfig, progress: bool = True, console=None
) -> dict:
    """Measure every variant on every turn; return {"variants", "references", "records", "warmup_s"}."""
    variants = plan_variants(cfg)
    ctx = dataclasses.replace(
        ctx,
        max_new_tokens=cfg.max_new_tokens,
        draft_length=cfg.draft_length,
        max_draft_length=cfg.max_draft_length,
        hf_prompt_lookup_tokens=cfg.hf_prompt_lookup_tokens,
    )
    tok = ctx.target.tokenizer
    n_turns = sum(len(q.turns) for q in questions)
    total = (len(variants) + 1 if cfg.warmup else 0) + n_turns * (1 + cfg.repeats * len(variants))
    references: list[dict] = []
    records: list[dict] = []
    warned: set[tuple] = set()
    with _progress(progress) as bar:
        task = bar.add_task("", total=total)

        def step(text: str) -> None:
            bar.update(task, advance=1, description=text)

        if cfg.warmup:
            _warm_up(ctx, questions[0], variants, tok, step)
        index = 0
        for q in questions:
            messages: list[dict] = []
            for t, user in enumerate(q.turns):
                messages = messages + [{"role": "user", "content": user}]
                prompt_ids = encode_prompt(tok, messages)
                require(
                    len(prompt_ids) + cfg.max_new_tokens <= ctx.target.context_length,
                    f"question {q.question_id} turn {t + 1}: {len(prompt_ids)} prompt tokens + "
                    f"{cfg.max_new_tokens} new exceed the context of {ctx.target.name}",
                )
                ref = run_hf(ctx, Variant("hf-generate"), prompt_ids).token_ids
                text = tok.decode(ref, skip_special_tokens=True).strip()
                references.append(
                    {
                        "question_id": q.question_id,
                        "category": q.category,
                        "turn": t,
                        "prompt_tokens": len(prompt_ids),
                        "token_ids": ref,
                        "text": text,
                    }
                )
                step(f"q{q.question_id}.{t + 1} reference")
                for r in range(cfg.repeats):
                    shift = (index + r) % len(variants)
                    for order, v in enumerate(variants[shift:] + variants[:shift]):
                        m = run_variant(ctx, v, prompt_ids, messages, ref, store_key=f"bench-{v.label}-r{r}")
                        rec = _record(q, t, v, r, order, m, ref)
                        if not rec["identical"]:
                            key = (q.question_id, t, v.label)
                            if key not in warned:
                                warned.add(key)
                                rec["divergence"] = divergence(ctx, prompt_ids, ref, m.token_ids)
                                _warn(console or bar.console, rec)
                        records.append(rec)
                        step(f"q{q.question_id}.{t + 1} {v.label} (repeat {r + 1}/{cfg.repeats})")
                index += 1
                messages = messages + [{"role": "assistant", "content": text}]
    return {
        "variants": [dataclasses.asdict(v) | {"label": v.label} for v in variants],
        "references": references,
        "records": records,
    }


def _warm_up(ctx: BenchContext, q: Question, variants: list[Variant], tok, step) -> None:
    """Run every variant once on a short generation (first calls allocate and pick kernels); not recorded."""
    short = dataclasses.replace(ctx, max_new_tokens=min(16, ctx.max_new_tokens))
    messages = [{"role": "user", "content": q.turns[0]}]
    prompt_ids = encode_prompt(tok, messages)
    ref = run_hf(short, Variant("hf-generate"), prompt_ids).token_ids
    step("warm-up reference")
    for v in variants:
        run_variant(short, v, prompt_ids, messages, ref, store_key="bench-warmup")
        step(f"warm-up {v.label}")


def _record(q: Question, turn: int, v: Variant, repeat: int, order: int, m: Measurement, ref: list[int]) -> dict:
    identical = m.token_ids == ref
    rec = {
        "question_id": q.question_id,
        "category": q.category,
        "turn": turn,
        "variant": v.label,
        "method": v.method,
        "draft_length": v.draft_length,
        "repeat": repeat,
        "order": order,
        "new_tokens": len(m.token_ids),
        "wall_time": round(m.wall_time, 6),
        "time_to_first_token": round(m.time_to_first_token, 6),
        "forward_passes": m.forward_passes,
        "identical": identical,
        "peak_rss_mb": None if m.peak_rss_mb is None else round(m.peak_rss_mb, 1),
    }
    if m.engine:
        rec["engine"] = {
            k: m.engine[k]
            for k in ("total_time", "draft_time", "drafted_tokens", "accepted_draft_tokens", "stop_reason")
        }
    if not identical:
        rec["first_difference"] = first_difference(ref, m.token_ids)
        rec["token_ids"] = m.token_ids
    return rec


def _warn(console, rec: dict) -> None:
    d = rec.get("divergence", {})
    console.print(
        ("[yellow]peer differs[/]" if is_peer(rec["method"]) else "[bold red]MISMATCH[/]")
        + f" {rec['variant']} on question {rec['question_id']} turn {rec['turn'] + 1}: "
        f"differs from greedy at token {d.get('position')} (target top-2 margin {d.get('top2_margin')})"
    )
