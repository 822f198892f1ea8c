"""The OpenAI-compatible HTTP server around one Engine: `create_app(engine)` gives a FastAPI app.

Routes: POST /v1/completions, POST /v1/chat/completions (streaming as server-sent events, `data: [DONE]` last),
POST /v1/responses with GET and DELETE /v1/responses/{id} (OpenAI's Responses API, responses_api.py), GET /v1/models and
/v1/models/{id}, POST /tokenize, POST /detokenize, GET /version, GET /health (and vLLM's GET/POST /ping), GET
/metrics (Prometheus). The handlers are plain functions of a `ServerState` and a request, so the same code serves
from a Ray Serve replica (ray_app.py). Every answer carries the header `x-leapdecode-instance` (an opaque id of the process; the log maps it
to host and pid), and every completion a `leapdecode` object with the request's speculative decoding stats.

A completion call is admitted first (admission.py: bounded, with timeouts and a draining state), then its body is
read and validated (protocol.py, fields.py), its prompts tokenized off the event loop (tokenizing.py) so that a prompt
beyond the context, or a `max_tokens` that cannot fit, gets a 400 before anything is queued. A client that
disconnects, streaming or not, has its requests cancelled in the engine (their KV freed at the next step). Host,
Origin and content type are checked in front of every route (security.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import socket
import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..version import __version__
from .admission import Admission, Limits, max_running
from .engine_thread import EngineThread, Streaming
from .jobs import build_jobs, submit
from .metrics import ServerMetrics
from .protocol import APIError, json_object, validated
from .response_store import ResponseStore, delete_response, get_response
from .responses import SSE, CompletionCall, Run
from .responses_api import ResponsesCall
from .security import Security, SecurityMiddleware, authorize, error_id
from .tokenizing import DetokenizeRequest, TokenizeRequest, TokenizerPool, detokenize, tokenize

log = logging.getLogger("leapdecode.serve")

MAX_BODY_BYTES = 4 * 1024 * 1024
DISCARD_LIMIT = 64 * 1024 * 1024  # an oversized body is read and dropped up to here, so the client sees the 413
CLIENT_CLOSED = 499  # nginx's status for a request whose client went away before the answer (counted, never seen)


class ServerState:
    """One engine, its thread, its metrics, and the server's settings (see create_app)."""

    def __init__(
        self,
        engine,
        *,
        served_model_name: str | None = None,
        api_key: str | None = None,
        max_body_bytes: int = MAX_BODY_BYTES,
        limits: Limits | None = None,
        security: Security | None = None,
        streaming: Streaming | None = None,
    ):
        self.engine = engine
        self.streaming = streaming or Streaming()  # how streams are paced (engine_thread.Interval)
        self.model_name = served_model_name or engine.name
        self.accepted_names = {self.model_name, engine.name}
        self.api_key = api_key or None
        self.max_body_bytes = max_body_bytes
        self.limits = limits or Limits()
        self.security = security or Security()
        self.drafter = getattr(engine, "drafter_name", "none")
        where = f"{socket.gethostname()}:{os.getpid()}"
        self.instance = hashlib.sha256(where.encode()).hexdigest()[:12]
        log.info("server instance %s is %s", self.instance, where)
        self.created = int(time.time())
        self.responses = ResponseStore()  # the Responses API's stored responses (previous_response_id, GET)
        self.tokenizers = TokenizerPool(engine.tokenizer)  # copies made before the engine thread uses the tokenizer
        self.thread = EngineThread(engine).start()
        self.metrics = ServerMetrics(self.thread, self.model_name)
        self.admission = Admission(self.limits, max_running(engine), self.metrics)

    def check_model(self, name: str) -> None:
        """404 `model_not_found` unless `name` is one this server answers to (its served name or the model's)."""
        if name not in self.accepted_names:
            message = f"The model '{name}' does not exist; this server serves '{self.model_name}'"
            raise APIError(404, message, param="model", code="model_not_found")

    def begin_drain(self) -> None:
        """Stop admitting: new calls get 503 `shutting_down`; those in flight go on."""
        if not self.admission.draining:
            log.info("draining: new requests are refused, %d sequences in flight", self.admission.held)
        self.admission.draining = True

    def close(self) -> None:
        """Cancel what is left and stop the engine thread."""
        self.begin_drain()
        self.thread.stop()
        self.tokenizers.close()


def error_response(error: APIError, headers: dict | None = None) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers={**(error.headers or {}), **(headers or {})})


def _internal(error: Exception) -> APIError:
    eid = error_id()
    log.error("internal error %s: %s: %s", eid, type(error).__name__, error, exc_info=error)
    message = f"internal server error (error id {eid}; the server log has the details)"
    return APIError(500, message, type="server_error", code="internal_error")


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


