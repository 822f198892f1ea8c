"""The OpenAI-compatible HTTP server around one Engine: `create_app(engine)` gives a FastAPI app.

Routes: POST /v1/completions, POST /v1/chat/completions (streaming as server-sent events, `data: [DONE]` last),
GET /v1/models, GET /health, GET /metrics (Prometheus). The handlers are plain functions of a `ServerState` and a
request, so the same code serves from a Ray Serve replica (ray_app.py). Every answer carries the header
`x-leapdecode-instance` (host and process), and every completion a `leapdecode` object with the request's
speculative decoding stats (drafter, new tokens per target forward, drafted and accepted tokens).

Requests are tokenized here (the chat template for chat) so that a prompt beyond the context, or a `max_tokens`
that cannot fit, gets a 400 before anything is queued. A client that disconnects, streaming or not, has its requests
cancelled in the engine (their KV freed at the next step).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import socket
import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..prompt import encode_prompt
from ..errors import LeapDecodeError
from .engine_thread import EngineThread
from .metrics import ServerMetrics
from .protocol import APIError, ChatCompletionRequest, CompletionRequest, parse
from .responses import SSE, Run

MAX_BODY_BYTES = 4 * 1024 * 1024
DISCARD_LIMIT = 64 * 1024 * 1024  # an oversized body is read and dropped up to here, so the client sees the 413


class ServerState:
    """One engine, its thread, its metrics, and the server's settings."""

    def __init__(
        self,
        engine,
        *,
        served_model_name: str | None = None,
        api_key: str | None = None,
        max_body_bytes: int = MAX_BODY_BYTES,
    ):
        self.engine = engine
        self.model_name = served_model_name or engine.name
        self.accepted_names = {self.model_name, engine.name}
        self.api_key = api_key or None
        self.max_body_bytes = max_body_bytes
        self.drafter = getattr(engine, "drafter_name", "none")
        self.instance = f"{socket.gethostname()}:{os.getpid()}"
        self.created = int(time.time())
        self.thread = EngineThread(engine).start()
        self.metrics = ServerMetrics(self.thread, self.model_name)

    def close(self) -> None:
        self.thread.stop()


def error_response(error: APIError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status)


def _authorize(state: ServerState, request: Request) -> None:
    if state.api_key is None:
        return
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip().encode(), state.api_key.encode()):
        raise APIError(
            401, "Incorrect or missing API key: send the header 'Authorization: Bearer <key>'", code="invalid_api_key"
        )


async def _read_body(state: ServerState, request: Request) -> bytes:
    limit = state.max_body_bytes
    declared = request.headers.get("content-length")
    too_big = APIError(
        413, f"the request body is larger than the server's limit of {limit} bytes", code="request_too_large"
    )
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit or (declared and declared.isdigit() and int(declared) > limit):
            chunks = []
            if size > DISCARD_LIMIT:
                break
            continue
        chunks.append(chunk)
    if size > limit or (declared and declared.isdigit() and int(declared) > limit):
        raise too_big
    return b"".join(chunks)


# ---- completions ----------------------------------------------------------------------------------------------------


async def completions(state: ServerState, request: Request) -> Response:
    return await _complete(state, request, chat=False)


async def chat_completions(state: ServerState, request: Request) -> Response:
    return await _complete(state, request, chat=True)


async def _complete(state: ServerState, request: Request, chat: bool) -> Response:
    endpoint = "/v1/chat/completions" if chat else "/v1/completions"
    arrival = time.perf_counter()
    try:
        _authorize(state, request)
        body = parse(ChatCompletionRequest if chat else CompletionRequest, await _read_body(state, request))
        if body.model not in state.accepted_names:
            raise APIError(
                404,
                f"The model '{body.model}' does not exist; this server serves '{state.model_name}'",
                param="model",
                code="model_not_found",
            )
        jobs = _jobs(state, body, chat)
        submitted = _submit(state, jobs)
    except APIError as error:
        state.metrics.http(endpoint, error.status)
        return error_response(error)
    state.metrics.http(endpoint, 200)
    run = Run(state, body, chat, jobs, submitted, arrival)
    if body.stream:
        return SSE(run.events(), on_close=run.cancel_unfinished)
    watcher = asyncio.ensure_future(_on_disconnect(request, run.cancel_unfinished))
    try:
        return JSONResponse(await run.collect())
    except APIError as error:
        return error_response(error)
    finally:
        watcher.cancel()
        run.cancel_unfinished()


