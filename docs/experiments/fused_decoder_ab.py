"""The fused decoder forward against the model's own HF forward, both on the calibrated linear kernels: SmolLM2-135M
fp32, greedy (argmax-only head), 2 threads, a warm cache after a chat prompt; 1 and 4 tokens per forward, the two
arms interleaved for 5 rounds of 20 forwards, best round. (docs/cpu-kernels.md, "A fused decoder forward".)

    python docs/experiments/fused_decoder_ab.py
"""

import time

import torch

from leapdecode import kernels
from leapdecode.prompt import encode_prompt
from leapdecode.models import resolve_model
from leapdecode.runner import Runner

torch.set_num_threads(2)
target = resolve_model("smollm2-135m")
prompt = [{"role": "user", "content": "Write a short story about a robot who learns to paint, in about 200 words."}]
ids = encode_prompt(target.tokenizer, prompt)
runners = {}
for decoder in ("hf", "fused"):
    with kernels.configured(decoder=decoder):
        runners[decoder] = Runner(target.model)
    runners[decoder].argmax_only = True
    runners[decoder].prefill(ids)
best: dict = {}
for _ in range(5):
    for decoder, runner in runners.items():
        for n in (1, 4):
            for i in range(23):
                if i == 3:  # three warm-up forwards
                    start = time.perf_counter()
                runner.forward([1] * n)
                runner.rollback(n)
            ms = (time.perf_counter() - start) / 20 * 1000
            best[decoder, n] = min(best.get((decoder, n), ms), ms)
for n in (1, 4):
    print(f"{n} token(s): HF forward {best['hf', n]:.1f} ms, fused {best['fused', n]:.1f} ms")
