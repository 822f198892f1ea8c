"""`leapdecode serve` (an OpenAI-compatible server over the batched Engine) and `leapdecode bench-serve` (a load
generator for any OpenAI-compatible URL)."""

from __future__ import annotations

import os
import time

from ..argtypes import integer as _int
from ..argtypes import number
from ..errors import LeapDecodeError, require
from ..models.registry import DEFAULT_MODEL
from ..prompt import read_chat_template
from .admission import DEFAULT_MAX_WAITING, DEFAULT_QUEUE_TIMEOUT, DEFAULT_REQUEST_TIMEOUT, DEFAULT_SHUTDOWN_TIMEOUT
from .engine_thread import DEFAULT_STREAM_INTERVAL, DEFAULT_STREAM_MAX_DELAY


def _seconds(text: str) -> float:
    import argparse
    import math

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected seconds >= 0, got {text!r}")
    return value


def _names(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in (text or "").split(",") if x.strip())


def server_options(args) -> dict:
    """create_app's limits, security and streaming settings from the command line."""
    from .admission import Limits
    from .engine_thread import Streaming
    from .security import Security

    return dict(
        limits=Limits(
            max_waiting=args.max_waiting,
            queue_timeout=args.queue_timeout,
            request_timeout=args.request_timeout,
            shutdown_timeout=args.shutdown_timeout,
        ),
        security=Security(
            args.host, _names(args.allowed_hosts), _names(args.allowed_origins), args.trust_request_chat_template
        ),
        streaming=Streaming(args.stream_interval, args.stream_max_delay),
    )


def register(sub) -> None:
    add_serve(sub)


