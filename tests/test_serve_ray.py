"""The Ray Serve deployment (leapdecode.serve.ray_app): a local Ray with 2 replicas of 1 thread each behind one
OpenAI-compatible route; requests are answered by both replicas, with the same greedy output as plain decoding.
Skipped where Ray Serve is not installed (`pip install 'leapdecode[ray]'`)."""

from __future__ import annotations

import concurrent.futures

import httpx
import openai
import pytest
from tiny_hf import make_tiny_hf_dir

from leapdecode import generate
from leapdecode.models import resolve_model
from leapdecode.serve.server import free_port

pytestmark = [pytest.mark.slow, pytest.mark.tiny]
ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve")


@pytest.fixture(scope="module")
def ray_server(tmp_path_factory):
    from leapdecode.serve.ray_app import build_app

    model_dir = str(make_tiny_hf_dir(tmp_path_factory.mktemp("ray") / "tiny", context=160))
    port = free_port()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(
            build_app(
                model_dir, replicas=2, threads=1, served_model_name="tiny", engine_options={"drafter": "prompt-lookup"}
            ),
            route_prefix="/",
        )
        yield f"http://127.0.0.1:{port}", model_dir
    finally:
        serve.shutdown()
        ray.shutdown()


def test_two_replicas_serve_one_route(ray_server):
    url, model_dir = ray_server
    target = resolve_model(model_dir)
    prompts = [f"w{i} hello w{2 * i}" for i in range(16)]
    expected = {p: generate(target, p, drafter="none", max_new_tokens=12).text for p in prompts}

    def ask(prompt):
        r = httpx.post(
            url + "/v1/chat/completions",
            timeout=120,
            json={
                "model": "tiny",
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": 12,
                "temperature": 0,
            },
        )
        assert r.status_code == 200, r.text
        return prompt, r.json()["choices"][0]["message"]["content"], r.headers["x-leapdecode-instance"]

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(ask, prompts))
    assert {p: text for p, text, _ in answers} == expected
    assert len({instance for _, _, instance in answers}) == 2  # both replicas answered
    # the official client, streaming, through Ray's proxy
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    chunks = list(
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": prompts[0]}], max_tokens=12, temperature=0, stream=True
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected[prompts[0]]
    bad = httpx.post(url + "/v1/chat/completions", json={"model": "tiny", "messages": []}, timeout=60)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "messages"
    # the Responses API and its stored-response routes (GET and DELETE on one path) through the proxy
    response = client.responses.create(model="tiny", input=prompts[1], max_output_tokens=12, temperature=0)
    assert response.output_text == expected[prompts[1]]
    for method in ("GET", "DELETE"):
        missing = httpx.request(method, url + "/v1/responses/resp_unknown", timeout=60)
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "response_not_found"
