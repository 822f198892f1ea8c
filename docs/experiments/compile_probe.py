"""Would a compiled core make leapdecode's forward faster on this CPU? One-row decode steps of a packaged model:

- leapdecode's forward as it runs today (fused decoder, calibrated linear kernels), eager;
- the same forward with its per-layer projections, norms and rotary compiled by torch.compile (Inductor's CPU
  backend), attention left to leapdecode (what keeps verification of many rows and KV rollback ours);
- HF's own forward over its StaticCache, eager and compiled whole (`fullgraph=True`), as gpt-fast and HF's docs do
  on GPUs.

It prints ms per step (the median of ROUNDS rounds of `--steps` steps each, the paths interleaved), the first step's
time (which compiles, where compiled), and each path's largest logit difference from leapdecode's eager step. Results and the decision: docs/cpu-kernels.md,
"A compiled core". Run alone on the machine: `.venv/bin/python docs/experiments/compile_probe.py --threads 2`.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import time

import torch
from transformers import StaticCache

from leapdecode.forward import prepare_model
from leapdecode.kernels import packed_kernels
from leapdecode.kv.slots import FlatBatch, Segment, SequenceKV
from leapdecode.lab.report_kit import environment, meta_lines
from leapdecode.models import load_model

ROUNDS = 5  # timed rounds per path, interleaved
PROMPT = 60  # tokens in the KV cache before the steps; each step then adds one (the same token, for every path)


@contextlib.contextmanager
def plain_linears(*modules: torch.nn.Module):
    """Undo leapdecode's per-call kernel dispatch (kernels.packed reads a context variable, which torch.compile
    cannot trace) for the duration: the layers' own nn.Linear forwards, for Inductor to compile and pack."""
    patched = [m for root in modules for m in root.modules() if "_leapdecode_linear" in m.__dict__]
    dispatch = [m.forward for m in patched]
    for m in patched:
        m.forward = m._leapdecode_linear
    try:
        yield
    finally:
        for m, forward in zip(patched, dispatch):
            m.forward = forward


def ours(model, compiled: bool):
    """(step, context to run it in, compile seconds): a one-row step of leapdecode's forward over its own KV slot."""
    decoder = prepare_model(model, True)
    kv = SequenceKV(len(model.model.layers))
    eager_layer = decoder.layer
    if compiled:  # one compiled function per layer and half (a layer's index is a constant inside)
        parts = [
            (
                torch.compile(functools.partial(decoder.attention_inputs, i), dynamic=True),
                torch.compile(functools.partial(decoder.after_attention, i), dynamic=True),
            )
            for i in range(len(model.model.layers))
        ]
        scaling = [layer.self_attn.scaling for layer in model.model.layers]

        def compiled_layer(i, x, cos, sin, attend):
            q, k, v = parts[i][0](x, cos, sin)
            return parts[i][1](x, attend(i, q, k, v, scaling[i]))

    @contextlib.contextmanager
    def context():
        decoder.layer = compiled_layer if compiled else eager_layer
        with plain_linears(model, decoder) if compiled else contextlib.nullcontext(), torch.inference_mode():
            with packed_kernels(True):  # compiled: the layers' own forwards (plain_linears); Inductor packs them
                yield
        del decoder.layer  # the class's eager layer again

    def forward(ids: torch.Tensor, start: int) -> torch.Tensor:
        layout = FlatBatch([Segment(kv, 0, len(ids), start)])
        return decoder(ids, torch.arange(start, start + len(ids)), layout.attend, slice(-1, None))[0]

    token = torch.tensor([200])
    start = time.perf_counter()
    with context():  # the prompt, then a first step: this compiles, where compiled
        forward(torch.arange(100, 100 + PROMPT), 0)
        forward(token, kv.length)
    return lambda: forward(token, kv.length), context, time.perf_counter() - start


def hf_static(model, compiled: bool, steps: int):
    """(step, context, compile seconds): a one-row step of HF's forward over its StaticCache, eager or compiled."""
    cache = StaticCache(config=model.config, max_cache_len=PROMPT + 1 + ROUNDS * (steps + 3))
    forward = torch.compile(model.forward, fullgraph=True) if compiled else model.forward
    token, position = torch.tensor([[200]]), [PROMPT]

    def step():  # the same token again, at the next position (a StaticCache counts what it was given)
        at = torch.tensor(position)
        position[0] += 1
        return forward(input_ids=token, past_key_values=cache, cache_position=at, position_ids=at[None]).logits[0, -1:]

    def context():
        return plain_linears(model) if compiled else torch.inference_mode()

    with context(), torch.inference_mode():
        positions = torch.arange(PROMPT)  # position_ids given explicitly: without them the steps' logits were off
        model(
            torch.arange(100, 100 + PROMPT)[None],
            past_key_values=cache,
            cache_position=positions,
            position_ids=positions[None],
        )
        start = time.perf_counter()
        step()
    return step, context, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    import torch._inductor.config as inductor

    inductor.freezing = True  # weights become constants Inductor may prepack, as it advises for CPU inference
    model = load_model(args.model, "float32").model.eval()
    # each layer's halves share their code, told apart by guards: past the default limit (8) dynamo would quietly run
    # the other layers eagerly
    torch._dynamo.config.recompile_limit = 4 * len(model.model.layers)
    print("\n".join(meta_lines({**environment(args.threads), "model": args.model, "dtype": "float32"})))
    paths = {
        "leapdecode eager (today)": ours(model, False),
        "leapdecode, layers' non-attention parts compiled": ours(model, True),
        "HF StaticCache, eager": hf_static(model, False, args.steps),
        "HF StaticCache, whole forward compiled": hf_static(model, True, args.steps),
    }
    rounds: dict[str, list[float]] = {name: [] for name in paths}
    last = {}
    for _ in range(ROUNDS):  # interleaved, so that a drift of the machine's speed falls on every path alike
        for name, (step, context, _) in paths.items():
            with context(), torch.inference_mode():
                for _ in range(3):
                    step()  # warm again after the other paths ran
                start = time.perf_counter()
                for _ in range(args.steps):
                    last[name] = step()
                rounds[name].append((time.perf_counter() - start) / args.steps * 1e3)
    print(
        f"\n| path | ms per one-row step, median of {ROUNDS} rounds (range) | first call s (compiles, where compiled) |"
    )
    print("|---|---|---:|")
    for name, (_, _, first) in paths.items():
        r = sorted(rounds[name])
        print(f"| {name} | {r[len(r) // 2]:.1f} ({r[0]:.1f}–{r[-1]:.1f}) | {first:.1f} |")
    # every path has now decoded the same tokens at the same positions: their last logits should agree
    reference = last["leapdecode eager (today)"]
    print(
        "largest logit difference from leapdecode eager: "
        + ", ".join(
            f"{name}: {(logits.float() - reference.float()).abs().max().item():.2g}" for name, logits in last.items()
        )
    )


if __name__ == "__main__":
    main()