async def _discard_body(request: Request) -> None:
    """Read and drop an unread body (up to DISCARD_LIMIT), so a refused client reads its answer, not a reset."""
    size = 0
    with contextlib.suppress(Exception):
        async for chunk in request.stream():
            size += len(chunk)
            if size > DISCARD_LIMIT:
                return


# ---- completions ----------------------------------------------------------------------------------------------------


async def completions(state: ServerState, request: Request) -> Response:
    return await _complete(state, request, "/v1/completions", lambda raw: CompletionCall(raw, chat=False))


async def chat_completions(state: ServerState, request: Request) -> Response:
    return await _complete(state, request, "/v1/chat/completions", lambda raw: CompletionCall(raw, chat=True))


async def create_response(state: ServerState, request: Request) -> Response:
    return await _complete(state, request, "/v1/responses", lambda raw: ResponsesCall(state, raw))


async def _complete(state: ServerState, request: Request, endpoint: str, read) -> Response:
    """Admission, the body read by `read` (raw bytes -> a call: CompletionCall or ResponsesCall), the engine requests,
    and the call's answer, collected or streamed; every answer counted under `endpoint`."""
    arrival = time.perf_counter()
    ticket, headers, run, body_read = None, {}, None, False
    watcher = None
    try:
        authorize(state.api_key, request)
        ticket = state.admission.enter(state.thread.refuse_reason())
        body_read = True
        call = read(await _read_body(state, request))
        body, ignored = call.body, call.ignored
        if ignored:
            log.warning("%s: ignored unknown field(s) %s", endpoint, ", ".join(ignored))
            headers["x-leapdecode-ignored-fields"] = ",".join(ignored)
        state.check_model(body.model)
        ticket.resize(body.sequences(), param="n")
        jobs = await build_jobs(state, body, call.chat)
        run = Run(state, body, call.chat, jobs, submit(state, jobs), arrival)

        def client_gone():
            run.client_gone = True
            run.cancel_unfinished()

        watcher = asyncio.ensure_future(_on_disconnect(request, client_gone))
        if body.stream:
            await run.start()
            watcher.cancel()  # from here the streaming response watches the client itself
            if run.client_gone:
                state.metrics.http(endpoint, CLIENT_CLOSED)
                return Response(status_code=CLIENT_CLOSED)
            held = ticket

            def closed():
                run.cancel_unfinished()
                held.close()

            ticket = None  # the stream gives it back when it ends
            state.metrics.http(endpoint, 200)
            return SSE(call.events(run), on_close=closed, headers=headers)
        result = await call.collect(run)
        if run.client_gone:
            state.metrics.http(endpoint, CLIENT_CLOSED)
            return Response(status_code=CLIENT_CLOSED)
        state.metrics.http(endpoint, 200)
        return JSONResponse(result, headers=headers)
    except Exception as caught:
        error = caught if isinstance(caught, APIError) else _internal(caught)
        if not body_read and error.status != 401:
            await _discard_body(request)
        state.metrics.http(endpoint, error.status)
        return error_response(error, headers)
    except asyncio.CancelledError:  # the server's shutdown timeout ran out
        state.metrics.http(endpoint, CLIENT_CLOSED)
        raise
    finally:
        if watcher is not None:
            watcher.cancel()
        if run is not None and ticket is not None:
            run.cancel_unfinished()
        if ticket is not None:
            ticket.close()


async def _on_disconnect(request: Request, callback) -> None:
    """Call `callback` when the client goes away (the body is already read, so the next message is the end)."""
    with contextlib.suppress(Exception):
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                callback()
                return


# ---- the other routes -----------------------------------------------------------------------------------------------


def _model_card(state: ServerState) -> dict:
    return {
        "id": state.model_name,
        "object": "model",
        "created": state.created,
        "owned_by": "leapdecode",
        "max_model_len": state.engine.context_length,
        "drafter": state.drafter,
    }


async def models(state: ServerState, request: Request) -> Response:
    authorize(state.api_key, request)
    return JSONResponse({"object": "list", "data": [_model_card(state)]})


async def model(state: ServerState, request: Request) -> Response:
    """OpenAI's retrieve-a-model (`client.models.retrieve`): the served model's card under any name it answers to."""
    authorize(state.api_key, request)
    name = request.path_params["model_id"]
    state.check_model(name)
    return JSONResponse({**_model_card(state), "id": name})


async def _tokenizer_call(state: ServerState, request: Request, model_class, fn) -> Response:
    authorize(state.api_key, request)
    ticket = state.admission.enter()  # bounded like completions (a 4 MiB prompt takes a worker for seconds)
    try:
        body = validated(model_class, json_object(await _read_body(state, request)))
        if body.model is not None:
            state.check_model(body.model)
        return JSONResponse(await state.tokenizers.run(fn, body))
    finally:
        ticket.close()


