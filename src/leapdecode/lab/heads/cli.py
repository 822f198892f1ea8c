"""`leapdecode heads train`: generate the target's answers to the training prompts, then fit a draft head on them.

`register(subparsers)` adds the `heads` command to the main CLI.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

from ...errors import require
from .train import HeadTrainConfig

HEAD_DEFAULTS = HeadTrainConfig()


def cmd_train(args: argparse.Namespace) -> int:
    import torch
    from tqdm import tqdm

    from ...heads.model import load_head
    from ...models import load_model
    from .data import ROUNDS, build_dataset, load_dataset
    from .train import features, train_head

    require(args.threads > 0, f"--threads must be positive, got {args.threads}")
    torch.set_num_threads(args.threads)
    cfg = HeadTrainConfig(
        vocab=args.vocab,
        intermediate=args.intermediate,
        depth=args.depth,
        epochs=args.epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        seed=args.seed,
    )
    require(
        cfg.vocab > 0 and cfg.depth > 0 and cfg.epochs > 0 and cfg.batch_size > 0 and cfg.lr > 0,
        "--vocab, --depth, --epochs, --batch-size and --lr must be positive",
    )
    rounds = tuple(r.strip() for r in args.rounds.split(","))
    require(set(rounds) <= set(ROUNDS), f"--rounds takes {' and '.join(ROUNDS)}, got {args.rounds}")
    require(("categories" in rounds) == bool(args.writer), "--writer goes with --rounds categories, and it needs one")
    require(args.per_category > 0, f"--per-category must be positive, got {args.per_category}")
    init = load_head(args.init) if args.init else None
    target = load_model(args.model)
    out = pathlib.Path(args.out)
    data_path = pathlib.Path(args.data) if args.data else out / "data.jsonl"
    start = time.time()
    if data_path.exists():
        records = load_dataset(data_path)
    else:
        with tqdm(desc="answers", unit="prompt") as bar:
            records = build_dataset(
                target.model,
                target.tokenizer,
                data_path,
                args.max_new_tokens,
                seed=args.seed,
                limit=args.limit,
                progress=bar.update,
                rounds=rounds,
                writer=load_model(args.writer) if args.writer else None,
                per_category=args.per_category,
            )
    data_seconds = time.time() - start
    require(len(records) >= 2, f"{data_path} holds {len(records)} answers: a head needs at least two")
    with tqdm(total=len(records), desc="features", unit="answer") as bar:
        feats = features(target.model, records, progress=bar.update)
    head, summary = train_head(
        target.model, records, cfg, target.name, target.eos_token_ids, log=tqdm.write, feats=feats, init=init
    )
    summary.update(
        answers=len(records),
        answer_tokens=sum(len(r["answer_ids"]) for r in records),
        data_seconds=round(data_seconds, 1),
        total_seconds=round(time.time() - start, 1),
        command=" ".join(["leapdecode", *sys.argv[1:]]),
    )
    head.save(out, {"summary": summary})
    print(
        f"head saved to {out}: held-out top-1 per step {summary['val']['top1_per_step']}, "
        f"mean accepted of a {cfg.depth}-token chain {summary['val']['mean_accepted']}"
    )
    return 0


def register(sub) -> None:
    p = sub.add_parser("heads", help="train draft heads (drafter 'head')")
    hsub = p.add_subparsers(dest="heads_command", required=True)
    t = hsub.add_parser("train", help="self-distil a draft head from the target's greedy answers")
    t.add_argument("--model", default="smollm2-135m")
    t.add_argument("--out", required=True, help="directory for head.safetensors, head.json (and data.jsonl)")
    t.add_argument("--data", help="answers from an earlier run (JSONL); generated into OUT/data.jsonl if missing")
    t.add_argument("--limit", type=int, help="use only this many first-round prompts (a quick run)")
    t.add_argument(
        "--rounds",
        default="self",
        help="data rounds, comma-separated: self (questions the target writes itself and templates), categories "
        "(requests in the 13 Spec-Bench categories written by --writer)",
    )
    t.add_argument("--writer", help="a stronger model that writes the categories round's requests")
    t.add_argument("--per-category", type=int, default=40, help="requests per category in the categories round")
    t.add_argument("--init", help="continue training from this head (a directory or a shipped head's target name)")
    t.add_argument("--max-new-tokens", type=int, default=128)
    t.add_argument("--vocab", type=int, default=HEAD_DEFAULTS.vocab)
    t.add_argument("--intermediate", type=int, default=HEAD_DEFAULTS.intermediate)
    t.add_argument("--depth", type=int, default=HEAD_DEFAULTS.depth)
    t.add_argument("--epochs", type=int, default=HEAD_DEFAULTS.epochs)
    t.add_argument("--batch-size", type=int, default=HEAD_DEFAULTS.batch_size)
    t.add_argument("--lr", type=float, default=HEAD_DEFAULTS.lr)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--threads", type=int, default=2)
    t.set_defaults(func=cmd_train)
