"""An OpenAI-compatible HTTP server over the batched Engine (`leapdecode serve`), a load generator for any
OpenAI-compatible server (`leapdecode bench-serve`), and a Ray Serve deployment (`leapdecode.serve.ray_app`).
Needs fastapi, uvicorn and prometheus-client (installed with leapdecode); Ray is the optional extra `ray`."""


def create_app(engine, **options):
    """See leapdecode.serve.app.create_app (imported lazily: FastAPI loads only when serving)."""
    from .app import create_app as _create_app

    return _create_app(engine, **options)


__all__ = ["create_app"]
