"""`leapdecode dllm {train,train-filter,generate,bench}`.

`register(subparsers)` adds the `dllm` command to the main CLI; every subcommand sets `func`, to be called as
`args.func(args)` (returns an exit code).
"""

from __future__ import annotations

import argparse
import sys

from ...errors import LeapDecodeError, require


def _tasks(value: str | None) -> list[str] | None:
    return [t.strip() for t in value.split(",") if t.strip()] if value else None


def _weights(value: str | None) -> dict[str, float]:
    from .train import TASK_WEIGHTS

    if not value:
        return dict(TASK_WEIGHTS)
    try:
        return {k.strip(): float(w) for k, w in (item.split("=") for item in value.split(","))}
    except ValueError:
        raise LeapDecodeError(f"--task-weights must look like 'add=2,fmt=1.5', got {value!r}") from None


def _threads(n: int) -> None:
    import torch

    require(n > 0, f"--threads must be positive, got {n}")
    torch.set_num_threads(n)


def cmd_train(args: argparse.Namespace) -> int:
    from .train import TrainConfig, train

    cfg = TrainConfig(
        out=args.out,
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        hidden_size=args.hidden_size,
        layers=args.layers,
        heads=args.heads,
        seed=args.seed,
        threads=args.threads,
        max_minutes=args.max_minutes,
        tasks=_tasks(args.tasks) or [],
        init_from=args.init_from,
        task_weights=_weights(args.task_weights),
        loss=args.loss,
        eval_per_task=args.eval_per_task,
    )
    train(cfg, command=" ".join(["leapdecode", *sys.argv[1:]]))
    return 0


def _load_lm(path: str | None):
    from ...diffusion.interface import wrap_shipped
    from ...diffusion.model import load_model

    return wrap_shipped(load_model(path))


def cmd_train_filter(args: argparse.Namespace) -> int:
    from ...diffusion.model import CHECKPOINT_DIR
    from .filter_train import train_filter

    _threads(args.threads)
    train_filter(
        _load_lm(args.model),
        args.out or args.model or CHECKPOINT_DIR,
        _tasks(args.tasks),
        per_task=args.per_task,
        seed=args.seed,
        epochs=args.epochs,
    )
    return 0


def cmd_generate(args: argparse.Namespace) -> int:
    from ...diffusion.decoders import make_decoder
    from ...diffusion.loop import diffusion_decode
    from .tasks import CharTokenizer, encode_prompts

    _threads(args.threads)
    require(args.gen_len > 0, f"--gen-len must be positive, got {args.gen_len}")
    require(args.prompt != "", "the prompt is empty")
    require(args.decoder != "egp", "egp is an oracle that needs a reference decode; it runs only in `dllm bench`")
    decoder = make_decoder(
        args.decoder, threshold=args.threshold, steps=args.steps, filter_dir=args.filter or args.model
    )
    lm = _load_lm(args.model)
    tok = CharTokenizer()
    prompts = encode_prompts(tok, [args.prompt])
    res = diffusion_decode(lm, prompts, args.gen_len, decoder, block_len=args.block_len, eotp=args.eotp)
    gen = res.canvas[0, prompts.shape[1] :].tolist()
    print(tok.decode(gen))
    print(
        f"[{decoder.describe()}{' + eotp' if args.eotp else ''}: {int(res.nfe[0])} forward passes for "
        f"{args.gen_len} positions, {1000 * res.seconds:.0f} ms]",
        file=sys.stderr,
    )
    if args.show_steps:
        order = res.committed_step[0, prompts.shape[1] :].tolist()
        for step in range(int(res.nfe[0])):
            shown = [tok.vocab[t] if s <= step else "_" for t, s in zip(gen, order)]
            print(
                f"  step {step + 1:2d}: " + "".join("." if c == "<pad>" else "$" if c == "<eos>" else c for c in shown),
                file=sys.stderr,
            )
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from ...diffusion.decoders import PositionFilter
    from ...diffusion.model import CHECKPOINT_DIR
    from .bench import markdown, run_bench
    from .tasks import resolve_tasks

    _threads(args.threads)
    require(args.per_task > 0, f"--per-task must be positive, got {args.per_task}")
    require(args.gen_len > 0, f"--gen-len must be positive, got {args.gen_len}")
    tasks = resolve_tasks(_tasks(args.tasks))
    filt = None if args.no_learn2pd else PositionFilter.load(args.filter or args.model or CHECKPOINT_DIR)
    report = run_bench(
        _load_lm(args.model),
        args.out,
        filt,
        tasks,
        per_task=args.per_task,
        gen_len=args.gen_len,
        block_len=args.block_len,
        batch_size=args.batch_size,
    )
    print(markdown(report))
    print(f"wrote {args.out}/dllm_bench.json, dllm_bench.md, dllm_bench.png")
    return 0


