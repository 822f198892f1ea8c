"""The native linear and elementwise kernels against the kernels they replace, in one process: SmolLM2-135M fp32,
greedy, 2 threads. Three arms, interleaved:

- before: oneDNN's pre-packed linear kernels and torch's elementwise operations (what "auto" chose on the AVX-512
  host before the native path existed);
- native linear: the panel kernel for every linear layer, torch's elementwise operations;
- native linear + ops: the panel kernel and the native RMSNorm / rotary / SiLU operations (today's default where
  calibration picks the panel kernel).

Measured: one forward of 1 and of 5 tokens over a warm cache after a chat prompt (median of 7 rounds of 20), and the
Engine's closed loop at 16 requests in flight over 32 held-out first turns, 64 new tokens (tok/s, median of the
repeats). (docs/cpu-kernels.md, "Linear layers and elementwise steps in C".)

    python docs/experiments/native_kernels_ab.py [--repeats 2] [--concurrency 16]
"""

import argparse
import statistics
import time

import torch

from leapdecode import kernels
from leapdecode.lab.bench.batch import run_engine
from leapdecode.lab.bench.suites import load_suite
from leapdecode.lab.report_kit import environment
from leapdecode.models import resolve_model
from leapdecode.prompt import encode_prompt
from leapdecode.runner import Runner

ARMS = {
    "before": dict(linear="packed", elementwise="torch"),
    "native linear": dict(linear="native", elementwise="torch"),
    "native linear + ops": dict(linear="native", elementwise="native"),
}

parser = argparse.ArgumentParser()
parser.add_argument("--repeats", type=int, default=2)
parser.add_argument("--concurrency", type=int, default=16)
args = parser.parse_args()
torch.set_num_threads(2)
for key, value in environment(2).items():
    print(f"{key}: {value}")
target = resolve_model("smollm2-135m")
chat = [{"role": "user", "content": "Write a short story about a robot who learns to paint, in about 200 words."}]
ids = encode_prompt(target.tokenizer, chat)
forward_ms: dict = {}
for _ in range(7):
    for arm, setting in ARMS.items():
        with kernels.configured(**setting):
            runner = Runner(target.model)
            runner.argmax_only = True
            runner.prefill(ids)
            for n in (1, 5):
                for i in range(23):
                    if i == 3:  # three warm-up forwards
                        start = time.perf_counter()
                    runner.forward([1] * n)
                    runner.rollback(n)
                forward_ms.setdefault((arm, n), []).append((time.perf_counter() - start) / 20 * 1000)
for arm in ARMS:
    print(
        f"{arm:>20}: forward of 1 token {statistics.median(forward_ms[arm, 1]):.1f} ms, "
        f"of 5 tokens {statistics.median(forward_ms[arm, 5]):.1f} ms"
    )

questions = load_suite("heldout", None, None)
prompts = [encode_prompt(target.tokenizer, questions[i % len(questions)].turns[0]) for i in range(32)]
warmup = [encode_prompt(target.tokenizer, questions[(32 + i) % len(questions)].turns[0]) for i in range(16)]
rates: dict = {}
for r in range(args.repeats):
    arms = list(ARMS)[r % len(ARMS) :] + list(ARMS)[: r % len(ARMS)]  # the order rotates per repeat
    for arm in arms:
        with kernels.configured(**ARMS[arm]):
            out = run_engine(target, prompts, args.concurrency, 64, warmup=warmup)
        rates.setdefault(arm, []).append(out["output_tok_s"])
for arm in ARMS:
    values = ", ".join(f"{v:.1f}" for v in rates[arm])
    print(f"{arm:>20}: engine at {args.concurrency} in flight {statistics.median(rates[arm]):.1f} tok/s ({values})")
