"""A live leapdecode server on a (tiny) model for the HTTP tests, and the `openai` client that talks to it."""

from __future__ import annotations

import contextlib

import openai

from leapdecode.engine import Engine
from leapdecode.serve.app import create_app
from leapdecode.serve.server import BackgroundServer


@contextlib.contextmanager
def served(target, app_options: dict | None = None, server_options: dict | None = None, **engine_options):
    """(base URL, ServerState) of a server on `target` named "tiny" (drafting by prompt lookup unless
    `engine_options` say otherwise; `app_options`: create_app's; `server_options`: uvicorn's loop and http), in a
    background thread, stopped after."""
    engine = Engine(target, **{"drafter": "prompt-lookup", **engine_options})
    app = create_app(engine, served_model_name="tiny", **(app_options or {}))
    try:
        with BackgroundServer(app, **(server_options or {})) as url:
            yield url, app.state.server
    finally:
        app.state.server.close()


def client_of(url: str, api_key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=api_key, max_retries=0)
