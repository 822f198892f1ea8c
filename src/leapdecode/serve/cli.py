"""`leapdecode serve` (an OpenAI-compatible server over the batched Engine) and `leapdecode bench-serve` (a load
generator for any OpenAI-compatible URL)."""

from __future__ import annotations

import os
import time

from ..argtypes import integer as _int
from ..errors import LeapDecodeError, require
from ..models.registry import DEFAULT_MODEL


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
    p.add_argument("--dtype", default="float32", help="float32, bfloat16 or float16")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=_int, default=8000)
    p.add_argument("--max-batch-tokens", type=_int, default=256, help="rows (tokens) per batched forward")
    p.add_argument("--max-sequences", type=_int, default=32, help="requests decoded at once; more wait")
    p.add_argument("--prefix-cache-tokens", type=_int, default=8192)
    p.add_argument(
        "--api-key",
        default=os.environ.get("LEAPDECODE_API_KEY"),
        help="require 'Authorization: Bearer KEY' on /v1 routes (default: $LEAPDECODE_API_KEY, else none)",
    )
    p.add_argument("--max-body-bytes", type=_int, default=4 * 1024 * 1024, help="larger request bodies get 413")
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
    if args.ray_replicas:
        from .ray_app import run_ray

        return run_ray(args)
    import torch
    import uvicorn

    from ..engine import Engine
    from .app import create_app
    from .server import uvicorn_config

    if args.threads:
        require(args.threads > 0, f"--threads must be positive, got {args.threads}")
        torch.set_num_threads(args.threads)
    check_port(args.host, args.port)
    engine = Engine(args.model, **engine_options(args))
    app = create_app(
        engine, served_model_name=args.served_model_name, api_key=args.api_key, max_body_bytes=args.max_body_bytes
    )
    state = app.state.server
    print(
        f"leapdecode serve: {state.model_name} (drafter {state.drafter}, context {engine.context_length}) on "
        f"http://{args.host}:{args.port}/v1" + (" (API key required)" if state.api_key else ""),
        flush=True,
    )
    try:
        uvicorn.Server(uvicorn_config(app, args.host, args.port, args.log_level)).run()
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
