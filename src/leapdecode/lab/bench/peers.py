"""Peers in our own benchmarks: OpenVINO GenAI, the CPU runtime our users would pick instead, measured on the same
prompt token ids, max new tokens, threads and greedy decoding as leapdecode's methods, its outputs compared with the
same HF greedy reference.

- `bench --methods ...,openvino,openvino-prompt-lookup`: `LLMPipeline`, plain and with prompt lookup
  (num_assistant_tokens 4, max_ngram_size 4), one process per method kept for the whole suite.
- `bench-batch --methods ...,openvino-cb`: `ContinuousBatchingPipeline` in the same closed loop as the engine, one
  process per run.

OpenVINO runs in a worker process (`peer_worker.py`, no torch in it): its peak RSS is its own, and its thread pool
never shares a process with torch's. The IR comes from `peer_export.py` (once, cached). Inference precision is f32
(INFERENCE_PRECISION_HINT) and so is the KV cache (KV_CACHE_PRECISION) unless `kv_cache` says otherwise; beside a
q4 target the IR has int4 weights and OpenVINO picks its inference and KV cache precisions (`peer_precision`; its
bf16 paged attention takes only a bf16 KV cache). The report states weights and precisions and OpenVINO's own
defaults on the host. Optional: `pip install 'leapdecode[peers]'`.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field

from ...errors import LeapDecodeError
from .peer_export import INSTALL_HINT, OPTIMUM_INTEL, ensure_ir, openvino_version, peer_precision

PEER_METHODS = ("openvino", "openvino-prompt-lookup")  # bench (one stream)
BATCH_PEER_METHODS = ("openvino-cb",)  # bench-batch
PROMPT_LOOKUP = {"num_assistant_tokens": 4, "max_ngram_size": 4}
CB_CACHE_GB = 2  # the KV cache ContinuousBatchingPipeline allocates (SchedulerConfig.cache_size)
WORKER = pathlib.Path(__file__).with_name("peer_worker.py")


def is_peer(method: str) -> bool:
    return method in PEER_METHODS or method in BATCH_PEER_METHODS


def check_available() -> str:
    """OpenVINO's version; a one-line LeapDecodeError naming the extra to install when OpenVINO GenAI is absent."""
    import importlib.util

    if importlib.util.find_spec("openvino_genai") is None:
        raise LeapDecodeError(f"the OpenVINO peer methods need OpenVINO GenAI: {INSTALL_HINT}")
    return openvino_version()