def add_serve(sub) -> None:
    from ..drafters import DRAFTERS

    p = sub.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API (continuous batching)")
    p.add_argument(
        "--model", default=DEFAULT_MODEL, help="packaged name, local HF directory, .gguf file or cached hub id"
    )
    p.add_argument("--served-model-name", help="the name clients send as `model` (default: the model's name)")
    p.add_argument(
        "--drafter",
        default="auto",
        choices=("auto", *DRAFTERS),
        help="auto (default): the model's shipped draft head if it has one, else prompt-lookup; "
        "none turns speculation off",
    )
    p.add_argument("--draft-model", help="the draft model for --drafter draft-model (same tokenizer as --model)")
    p.add_argument(
        "--head",
        help="draft head directory or shipped head name for --drafter head (default: the model's shipped head)",
    )
    p.add_argument(
        "--dtype",
        default="float32",
        help="float32, bfloat16, float16, or q4 (4-bit weights in groups of 32, int8 output head, bf16 products)",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=_int, default=8000)
    p.add_argument("--max-batch-tokens", type=_int, default=256, help="rows (tokens) per batched forward")
    p.add_argument("--max-sequences", type=_int, default=32, help="requests decoded at once; more wait")
    p.add_argument("--prefix-cache-tokens", type=_int, default=8192)
    p.add_argument(
        "--max-decode-slowdown",
        type=number,
        default=float("inf"),
        help="how much dearer than a decode-only step a step reading prompt chunks may get (default inf: chunks fill "
        "--max-batch-tokens, as vLLM's do; 2 keeps each stream's next token within two decode steps' time, at some "
        "throughput)",
    )
    p.add_argument(
        "--chat-template",
        help="render chat messages with this Jinja template (a file, or the text) instead of the model's",
    )
    p.add_argument(
        "--trust-request-chat-template",
        action="store_true",
        help="let a chat request bring its own `chat_template` (vLLM's flag; without it such a request gets 400)",
    )
    p.add_argument(
        "--scheduling-policy",
        choices=("fcfs", "priority"),
        default="fcfs",
        help="fcfs: first come, first served; priority: a request's `priority` (lower first, then arrival) orders "
        "admission and preemption, as vLLM's",
    )
    p.add_argument(
        "--kv-cache-bytes",
        type=_int,
        help="most bytes of KV the engine holds (running requests and prefix cache); past it the newest request is "
        "preempted and recomputed later (default: half the memory available at start)",
    )
    p.add_argument(
        "--api-key",
        default=os.environ.get("LEAPDECODE_API_KEY"),
        help="require 'Authorization: Bearer KEY' on /v1 routes (default: $LEAPDECODE_API_KEY, else none)",
    )
    p.add_argument("--max-body-bytes", type=_int, default=4 * 1024 * 1024, help="larger request bodies get 413")
    p.add_argument(
        "--max-waiting",
        type=_int,
        default=DEFAULT_MAX_WAITING,
        help=f"sequences that may wait beyond the running ones; past it, 429 with Retry-After "
        f"(default {DEFAULT_MAX_WAITING})",
    )
    p.add_argument(
        "--queue-timeout",
        type=_seconds,
        default=DEFAULT_QUEUE_TIMEOUT,
        help=f"seconds a request may wait for its first token, then 503 (default {DEFAULT_QUEUE_TIMEOUT:g}; 0: none)",
    )
    p.add_argument(
        "--request-timeout",
        type=_seconds,
        default=DEFAULT_REQUEST_TIMEOUT,
        help=f"seconds a whole request may take, then 504 (default {DEFAULT_REQUEST_TIMEOUT:g}; 0: none)",
    )
    p.add_argument(
        "--shutdown-timeout",
        type=_seconds,
        default=DEFAULT_SHUTDOWN_TIMEOUT,
        help=f"on SIGTERM/Ctrl-C: seconds requests in flight may finish before they are cancelled "
        f"(default {DEFAULT_SHUTDOWN_TIMEOUT:g})",
    )
    p.add_argument(
        "--stream-interval",
        type=_int,
        default=DEFAULT_STREAM_INTERVAL,
        help="tokens a streamed chunk carries at least (vLLM's; the first and last go out at once, a call may ask for "
        f"more with stream_interval): fewer chunks leave more CPU to the forward (default {DEFAULT_STREAM_INTERVAL}; "
        "1: a chunk every step)",
    )
    p.add_argument(
        "--stream-max-delay",
        type=_seconds,
        default=DEFAULT_STREAM_MAX_DELAY,
        help="seconds after a stream's previous chunk past which a held one goes out whatever its size (default "
        f"{DEFAULT_STREAM_MAX_DELAY:g}; 0: none, vLLM's rule)",
    )
    p.add_argument(
        "--allowed-origins",
        default="",
        help="comma-separated browser origins allowed to call the API (e.g. https://app.example.com; * for any); "
        "default: none, cross-origin requests get 403",
    )
    p.add_argument(
        "--allowed-hosts",
        default="",
        help="comma-separated Host names accepted besides localhost, IP addresses and --host (.example.com for a "
        "domain and its subdomains, * for any); others get 400 (DNS rebinding)",
    )
    p.add_argument("--threads", type=_int, help="torch threads for the engine (default: torch's)")
    p.add_argument(
        "--ray-replicas",
        type=_int,
        default=0,
        help="serve N engine replicas as a Ray Serve deployment instead (needs leapdecode[ray])",
    )
    p.add_argument(
        "--ray-max-replicas", type=_int, help="with --ray-replicas: autoscale between N and this many replicas"
    )
    p.add_argument(
        "--loop",
        default="asyncio",
        choices=("asyncio", "uvloop"),
        help="uvicorn's event loop (default asyncio; uvloop if installed)",
    )
    p.add_argument(
        "--http",
        default="h11",
        choices=("h11", "httptools"),
        help="uvicorn's HTTP/1.1 implementation (default h11; httptools if installed)",
    )
    p.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    p.set_defaults(func=run_serve)


