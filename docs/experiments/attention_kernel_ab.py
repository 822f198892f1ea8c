"""The segment attention kernel of one git revision against the working tree's, in the Engine: SmolLM2-135M fp32,
2 threads, no drafting. Each arm runs in a process of its own (the kernel is compiled once per source), the arms in
turns, `--rounds` times:

- decode steps: S sequences of L random prompt tokens are read, then `--steps` steps of S decode rows are timed
  (median step), for each `--shape S:L`;
- a prompt of 500 tokens read by a Runner (median of 5).

(docs/cpu-kernels.md, "Attention in groups of (row, head) pairs".)

    python docs/experiments/attention_kernel_ab.py --before HEAD~1 [--rounds 3] [--shape 16:600 --shape 4:1000]
"""

import argparse
import pathlib
import subprocess
import sys

SOURCE = pathlib.Path(__file__).resolve().parents[2] / "src/leapdecode/kernels/csrc/segment_attention.c"

ARM = r"""
import random, statistics, sys, time, torch
torch.set_num_threads(2)
import leapdecode
from leapdecode import Engine
from leapdecode.runner import Runner
steps = int(sys.argv[1])
random.seed(1)
for shape in sys.argv[2:]:
    S, L = map(int, shape.split(":"))
    engine = Engine("smollm2-135m", drafter="none", max_batch_tokens=512)
    for _ in range(S):
        engine.add_request([random.randrange(1000, 40000) for _ in range(L)], max_new_tokens=steps + 60, ignore_eos=True)
    for _ in range(S * L // 400 + 12):  # every prompt read, every sequence decoding
        engine.step()
    times = []
    for _ in range(steps):
        start = time.perf_counter(); engine.step(); times.append(time.perf_counter() - start)
    print(f"decode step, {S} x {L} tokens: {statistics.median(times) * 1e3:.2f} ms")
model = leapdecode.load_model("smollm2-135m").model
prompt = [random.randrange(1000, 40000) for _ in range(500)]
times = []
for _ in range(5):
    runner = Runner(model, packed_weights=True)
    start = time.perf_counter(); runner.prefill(prompt); times.append(time.perf_counter() - start)
print(f"prompt of 500 tokens: {statistics.median(times) * 1e3:.0f} ms")
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="git revision of the kernel to compare against")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--shape", action="append", help="S:L (default 16:600, 4:1000, 1:1500)")
    args = parser.parse_args()
    after = SOURCE.read_text()
    before = subprocess.run(
        ["git", "show", f"{args.before}:src/leapdecode/kernels/csrc/segment_attention.c"],
        capture_output=True,
        text=True,
        check=True,
        cwd=SOURCE.parent,
    ).stdout
    shapes = args.shape or ["16:600", "4:1000", "1:1500"]
    try:
        for round_ in range(1, args.rounds + 1):
            for name, text in (("before", before), ("after", after)):
                SOURCE.write_text(text)
                run = subprocess.run(
                    [sys.executable, "-c", ARM, str(args.steps), *shapes], capture_output=True, text=True
                )
                for line in run.stdout.splitlines():
                    print(f"round {round_} {name:6s} {line}", flush=True)
    finally:
        SOURCE.write_text(after)


if __name__ == "__main__":
    main()