def _jobs(state: ServerState, body, chat: bool) -> list[dict]:
    """One engine request per (prompt, choice): its token ids and parameters. APIError(400) on what cannot run."""
    tokenizer, context = state.engine.tokenizer, state.engine.context_length
    prompts = [body.chat()] if chat else body.prompts()
    if not prompts:
        raise APIError(400, "prompt: must not be empty", param="prompt")
    param = "messages" if chat else "prompt"
    temperature = 1.0 if body.temperature is None else float(body.temperature)
    top_p = 1.0 if body.top_p is None else float(body.top_p)
    requested = (body.max_completion_tokens or body.max_tokens) if chat else body.max_tokens
    stop = [body.stop] if isinstance(body.stop, str) else body.stop
    if stop is not None and not all(stop):
        raise APIError(400, "stop: stop strings must not be empty", param="stop")
    jobs = []
    for prompt in prompts:
        try:
            ids = encode_prompt(tokenizer, prompt, raw=not chat)
        except LeapDecodeError as e:
            raise APIError(400, f"{param}: {e}", param=param) from None
        if not ids:
            raise APIError(400, f"{param}: the prompt is empty", param=param)
        room = context - len(ids)
        if room <= 0:
            raise APIError(
                400,
                f"This model's maximum context length is {context} tokens; the {param} has {len(ids)} tokens",
                param=param,
                code="context_length_exceeded",
            )
        max_tokens = requested if requested is not None else (room if chat else min(16, room))
        if max_tokens > room:
            raise APIError(
                400,
                f"This model's maximum context length is {context} tokens; you requested "
                f"{len(ids) + max_tokens} tokens ({len(ids)} in the {param}, {max_tokens} for the "
                "completion)",
                param="max_completion_tokens" if chat and body.max_completion_tokens else "max_tokens",
                code="context_length_exceeded",
            )
        echo = tokenizer.decode(ids, skip_special_tokens=True) if not chat and body.echo else ""
        for j in range(body.n):
            jobs.append(
                dict(
                    prompt_ids=ids,
                    echo=echo,
                    params=dict(
                        max_new_tokens=max_tokens,
                        temperature=temperature,
                        top_p=top_p,
                        top_k=max(0, body.top_k or 0),
                        seed=None if body.seed is None else body.seed + j,
                        stop=stop,
                    ),
                )
            )
    return jobs


def _submit(state: ServerState, jobs: list[dict]) -> tuple[asyncio.Queue, dict[int, int]]:
    queue: asyncio.Queue = asyncio.Queue()
    index: dict[int, int] = {}
    try:
        for i, job in enumerate(jobs):
            rid, _ = state.thread.submit(job["prompt_ids"], queue=queue, raw=True, **job["params"])
            index[rid] = i
    except LeapDecodeError as e:
        for rid in index:
            state.thread.cancel(rid)
        raise APIError(400, str(e)) from None
    return queue, index


async def _on_disconnect(request: Request, callback) -> None:
    """Call `callback` when the client goes away (the body is already read, so the next message is the end)."""
    with contextlib.suppress(Exception):
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                callback()
                return


# ---- the other routes -----------------------------------------------------------------------------------------------


async def models(state: ServerState, request: Request) -> Response:
    try:
        _authorize(state, request)
    except APIError as error:
        return error_response(error)
    return JSONResponse(
        {
            "object": "list",
            "data": [
                {
                    "id": state.model_name,
                    "object": "model",
                    "created": state.created,
                    "owned_by": "leapdecode",
                    "max_model_len": state.engine.context_length,
                    "drafter": state.drafter,
                }
            ],
        }
    )


async def health(state: ServerState, request: Request) -> Response:
    ok = state.thread.alive
    return JSONResponse(
        {
            "status": "ok" if ok else "engine thread stopped",
            "model": state.model_name,
            "in_flight": state.thread.in_flight,
        },
        status_code=200 if ok else 503,
    )


async def metrics(state: ServerState, request: Request) -> Response:
    return Response(state.metrics.exposition(), media_type="text/plain; version=0.0.4; charset=utf-8")


ROUTES = (
    ("POST", "/v1/completions", completions),
    ("POST", "/v1/chat/completions", chat_completions),
    ("GET", "/v1/models", models),
    ("GET", "/health", health),
    ("GET", "/metrics", metrics),
)


def create_app(
    engine, *, served_model_name: str | None = None, api_key: str | None = None, max_body_bytes: int = MAX_BODY_BYTES
) -> FastAPI:
    """A FastAPI app serving `engine` (a leapdecode.engine.Engine); its engine thread starts now and stops with
    the app's lifespan (or `app.state.server.close()`)."""
    state = ServerState(engine, served_model_name=served_model_name, api_key=api_key, max_body_bytes=max_body_bytes)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        state.close()

    app = FastAPI(title="leapdecode", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = state
    install(app, state)
    return app


def install(app: FastAPI, state: ServerState, routes: bool = True) -> None:
    """Routes, OpenAI-shaped errors for unknown paths and crashes, and the instance header, on `app`."""
    if routes:
        for method, path, handler in ROUTES:
            app.add_api_route(path, _bind(handler, state), methods=[method], include_in_schema=False)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request, exc):
        code = "not_found" if exc.status_code == 404 else None
        return error_response(
            APIError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", code=code)
        )

    @app.exception_handler(Exception)
    async def crash(request, exc):
        return error_response(APIError(500, f"internal error: {type(exc).__name__}: {exc}", type="server_error"))

    app.add_middleware(_InstanceHeader, instance=state.instance)


class _InstanceHeader:
    """Pure ASGI middleware (streams and disconnects pass through untouched) adding x-leapdecode-instance."""

    def __init__(self, app, instance: str):
        self.app, self.header = app, (b"x-leapdecode-instance", instance.encode())

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_with_header(message):
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), self.header]
            await send(message)

        await self.app(scope, receive, send_with_header)


def _bind(handler, state):
    async def route(request: Request):
        return await handler(state, request)

    route.__name__ = handler.__name__
    return route
