"""What one draft token of the quantized-self drafter costs: one decode forward (1 token, 170-token cache) of
SmolLM2-135M in fp32 and in the int8 the draft-model drafter uses, through HF's forward, 2 threads, median of 40.
(docs/benchmarks.md, "Draft levers", reports the result.)

    python docs/experiments/draft_token_cost.py
"""

import time

import torch
from transformers import DynamicCache

from leapdecode.models import resolve_model

torch.set_num_threads(2)
for dtype in ("float32", "int8"):
    model = resolve_model("smollm2-135m", dtype=dtype).model
    ids = torch.randint(100, 20000, (1, 170), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        cache = DynamicCache()
        token = model(ids, past_key_values=cache, use_cache=True).logits[:, -1:].argmax(-1)
        times = []
        for _ in range(40):
            start = time.perf_counter()
            token = model(token, past_key_values=cache, use_cache=True).logits[:, -1:].argmax(-1)
            times.append(time.perf_counter() - start)
    print(f"{dtype}: {1000 * sorted(times)[len(times) // 2]:.1f} ms per token")
