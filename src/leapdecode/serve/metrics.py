"""Prometheus metrics of one server, under the names vLLM uses so that existing vLLM dashboards read them.

Engine-side numbers (running and waiting requests, token counters, the speculative decoding counters
`vllm:spec_decode_num_drafts_total`, `..._num_draft_tokens_total`, `..._num_accepted_tokens_total`) are read from
the engine thread's last metrics snapshot at scrape time; latency histograms (time to first token, inter-token
latency, end-to-end latency) and request counts are observed by the HTTP handlers, per request, from the moment the
request reached the server. leapdecode's own extras (KV tokens and bytes held, prefix-cache tokens, HTTP answers by
status, engine step failures, requests refused or ended by the server's limits) are prefixed `leapdecode:`. Every
HTTP answer is counted once in `leapdecode:http_requests_total{endpoint,status}` (499: the client left first). Each
server has its own registry (several apps can live in one process, as in the tests).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
E2E_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)

# engine.metrics() key -> (Prometheus name, help); counters get `_total` appended by the exposition format
ENGINE_COUNTERS = {
    "prompt_tokens": ("vllm:prompt_tokens", "Prompt tokens admitted to the engine."),
    "generation_tokens": ("vllm:generation_tokens", "Tokens generated."),
    "spec_decode_num_drafts": ("vllm:spec_decode_num_drafts", "Speculative decoding: verification steps with a draft."),
    "spec_decode_num_draft_tokens": (
        "vllm:spec_decode_num_draft_tokens",
        "Speculative decoding: draft tokens verified.",
    ),
    "spec_decode_num_accepted_tokens": (
        "vllm:spec_decode_num_accepted_tokens",
        "Speculative decoding: draft tokens accepted.",
    ),
    "steps": ("leapdecode:engine_steps", "Engine steps (one batched forward each)."),
    "step_seconds": (
        "leapdecode:engine_step_seconds",
        "Seconds those steps took: scheduling, drafting, the forward, verification and outputs.",
    ),
    "forward_seconds": ("leapdecode:engine_forward_seconds", "Seconds of those steps in the model's forward."),
    "handover_seconds": (
        "leapdecode:engine_handover_seconds",
        "Seconds the engine thread waited after steps for the event loop to write their outputs.",
    ),
    "num_preemptions": ("vllm:num_preemptions", "Requests preempted (KV given back, context recomputed later)."),
    "request_failures": ("leapdecode:request_failures", "Requests ended by a fault of their own (others went on)."),
}
ENGINE_GAUGES = {
    "running": ("vllm:num_requests_running", "Requests being decoded."),
    "waiting": ("vllm:num_requests_waiting", "Requests waiting for a slot."),
    "kv_tokens": ("leapdecode:kv_cache_tokens", "KV cache positions held by running requests."),
    "kv_bytes": ("leapdecode:kv_cache_bytes", "Bytes of KV cache held by running requests."),
    "prefix_cache_tokens": ("leapdecode:prefix_cache_tokens", "Tokens kept in the prompt prefix cache."),
    "kv_budget_bytes": ("leapdecode:kv_cache_budget_bytes", "The most bytes of KV the engine may hold."),
    "kv_peak_bytes": ("leapdecode:kv_cache_peak_bytes", "The most bytes of KV the engine has held (slots + prefix)."),
}


class _EngineCollector:
    def __init__(self, engine_thread, model_name: str):
        self.engine_thread, self.model_name = engine_thread, model_name

    def collect(self):
        snap = dict(self.engine_thread.snapshot)
        for key, (name, doc) in ENGINE_GAUGES.items():
            if key in snap:
                g = GaugeMetricFamily(name, doc, labels=["model_name"])
                g.add_metric([self.model_name], snap[key])
                yield g
        for key, (name, doc) in ENGINE_COUNTERS.items():
            if key in snap:
                c = CounterMetricFamily(name, doc, labels=["model_name"])
                c.add_metric([self.model_name], snap[key])
                yield c
        c = CounterMetricFamily("leapdecode:engine_step_failures", "Engine steps that raised.", labels=["model_name"])
        c.add_metric([self.model_name], self.engine_thread.failures)
        yield c
        yield from self._speculation(snap.get("speculation", {}))

    def _speculation(self, levels: dict):
        """The speculation gate per load level (`decoding`: how many sequences decode): the arm it runs there (1 for
        that arm, 0 for the others: no drafts, or one of the drafter's ways to draft) and each arm's measured rate."""
        labels = ["model_name", "decoding", "arm"]
        ahead = GaugeMetricFamily(
            "leapdecode:speculation_arm_ahead", "1 for the arm the speculation gate runs at this load.", labels=labels
        )
        rates = GaugeMetricFamily(
            "leapdecode:speculation_arm_tokens_per_second",
            "Tokens per second of decode-only steps by arm and load, as the speculation gate measured them (~50 steps).",
            labels=labels,
        )
        for span, level in levels.items():
            for arm, rate in level["rates"].items():
                rates.add_metric([self.model_name, span, arm], rate)
                if level["ahead"] is not None:
                    ahead.add_metric([self.model_name, span, arm], float(arm == level["ahead"]))
        yield ahead
        yield rates


class ServerMetrics:
    def __init__(self, engine_thread, model_name: str):
        self.registry = CollectorRegistry()
        self.model_name = model_name
        self.registry.register(_EngineCollector(engine_thread, model_name))
        labels = ["model_name"]

        def histogram(name: str, doc: str, buckets):
            return Histogram(name, doc, labels, buckets=buckets, registry=self.registry).labels(model_name)

        self.ttft = histogram("vllm:time_to_first_token_seconds", "Time to first token.", TTFT_BUCKETS)
        self.itl = histogram(
            "vllm:inter_token_latency_seconds", "Time between successive outputs of a request.", ITL_BUCKETS
        )
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "Request latency, arrival to last token.", E2E_BUCKETS)
        self._success = Counter(
            "vllm:request_success",
            "Requests finished, by finish reason.",
            ["model_name", "finished_reason"],
            registry=self.registry,
        )
        self._rejected = Counter(
            "leapdecode:requests_rejected",
            "Requests refused or ended by the server's limits, by reason (queue_full, queue_timeout, "
            "request_timeout, shutting_down, engine_unavailable).",
            ["model_name", "reason"],
            registry=self.registry,
        )
        self._http = Counter(
            "leapdecode:http_requests",
            "HTTP answers by endpoint and status.",
            ["endpoint", "status"],
            registry=self.registry,
        )

    def finished(self, reason: str) -> None:
        self._success.labels(self.model_name, reason).inc()

    def rejected(self, reason: str) -> None:
        self._rejected.labels(self.model_name, reason).inc()

    def http(self, endpoint: str, status: int) -> None:
        self._http.labels(endpoint, str(status)).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
