"""N engine replicas behind one OpenAI-compatible route, as a Ray Serve deployment (`pip install 'leapdecode[ray]'`).

Each replica is a Ray actor holding its own Engine and engine thread and serving the same handlers as
`leapdecode serve` (app.py), so answers, errors, streaming and per-request stats are the same; Ray's HTTP proxy
spreads requests over the replicas (and cancels a request whose client went away). Every answer names the replica
that produced it in the `x-leapdecode-instance` header. Autoscaling is Ray's own: pass `autoscaling_config`
(min_replicas, max_replicas, target_ongoing_requests, ...) instead of a fixed replica count.

    from ray import serve
    from leapdecode.serve.ray_app import build_app
    serve.run(build_app("smollm2-135m", replicas=2, threads=1), route_prefix="/")

On a multi-node cluster the same code runs after `ray start --head` / `ray start --address=HEAD:6379` on each
node and `ray.init(address="auto")`: Ray places replicas wherever `ray_actor_options` (num_cpus per replica) fit.
"""

from fastapi import FastAPI, Request

from . import app as handlers


def build_app(
    model: str,
    *,
    replicas: int = 1,
    threads: int = 1,
    engine_options: dict | None = None,
    served_model_name: str | None = None,
    api_key: str | None = None,
    autoscaling_config: dict | None = None,
    max_ongoing_requests: int = 64,
    max_body_bytes: int = handlers.MAX_BODY_BYTES,
    server_options: dict | None = None,
):
    """A bound Ray Serve application: `replicas` copies (or `autoscaling_config`) of an Engine on `model` (a name
    or path every node can load), each on `threads` torch threads and as many Ray CPUs. `server_options`:
    create_app's `limits` and `security` (admission.Limits, security.Security), the same in every replica."""
    from ray import serve

    from .security import Security, SecurityMiddleware

    server_options = dict(server_options or {})
    api = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
    api.add_middleware(SecurityMiddleware, security=server_options.get("security") or Security())

    @serve.deployment(name="leapdecode", max_ongoing_requests=max_ongoing_requests)
    @serve.ingress(api)
    class LeapDecodeReplica:
        def __init__(self, model, options, served_model_name, api_key, threads, max_body_bytes, server_options):
            import torch

            from ..engine import Engine

            torch.set_num_threads(threads)
            engine = Engine(model, **options)
            engine.warm_up()  # the one-off preparation before the replica takes requests
            self.state = handlers.ServerState(
                engine,
                served_model_name=served_model_name,
                api_key=api_key,
                max_body_bytes=max_body_bytes,
                **server_options,
            )
            self.routes = {
                (method, path): handlers.bind(handler, self.state, path) for method, path, handler in handlers.ROUTES
            }

        async def _route(self, path: str, request: Request):
            response = await self.routes[request.method, path](request)
            response.headers["x-leapdecode-instance"] = self.state.instance
            return response

        @api.post("/v1/completions")
        async def completions(self, request: Request):
            return await self._route("/v1/completions", request)

        @api.post("/v1/chat/completions")
        async def chat_completions(self, request: Request):
            return await self._route("/v1/chat/completions", request)

        @api.post("/v1/responses")
        async def responses(self, request: Request):
            return await self._route("/v1/responses", request)

        @api.get("/v1/responses/{response_id}")
        async def get_response(self, request: Request):
            return await self._route("/v1/responses/{response_id}", request)

        @api.delete("/v1/responses/{response_id}")
        async def delete_response(self, request: Request):
            return await self._route("/v1/responses/{response_id}", request)

        @api.get("/v1/models")
        async def models(self, request: Request):
            return await self._route("/v1/models", request)

        @api.get("/v1/models/{model_id:path}")
        async def model(self, request: Request):
            return await self._route("/v1/models/{model_id:path}", request)

        @api.post("/tokenize")
        async def tokenize(self, request: Request):
            return await self._route("/tokenize", request)

        @api.post("/detokenize")
        async def detokenize(self, request: Request):
            return await self._route("/detokenize", request)

        @api.get("/version")
        async def version(self, request: Request):
            return await self._route("/version", request)

        @api.get("/health")
        async def health(self, request: Request):
            return await self._route("/health", request)

        @api.api_route("/ping", methods=["GET", "POST"])
        async def ping(self, request: Request):
            return await self._route("/ping", request)

        @api.get("/metrics")
        async def metrics(self, request: Request):
            return await self._route("/metrics", request)

    deployment_options: dict = {"ray_actor_options": {"num_cpus": threads}}
    if autoscaling_config:
        deployment_options["autoscaling_config"] = autoscaling_config
    else:
        deployment_options["num_replicas"] = replicas
    return LeapDecodeReplica.options(**deployment_options).bind(
        model, dict(engine_options or {}), served_model_name, api_key, threads, max_body_bytes, server_options
    )