class PeerWorker:
    """One OpenVINO GenAI pipeline in its own process; `call(op, **fields)` sends a request and returns the answer."""

    def __init__(self, command: list[str] | None = None):
        self.log = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            command or [sys.executable, str(WORKER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            bufsize=1,
        )
        self.peak_rss_mb: float | None = None

    def call(self, op: str, **fields) -> dict:
        try:
            self.proc.stdin.write(json.dumps({"op": op, **fields}) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        except (BrokenPipeError, OSError):
            line = ""
        if not line:
            raise LeapDecodeError(f"the OpenVINO worker exited during '{op}': {self._stderr_tail()}")
        answer = json.loads(line)
        if "error" in answer:
            raise LeapDecodeError(f"OpenVINO GenAI failed during '{op}': {answer['error']}")
        self.peak_rss_mb = answer.get("peak_rss_mb", self.peak_rss_mb)
        return answer

    def private_mb(self) -> float | None:
        """The worker's own resident memory now (Linux's RssAnon), or its peak RSS where that cannot be read."""
        from ...host import proc_bytes

        own = proc_bytes(f"/proc/{self.proc.pid}/status", "RssAnon")
        return self.peak_rss_mb if own is None else own / 2**20

    def _stderr_tail(self) -> str:
        self.log.seek(0)
        lines = [x.strip() for x in self.log.read().splitlines() if x.strip()]
        return lines[-1] if lines else f"exit status {self.proc.poll()}"

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        self.log.close()


@dataclass
class Peers:
    """The peer workers of one `bench` run, started before the suite (conversion included), closed after it.

    The suite runs every method on each prompt in turn, so each peer keeps its pipeline loaded: the first at start
    (a failing load stops the run before the suite), the others at their first call, when the target's methods have
    made their kernels. Where the memory left then would not hold another worker as large as a loaded one (a 1.5B
    model in fp32: ~6 GB a pipeline beside the target's ~11), the peers are loaded one at a time instead: a call for
    another peer closes the loaded one, loads its own and first repeats the run's first (warm-up) call untimed, so a
    reloaded pipeline is measured warm. The report says so."""

    ir: pathlib.Path | None = None
    threads: int = 1
    kv_cache: str = "f32"
    weights: str = "fp32"
    command: list[str] | None = None  # the worker's command line (default: peer_worker.py)
    workers: dict[str, PeerWorker] = field(default_factory=dict)
    info: dict[str, dict] = field(default_factory=dict)  # method -> what its load answered
    tokenizer_checks: dict[str, dict[tuple, bool]] = field(default_factory=dict)  # method -> prompt -> same ids
    loads: dict[str, dict] = field(default_factory=dict)  # method -> its load request
    load_count: dict[str, int] = field(default_factory=dict)
    one_at_a_time: bool = False
    _warm_up: dict | None = None  # the run's first generate request, repeated after a reload

    def start(self, methods: list[str], target, threads: int, console=None) -> Peers:
        wanted = [m for m in methods if m in PEER_METHODS]
        if not wanted:
            return self
        check_available()
        self.ir, self.threads = ensure_ir(target, console), threads
        self.weights = peer_precision(target)[0]
        for method in wanted:
            self.loads[method] = {
                "ir": str(self.ir),
                "kind": "llm",
                "threads": threads,
                **_precisions(target, self.kv_cache),
                "prompt_lookup": method == "openvino-prompt-lookup",
            }
        try:
            self._load(wanted[0])  # the others when first called: by then the target's own kernels are made
        except BaseException:
            self.close()
            raise
        return self

    def _load(self, method: str) -> PeerWorker:
        worker = self.workers[method] = PeerWorker(self.command)
        self.info[method] = worker.call("load", **self.loads[method])
        self.load_count[method] = self.load_count.get(method, 0) + 1
        return worker

    def _worker(self, method: str) -> PeerWorker:
        if method in self.workers:
            return self.workers[method]
        if method not in self.loads:
            raise LeapDecodeError(f"peer '{method}' was not started (Peers.start runs before the suite)")
        self.one_at_a_time = self.one_at_a_time or not _room_for_another(self.workers.values())
        if not self.one_at_a_time:
            return self._load(method)
        for other in list(self.workers):  # the loaded one goes first
            self.workers.pop(other).close()
        worker = self._load(method)
        if self._warm_up is not None:
            worker.call("generate", **self._warm_up, **_extra(method))
        return worker

    def generate(self, method: str, prompt_ids: list[int], text: str | None, max_new_tokens: int, eos_ids) -> dict:
        worker = self._worker(method)
        checks = self.tokenizer_checks.setdefault(method, {})
        key = tuple(prompt_ids)
        request = {"ids": prompt_ids, "max_new_tokens": max_new_tokens, "stop_ids": list(eos_ids)}
        if self._warm_up is None:
            self._warm_up = {**request, "text": None}
        answer = worker.call(
            "generate",
            **request,
            text=None if key in checks else text,  # each distinct prompt checked once
            **_extra(method),
        )
        if answer.get("tokenizer_ids_match") is not None:
            checks[key] = bool(answer["tokenizer_ids_match"])
        return answer

    def describe(self) -> dict[str, str]:
        """Report lines: what each peer ran, with which precisions, and whether the prompts matched our ids."""
        out = {}
        for method, info in self.info.items():
            checks = list(self.tokenizer_checks.get(method, {}).values())
            defaults = info["cpu_defaults"]
            out[method] = (
                f"OpenVINO GenAI {info['openvino_genai'].split('-')[0]} (OpenVINO {info['openvino'].split('-')[0]}) "
                f"LLMPipeline{' with prompt_lookup=True, ' + _pl() if 'prompt-lookup' in method else ''}, "
                f"own process; IR {self.ir.name} from {OPTIMUM_INTEL} ({self.weights} weights); "
                f"INFERENCE_NUM_THREADS {info['properties']['INFERENCE_NUM_THREADS']}, inference precision "
                f"{_short(info['properties']['INFERENCE_PRECISION_HINT'])}, KV cache {_short(info['properties']['KV_CACHE_PRECISION'])} "
                f"(OpenVINO's defaults on this CPU: {_short(defaults['INFERENCE_PRECISION_HINT'])} inference, "
                f"{_short(defaults['KV_CACHE_PRECISION'])} KV cache); fed our prompt token ids, and OpenVINO's own "
                f"tokenizer reads the templated prompt as the same ids on {sum(checks)} of {len(checks)} distinct "
                "prompts (warm-up included)"
                + (
                    f"; loaded one peer at a time ({self.load_count[method]} loads: the memory held no second "
                    "pipeline), each reload warmed up untimed"
                    if self.one_at_a_time
                    else ""
                )
            )
        return out

    def close(self) -> None:
        for worker in self.workers.values():
            worker.close()
        self.workers.clear()


def _extra(method: str) -> dict:
    return PROMPT_LOOKUP if method == "openvino-prompt-lookup" else {}


def _room_for_another(loaded) -> bool:
    """Whether the memory available now holds one more worker as large as the largest loaded (its own memory, not
    the IR file's pages it maps, which all workers share), with a quarter to spare; True where either is unknown."""
    from ...host import available_memory

    largest, free = max((w.private_mb() or 0 for w in loaded), default=0), available_memory()
    return free is None or not largest or free / 2**20 >= 1.25 * largest


def _precisions(target, kv_cache: str) -> dict:
    """The worker's load fields for inference and KV cache precision: `kv_cache` beside f32 inference; where OpenVINO
    chooses its inference precision (a q4 target), it chooses the KV cache's too."""
    precision = peer_precision(target)[1]
    return {"precision": precision, "kv_cache": kv_cache if precision else None}


def _pl() -> str:
    return ", ".join(f"{k} {v}" for k, v in PROMPT_LOOKUP.items())


def _short(precision: str) -> str:
    """OpenVINO's type names as people write them: <Type: 'uint8_t'> -> u8."""
    names = {"uint8": "u8", "bfloat16": "bf16", "float16": "f16", "float32": "f32", "f32": "f32", "u4": "u4"}
    for key, short in names.items():
        if key in precision:
            return short
    return precision


def run_cb(
    target,
    prompts: list[list[int]],
    concurrency: int,
    max_new_tokens: int,
    *,
    threads: int,
    max_batch_tokens: int = 256,
    warmup=(),
    kv_cache: str = "f32",
    console=None,
) -> tuple[dict, dict]:
    """`bench-batch`'s openvino-cb: a fresh ContinuousBatchingPipeline in a fresh process, `warmup` served untimed,
    then the closed loop of at most `concurrency` requests in flight. Returns (timings as batch._record wants them,
    load info)."""
    check_available()
    ir = ensure_ir(target, console)
    weights = peer_precision(target)[0]
    worker = PeerWorker()
    try:
        info = worker.call(
            "load",
            ir=str(ir),
            kind="cb",
            threads=threads,
            **_precisions(target, kv_cache),
            scheduler={
                "cache_size": CB_CACHE_GB,
                "max_num_batched_tokens": max_batch_tokens,
                "max_num_seqs": concurrency,
                "dynamic_split_fuse": True,
            },
        )
        answer = worker.call(
            "batch",
            prompts=prompts,
            warmup=list(warmup),
            concurrency=concurrency,
            max_new_tokens=max_new_tokens,
            stop_ids=list(target.eos_token_ids),
        )
    finally:
        worker.close()
    info["ir"], info["weights"] = ir.name, weights
    return answer, info


def describe_cb(info: dict, max_batch_tokens: int) -> str:
    """The note bench-batch prints under its table for openvino-cb."""
    props, defaults = info["properties"], info["cpu_defaults"]
    return (
        f"openvino-cb: OpenVINO GenAI {info['openvino_genai'].split('-')[0]} ContinuousBatchingPipeline, own "
        f"process per run (peak RSS is that process's), IR {info['ir']} from {OPTIMUM_INTEL} ({info['weights']} weights); "
        f"SchedulerConfig cache_size {CB_CACHE_GB} GB, dynamic_split_fuse, max_num_batched_tokens {max_batch_tokens}, "
        f"max_num_seqs C; INFERENCE_NUM_THREADS {props['INFERENCE_NUM_THREADS']}, inference precision "
        f"{_short(props['INFERENCE_PRECISION_HINT'])}, KV cache {_short(props['KV_CACHE_PRECISION'])} (OpenVINO's defaults on this "
        f"CPU: {_short(defaults['INFERENCE_PRECISION_HINT'])} inference, {_short(defaults['KV_CACHE_PRECISION'])} "
        "KV cache); fed our prompt token ids"
    )
