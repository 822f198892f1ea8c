"""OpenVINO GenAI in a process of its own, for the bench's peer methods (run as a script: `python peer_worker.py`).

It imports openvino_genai and the standard library only (not torch, not leapdecode), so its peak RSS is the peer's own.
Protocol: one JSON object per line on stdin, one JSON answer per line on the original stdout (the libraries' own
prints go to stderr). Every answer carries `peak_rss_mb` (this process's peak RSS) or `error` (one line).

    {"op": "load", "ir": DIR, "kind": "llm" | "cb", "threads": N, "prompt_lookup": bool, "kv_cache": "f32" | null,
     "precision": "f32" | null (null: OpenVINO's default on this CPU),
     "scheduler": {"cache_size": GB, "max_num_batched_tokens": N, "max_num_seqs": N, "dynamic_split_fuse": bool}}
    {"op": "generate", "ids": [...], "text": TEMPLATED_PROMPT, "max_new_tokens": N, "stop_ids": [...],
     "num_assistant_tokens": K, "max_ngram_size": N}          -> tokens, wall, ttft, tokenizer_ids_match
    {"op": "batch", "prompts": [[...]], "warmup": [[...]], "concurrency": C, "max_new_tokens": N, "stop_ids": [...]}
                                                               -> tokens, sent, first, end (s from start), wall
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time

STATE: dict = {}


def _properties(req: dict) -> dict:
    props = {"INFERENCE_NUM_THREADS": int(req["threads"])}
    for key, field in (("INFERENCE_PRECISION_HINT", "precision"), ("KV_CACHE_PRECISION", "kv_cache")):
        if req.get(field, "f32"):  # None: OpenVINO's own choice on this CPU
            props[key] = req.get(field, "f32")
    return props


def load(req: dict) -> dict:
    import openvino as ov
    import openvino_genai as ov_genai

    core = ov.Core()
    defaults = {p: str(core.get_property("CPU", p)) for p in ("INFERENCE_PRECISION_HINT", "KV_CACHE_PRECISION")}
    props = _properties(req)
    start = time.perf_counter()
    if req["kind"] == "cb":
        sched = ov_genai.SchedulerConfig()
        for key, value in req["scheduler"].items():
            setattr(sched, key, value)
        STATE["pipe"] = ov_genai.ContinuousBatchingPipeline(req["ir"], sched, "CPU", props)
    else:
        if req.get("prompt_lookup"):
            props["prompt_lookup"] = True
        STATE["pipe"] = ov_genai.LLMPipeline(req["ir"], "CPU", **props)
    return {
        "load_s": time.perf_counter() - start,
        "openvino": ov.__version__,
        "openvino_genai": ov_genai.__version__,
        "cpu_defaults": defaults,
        "properties": defaults | {k: str(v) for k, v in props.items()},
    }


def _config(req: dict):
    import openvino_genai as ov_genai

    config = ov_genai.GenerationConfig()
    config.max_new_tokens = int(req["max_new_tokens"])
    config.do_sample = False
    config.stop_token_ids = set(req["stop_ids"])
    config.eos_token_id = int(req["stop_ids"][0])
    if req.get("num_assistant_tokens"):
        config.num_assistant_tokens = int(req["num_assistant_tokens"])
        config.max_ngram_size = int(req["max_ngram_size"])
    return config


def _tensor(ids: list[int]):
    import numpy as np
    import openvino as ov

    return ov.Tensor(np.asarray([ids], dtype=np.int64))


def generate(req: dict) -> dict:
    import numpy as np
    import openvino_genai as ov_genai

    pipe, config, ids = STATE["pipe"], _config(req), req["ids"]
    match = None
    if req.get("text") is not None:  # does OpenVINO's own tokenizer read the templated prompt as our ids? (untimed)
        encoded = pipe.get_tokenizer().encode(req["text"], add_special_tokens=False)
        match = encoded.input_ids.data.reshape(-1).tolist() == ids
    inputs = ov_genai.TokenizedInputs(_tensor(ids), _tensor([1] * len(ids)))
    start = time.perf_counter()
    result = pipe.generate(inputs, config)
    wall = time.perf_counter() - start
    ttft_ms = result.perf_metrics.get_ttft().mean
    tokens = [int(t) for t in np.asarray(result.tokens[0]).reshape(-1)]
    return {
        "tokens": tokens,
        "wall": wall,
        "ttft": ttft_ms / 1000 if ttft_ms > 0 else wall,
        "tokenizer_ids_match": match,
    }


def batch(req: dict) -> dict:
    """A closed loop as bench-batch runs the engine: at most `concurrency` requests in flight, a new one added when
    one finishes; `warmup` prompts are served first, untimed."""
    import openvino_genai as ov_genai

    pipe, config, c = STATE["pipe"], _config(req), int(req["concurrency"])
    if req.get("warmup"):
        pipe.generate([_tensor(ids) for ids in req["warmup"][:c]], [config] * min(c, len(req["warmup"])))
    prompts = req["prompts"]
    n = len(prompts)
    sent, first, end = [0.0] * n, [None] * n, [0.0] * n
    tokens: list[list[int]] = [[] for _ in range(n)]
    handles: dict[int, object] = {}
    pending = list(range(n))[::-1]
    running = ov_genai.GenerationStatus.RUNNING
    start = time.perf_counter()
    while pending or handles:
        while pending and len(handles) < c:
            i = pending.pop()
            sent[i] = time.perf_counter() - start
            handles[i] = pipe.add_request(i, _tensor(prompts[i]), config)
        pipe.step()
        now = time.perf_counter() - start
        for i, handle in list(handles.items()):
            if handle.can_read():
                for out in handle.read().values():
                    tokens[i] += [int(t) for t in out.generated_ids]
                if tokens[i] and first[i] is None:
                    first[i] = now
            if handle.get_status() != running and not handle.can_read():
                end[i] = now
                del handles[i]
    return {"tokens": tokens, "sent": sent, "first": first, "end": end, "wall": time.perf_counter() - start}


OPS = {"load": load, "generate": generate, "batch": batch}


def peak_rss_mb() -> float:
    """This process's peak RSS in MiB: VmHWM, the high-water mark of its own memory map. Not ru_maxrss: Linux carries
    the parent's peak across fork and exec into it, so a worker started by a 2 GB bench would read at least 2 GB."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    channel = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # anything the libraries print (Python or C++) goes to stderr, never into the protocol
    sys.stdout = sys.stderr
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            req = json.loads(line)
            answer = OPS[req["op"]](req)
        except Exception as error:  # noqa: BLE001 - reported to the parent as one line
            text = str(error).strip().splitlines()
            answer = {"error": f"{type(error).__name__}: {text[0] if text else ''}"}
        answer["peak_rss_mb"] = peak_rss_mb()
        channel.write(json.dumps(answer) + "\n")
        channel.flush()


if __name__ == "__main__":
    main()