async def tokenize_route(state: ServerState, request: Request) -> Response:
    context, trusted = state.engine.context_length, state.security.trust_request_chat_template

    def run(tokenizer, body):
        body.check_own_template(trusted)
        return {**tokenize(tokenizer, body), "max_model_len": context}

    return await _tokenizer_call(state, request, TokenizeRequest, run)


async def detokenize_route(state: ServerState, request: Request) -> Response:
    vocab = state.tokenizers.vocab
    return await _tokenizer_call(state, request, DetokenizeRequest, lambda tok, body: detokenize(tok, body, vocab))


async def version(state: ServerState, request: Request) -> Response:
    return JSONResponse({"version": __version__})


async def health(state: ServerState, request: Request) -> Response:
    problem = state.thread.unhealthy() or ("shutting down" if state.admission.draining else None)
    return JSONResponse(
        {"status": problem or "ok", "model": state.model_name, "in_flight": state.thread.in_flight},
        status_code=503 if problem else 200,
    )


async def metrics(state: ServerState, request: Request) -> Response:
    return Response(state.metrics.exposition(), media_type="text/plain; version=0.0.4; charset=utf-8")


ROUTES = (
    ("POST", "/v1/completions", completions),
    ("POST", "/v1/chat/completions", chat_completions),
    ("POST", "/v1/responses", create_response),
    ("GET", "/v1/responses/{response_id}", get_response),
    ("DELETE", "/v1/responses/{response_id}", delete_response),
    ("GET", "/v1/models", models),
    ("GET", "/v1/models/{model_id:path}", model),
    ("POST", "/tokenize", tokenize_route),
    ("POST", "/detokenize", detokenize_route),
    ("GET", "/version", version),
    ("GET", "/health", health),
    ("GET", "/ping", health),  # vLLM's (and SageMaker's) liveness path, GET and POST
    ("POST", "/ping", health),
    ("GET", "/metrics", metrics),
)
PATHS = {path for _, path, _ in ROUTES}
COUNTED_BY_HANDLER = {"/v1/completions", "/v1/chat/completions", "/v1/responses"}


def endpoint_label(path: str) -> str:
    if path.startswith("/v1/responses/") and path.count("/") == 3:
        return "/v1/responses/{response_id}"
    if path.startswith("/v1/models/"):
        return "/v1/models/{model_id:path}"
    return path if path in PATHS else "other"


def create_app(
    engine,
    *,
    served_model_name: str | None = None,
    api_key: str | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
    limits: Limits | None = None,
    security: Security | None = None,
    streaming: Streaming | None = None,
) -> FastAPI:
    """A FastAPI app serving `engine` (a leapdecode.engine.Engine); its engine thread starts now and stops with
    the app's lifespan (or `app.state.server.close()`). `limits`: admission bound and timeouts (admission.Limits);
    `security`: the bound host and the allowed hosts and origins (security.Security); `streaming`: how streams are paced
    (engine_thread.Streaming: the tokens a chunk carries at least, the longest a chunk is held)."""
    state = ServerState(
        engine,
        served_model_name=served_model_name,
        api_key=api_key,
        max_body_bytes=max_body_bytes,
        limits=limits,
        security=security,
        streaming=streaming,
    )

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        state.close()

    app = FastAPI(title="leapdecode", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = state
    install(app, state)
    return app


def install(app: FastAPI, state: ServerState, routes: bool = True, instance_header: bool = True) -> None:
    """Routes, OpenAI-shaped errors for unknown paths and crashes, the security checks and the instance header."""
    if routes:
        for method, path, handler in ROUTES:
            app.add_api_route(path, bind(handler, state, path), methods=[method], include_in_schema=False)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request, exc):
        code = "not_found" if exc.status_code == 404 else None
        state.metrics.http(endpoint_label(request.url.path), exc.status_code)
        return error_response(
            APIError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", code=code)
        )

    @app.exception_handler(Exception)
    async def crash(request, exc):
        return error_response(_internal(exc))

    app.add_middleware(
        SecurityMiddleware,
        security=state.security,
        instance=state.instance if instance_header else "",
        on_refused=lambda path, status: state.metrics.http(endpoint_label(path), status),
    )


def bind(handler, state, path):
    """`handler` as a route of `state`: errors answered OpenAI-style, and every answer counted."""

    async def route(request: Request):
        if path in COUNTED_BY_HANDLER:
            return await handler(state, request)
        try:
            response = await handler(state, request)
        except Exception as caught:
            error = caught if isinstance(caught, APIError) else _internal(caught)
            state.metrics.http(path, error.status)
            return error_response(error)
        state.metrics.http(path, response.status_code)
        return response

    route.__name__ = handler.__name__
    return route