def engine_options(args) -> dict:
    return dict(
        drafter=args.drafter,
        draft_model=args.draft_model,
        dtype=args.dtype,
        max_batch_tokens=args.max_batch_tokens,
        max_sequences=args.max_sequences,
        prefix_cache_tokens=args.prefix_cache_tokens,
        max_decode_slowdown=args.max_decode_slowdown,
        kv_cache_bytes=args.kv_cache_bytes,
        policy=args.scheduling_policy,
        chat_template=read_chat_template(args.chat_template) if args.chat_template else None,
        drafter_options={"head": args.head} if args.head else None,
    )


def check_port(host: str, port: int) -> None:
    """Fail in one line now (before loading the model) if the address cannot be bound."""
    import socket

    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
    except OSError as e:
        raise LeapDecodeError(f"cannot serve on {host}:{port}: {e.strerror or e}") from None


def run_serve(args) -> int:
    require(1 <= args.port <= 65535, f"--port must be in 1..65535, got {args.port}")
    require(args.max_body_bytes > 0, f"--max-body-bytes must be positive, got {args.max_body_bytes}")
    require(not args.head or args.drafter == "head", "--head goes with --drafter head")
    require(args.ray_replicas >= 0, f"--ray-replicas must be >= 0, got {args.ray_replicas}")
    require(args.max_waiting >= 0, f"--max-waiting must be >= 0, got {args.max_waiting}")
    require(args.stream_interval >= 1, f"--stream-interval must be >= 1, got {args.stream_interval}")
    if args.ray_replicas:
        from .ray_app import run_ray

        return run_ray(args)
    import logging

    import torch

    from ..engine import Engine
    from .app import create_app
    from .server import DrainingServer, check_runtime, uvicorn_config

    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("leapdecode").setLevel(args.log_level.upper())
    if args.threads:
        require(args.threads > 0, f"--threads must be positive, got {args.threads}")
        torch.set_num_threads(args.threads)
    check_port(args.host, args.port)
    check_runtime(args.loop, args.http)
    engine = Engine(args.model, **engine_options(args))
    engine.warm_up()  # the one-off preparation now, not in the first request
    app = create_app(
        engine,
        served_model_name=args.served_model_name,
        api_key=args.api_key,
        max_body_bytes=args.max_body_bytes,
        **server_options(args),
    )
    state = app.state.server
    print(
        f"leapdecode serve: {state.model_name} (drafter {state.drafter}, context {engine.context_length}) on "
        f"http://{args.host}:{args.port}/v1 ({args.loop}, {args.http})"
        + (" (API key required)" if state.api_key else ""),
        flush=True,
    )
    try:
        DrainingServer(uvicorn_config(app, args.host, args.port, args.log_level, args.loop, args.http)).run()
    finally:
        state.close()
    return 0


def run_ray(args) -> int:
    """`leapdecode serve --ray-replicas N`: a local Ray (or the cluster in $RAY_ADDRESS) serving until Ctrl-C."""
    try:
        import ray
        from ray import serve
    except ImportError:
        raise LeapDecodeError("--ray-replicas needs Ray Serve: pip install 'leapdecode[ray]'") from None
    from .ray_app import build_app

    threads = args.threads or 1
    autoscaling = None
    if args.ray_max_replicas:
        autoscaling = {
            "min_replicas": args.ray_replicas,
            "max_replicas": args.ray_max_replicas,
            "target_ongoing_requests": max(1, args.max_sequences // 2),
        }
    ray.init(ignore_reinit_error=True)
    serve.start(http_options={"host": args.host, "port": args.port})
    app = build_app(
        args.model,
        replicas=args.ray_replicas,
        threads=threads,
        engine_options=engine_options(args),
        served_model_name=args.served_model_name,
        api_key=args.api_key,
        autoscaling_config=autoscaling,
        max_body_bytes=args.max_body_bytes,
        server_options=server_options(args),
    )
    serve.run(app, route_prefix="/")
    print(
        f"leapdecode serve: {args.ray_replicas} Ray Serve replica(s) on http://{args.host}:{args.port}/v1", flush=True
    )
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        serve.shutdown()
    return 0