def register(subparsers) -> argparse.ArgumentParser:
    from ...diffusion.decoders import DECODERS
    from .tasks import GEN_LEN

    dllm = subparsers.add_parser("dllm", help="diffusion LM: train the small model, parallel decoders, benchmark")
    sub = dllm.add_subparsers(dest="dllm_command", required=True)
    model_help = "model directory (default: the checkpoint shipped with leapdecode)"

    from .train import TASK_WEIGHTS, TrainConfig

    d = TrainConfig(out="-")  # the CLI defaults are TrainConfig's: what the shipped checkpoint was trained with
    p = sub.add_parser("train", help="train the small masked-diffusion model on the generated tasks (CPU)")
    p.add_argument("--out", required=True, help="directory to save the model to")
    p.add_argument("--steps", type=int, default=d.steps, help="optimizer steps (the lr schedule spans them)")
    p.add_argument("--batch-size", type=int, default=d.batch_size)
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--hidden-size", type=int, default=d.hidden_size)
    p.add_argument("--layers", type=int, default=d.layers)
    p.add_argument("--heads", type=int, default=d.heads)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--threads", type=int, default=d.threads)
    p.add_argument("--max-minutes", type=float, default=d.max_minutes, help="stop (and save) after this long")
    p.add_argument(
        "--loss",
        choices=["elbo", "tokens"],
        default=d.loss,
        help="elbo: LLaDA's 1/t-weighted loss; tokens: mean CE over masked tokens",
    )
    p.add_argument(
        "--eval-per-task",
        type=int,
        default=d.eval_per_task,
        help="held-out prompts per task for the accuracy check after training (0: skip)",
    )
    p.add_argument("--tasks", help="comma-separated subset of tasks (default: all)")
    p.add_argument(
        "--task-weights",
        help="sampling weights, e.g. 'add=2,fmt=1.5' (others 1; default "
        + ",".join(f"{k}={v:g}" for k, v in TASK_WEIGHTS.items())
        + ")",
    )
    p.add_argument("--init-from", help="continue training this saved model (same tasks and vocabulary)")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("train-filter", help="train the Learn2PD filter on reference-decode traces")
    p.add_argument("--model", help=model_help)
    p.add_argument("--out", help="directory for the filter (default: the model directory)")
    p.add_argument("--per-task", type=int, default=64, help="training-split prompts traced per task")
    p.add_argument("--epochs", type=int, default=40)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--tasks", help="comma-separated subset of tasks (default: all)")
    p.set_defaults(func=cmd_train_filter)

    p = sub.add_parser("generate", help="decode one prompt with a parallel decoder")
    p.add_argument("prompt", help="e.g. 'add 4821+7395', 'sum 12 abc', 'rev 123456'")
    p.add_argument("--model", help=model_help)
    p.add_argument("--decoder", default="learn2pd", choices=None, help=f"one of {', '.join(DECODERS[:-1])}")
    p.add_argument("--threshold", type=float, help="threshold for threshold / credit / learn2pd, in (0, 1]")
    p.add_argument("--steps", type=int, help="fixed_steps: forwards in all (default: gen length)")
    p.add_argument("--gen-len", type=int, default=GEN_LEN)
    p.add_argument("--block-len", type=int, help="semi-autoregressive block length (default: gen length)")
    p.add_argument("--eotp", action="store_true", help="end-of-text prediction: pad everything after a committed <eos>")
    p.add_argument("--filter", help="Learn2PD filter directory (default: the model directory)")
    p.add_argument("--show-steps", action="store_true", help="print the canvas after every forward")
    p.add_argument("--threads", type=int, default=1)
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("bench", help="all decoders on the held-out split: accuracy, NFE, TPF, wall time, AUP")
    p.add_argument("--model", help=model_help)
    p.add_argument("--filter", help="Learn2PD filter directory (default: the model directory)")
    p.add_argument("--no-learn2pd", action="store_true", help="skip Learn2PD (no filter trained yet)")
    p.add_argument("--out", default="bench-out/dllm", help="output directory (JSON, Markdown, PNG)")
    p.add_argument("--per-task", type=int, default=100, help="held-out prompts per task")
    p.add_argument("--tasks", help="comma-separated subset of tasks (default: all)")
    p.add_argument("--gen-len", type=int, default=GEN_LEN)
    p.add_argument("--block-len", type=int, help="semi-autoregressive block length (default: gen length)")
    p.add_argument("--batch-size", type=int, default=100)
    p.add_argument("--threads", type=int, default=1)
    p.set_defaults(func=cmd_bench)
    return dllm
