"""Scoring prompts through HTTP, leapdecode beside vLLM's CPU build: completions with `echo` and `logprobs`, what
lm-evaluation-harness's loglikelihood tasks send (`max_tokens` 1, `logprobs` 1, `temperature` 0).

Each server (leapdecode serve --drafter none, then `vllm serve` from the venv `bench-serve --install-peers` makes) is
started alone on the same model directory and sent the same prompts (the held-out suite's first turns as raw text,
cycled to --requests) by --concurrency closed-loop clients; the figure is prompt tokens scored per second over the
wall time. The two servers' logprobs of the same prompt tokens are compared (both fp32; their kernels round
differently). Run from the repository root:

    .venv/bin/python docs/experiments/score_vs_vllm.py --model-dir smollm2-135m --requests 64 --concurrency 8
"""

from __future__ import annotations

import argparse
import concurrent.futures
import statistics
import time
from types import SimpleNamespace

import httpx

from leapdecode.lab.bench.serve_common import load_prompts
from leapdecode.lab.bench.serve_peers import host, leapdecode_servers, model_directory, start, stop, vllm_server


def score(url: str, model: str, prompts: list[str], concurrency: int) -> tuple[float, list[list]]:
    """(prompt tokens scored per second, each prompt's token logprobs)."""

    def one(prompt):
        body = {"model": model, "prompt": prompt, "max_tokens": 1, "logprobs": 1, "echo": True, "temperature": 0}
        r = httpx.post(url + "/v1/completions", json=body, timeout=600)
        r.raise_for_status()
        answer = r.json()
        return answer["usage"]["prompt_tokens"], answer["choices"][0]["logprobs"]["token_logprobs"]

    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(one, prompts[:concurrency]))  # warm-up, untimed
        start_time = time.perf_counter()
        results = list(pool.map(one, prompts))
        wall = time.perf_counter() - start_time
    return sum(n for n, _ in results) / wall, [lps for n, lps in results]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", default="smollm2-135m")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    model_dir = model_directory(args.model_dir)
    texts = load_prompts("heldout")
    prompts = [texts[i % len(texts)] for i in range(args.requests)]
    options = SimpleNamespace(drafter="none", threads=None, head=None, serve_args=None, install_peers=False)
    servers = leapdecode_servers(model_dir, options) + [vllm_server(model_dir, options)]
    print("host:", host())
    measured = {}
    for server in servers:
        if server.unavailable:
            print(f"{server.label}: not measured ({server.unavailable})")
            continue
        print(f"{server.label}: starting" + (f" ({server.note})" if server.note else ""))
        proc, log = start(server)
        try:
            rate, logprobs = score(f"http://127.0.0.1:{server.port}", server.model, prompts, args.concurrency)
        finally:
            stop(proc, log)
        measured[server.label] = (rate, logprobs)
        print(f"{server.label}: {rate:.1f} prompt tokens scored per second")
    if len(measured) == 2:
        (a, (rate_a, lps_a)), (b, (rate_b, lps_b)) = measured.items()
        gaps = [abs(x - y) for p, q in zip(lps_a, lps_b) for x, y in zip(p, q) if x is not None and y is not None]
        same_length = sum(len(p) == len(q) for p, q in zip(lps_a, lps_b))
        print(f"{a} ÷ {b}: {rate_a / rate_b:.2f}")
        print(
            f"logprobs of {len(gaps)} prompt tokens ({same_length}/{len(prompts)} prompts of equal length): "
            f"mean |difference| {statistics.mean(gaps):.2e}, max {max(gaps):.2e}"
        )


if __name__ == "__main__":
    main()
