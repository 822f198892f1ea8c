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
):
    """A bound Ray Serve application: `replicas` copies (or `autoscaling_config`) of an Engine on `model` (a name
    or path every node can load), each on `threads` torch threads and as many Ray CPUs."""
    from ray import serve

    api = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)

    @serve.deployment(name="leapdecode", max_ongoing_requests=max_ongoing_requests)
    @serve.ingress(api)
    class LeapDecodeReplica:
        def __init__(self, model, options, served_model_name, api_key, threads, max_body_bytes):
            import torch

            from ..engine import Engine

            torch.set_num_threads(threads)
            engine = Engine(model, **options)
            self.state = handlers.ServerState(
                engine, served_model_name=served_model_name, api_key=api_key, max_body_bytes=max_body_bytes
            )

        def _mark(self, response):
            response.headers["x-leapdecode-instance"] = self.state.instance
            return response

        @api.post("/v1/completions")
        async def completions(self, request: Request):
            return self._mark(await handlers.completions(self.state, request))

        @api.post("/v1/chat/completions")
        async def chat_completions(self, request: Request):
            return self._mark(await handlers.chat_completions(self.state, request))

        @api.get("/v1/models")
        async def models(self, request: Request):
            return self._mark(await handlers.models(self.state, request))

        @api.get("/health")
        async def health(self, request: Request):
            return self._mark(await handlers.health(self.state, request))

        @api.get("/metrics")
        async def metrics(self, request: Request):
            return self._mark(await handlers.metrics(self.state, request))

    deployment_options: dict = {"ray_actor_options": {"num_cpus": threads}}
    if autoscaling_config:
        deployment_options["autoscaling_config"] = autoscaling_config
    else:
        deployment_options["num_replicas"] = replicas
    return LeapDecodeReplica.options(**deployment_options).bind(
        model, dict(engine_options or {}), served_model_name, api_key, threads, max_body_bytes
    )
