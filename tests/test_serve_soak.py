"""Reliability soak against a live `leapdecode serve` process on 127.0.0.1 (tiny local model, speculation on):
200 well-formed requests at concurrency 100 (chat and completions, streamed or not), a fifth of them dropping the
connection mid-stream, interleaved with malformed ones. Every well-formed request that stays connected returns its
solo greedy decode; every bad one an OpenAI-style JSON error with a 4xx status and a one-line message; the server
stays up, and afterwards no request runs, no KV is held, and the process's memory is within 10 % of its size before.

Also a documented command: `pytest tests/test_serve_soak.py -m slow -s` prints the soak's summary line."""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import subprocess
import sys
import time

import httpx
import openai
import pytest
from tiny_hf import make_tiny_hf_dir

from leapdecode import generate
from leapdecode.models import resolve_model
from leapdecode.serve.server import free_port

pytestmark = [pytest.mark.slow, pytest.mark.tiny]

KEY = "soak-key"
GOOD, CONCURRENCY, DROP_EVERY, MAX_TOKENS = 200, 100, 5, 24
LONG_RUNNER = "w1 w7"  # raw, greedy: no end of sequence for 150 tokens on this model (see test_serve.py)
PROMPTS = [f"w{i} w{(3 * i) % 60} hello w{(7 * i) % 60}" for i in range(20)]


def rss_bytes(pid: int) -> int:
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def scrape(url: str) -> dict[str, float]:
    values = {}
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            values[name.split("{")[0]] = values.get(name.split("{")[0], 0.0) + float(value)
    return values


def scrape_abort(url: str) -> float:
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("vllm:request_success_total{") and 'finished_reason="abort"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    model_dir = str(make_tiny_hf_dir(tmp_path_factory.mktemp("soak") / "tiny", context=160))
    port = free_port()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    log = open(tmp_path_factory.mktemp("soak-log") / "server.log", "w+")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "leapdecode.cli",
            "serve",
            "--model",
            model_dir,
            "--port",
            str(port),
            "--served-model-name",
            "tiny",
            "--drafter",
            "prompt-lookup",
            "--api-key",
            KEY,
            "--threads",
            "1",
            "--max-sequences",
            "32",
            "--log-level",
            "warning",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while True:
        assert proc.poll() is None, pathlib.Path(log.name).read_text()[-2000:]
        assert time.monotonic() < deadline, "the server did not start"
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    yield url, proc, model_dir
    proc.terminate()
    proc.wait(30)
    log.close()


def references(model_dir: str) -> dict[tuple[str, bool], tuple[str, str]]:
    """(prompt, chat) -> (text, finish_reason) of plain greedy decoding of the request alone."""
    target = resolve_model(model_dir)
    out = {}
    for prompt in PROMPTS:
        for chat in (True, False):
            r = generate(target, prompt, drafter="none", max_new_tokens=MAX_TOKENS, raw=not chat)
            out[(prompt, chat)] = (r.text, "stop" if r.stats.stop_reason == "eos" else "length")
    return out


def bad_requests(url: str) -> list[tuple[str, dict, bytes, int]]:
    """(what, headers, body, expected status) of each kind of malformed request."""
    auth = {"authorization": f"Bearer {KEY}", "content-type": "application/json"}

    def body(**fields) -> bytes:
        return json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "hello"}], **fields}).encode()

    return [
        ("invalid json", auth, b'{"model": "tiny", "messages": [', 400),
        ("unknown model", auth, body(model="gpt-9"), 404),
        ("negative max_tokens", auth, body(max_tokens=-1), 400),
        ("huge max_tokens", auth, body(max_tokens=10**12), 400),
        ("temperature < 0", auth, body(temperature=-0.1), 400),
        ("prompt beyond context", auth, body(messages=[{"role": "user", "content": " ".join(["w3"] * 400)}]), 400),
        ("empty messages", auth, body(messages=[]), 400),
        ("wrong API key", {**auth, "authorization": "Bearer nope"}, body(), 401),
        ("10 MB body", auth, b'{"model": "tiny", "prompt": "' + b"w1 " * (10 * 1024 * 1024 // 3) + b'"}', 413),
    ]


async def soak(url: str, refs: dict) -> dict:
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=300)
    raw = httpx.AsyncClient(timeout=300)
    gate = asyncio.Semaphore(CONCURRENCY)
    bad = bad_requests(url)
    result = {"ok": 0, "mismatch": [], "dropped": 0, "bad_ok": 0, "bad_wrong": []}

    async def good(i: int):
        prompt, chat, stream = PROMPTS[i % len(PROMPTS)], i % 2 == 0, i % 3 != 0
        drop = i % DROP_EVERY == DROP_EVERY - 1
        async with gate:
            if drop:  # read the first chunk, then go away (a prompt whose greedy output runs to max_tokens)
                kwargs = dict(model="tiny", max_tokens=120, temperature=0, stream=True, stop=["never-there"])
                s = await client.completions.create(prompt=LONG_RUNNER, **kwargs)
                async for _ in s:
                    break
                await s.close()
                result["dropped"] += 1
                return
            kwargs = dict(model="tiny", max_tokens=MAX_TOKENS, temperature=0, stream=stream)
            if chat:
                r = await client.chat.completions.create(messages=[{"role": "user", "content": prompt}], **kwargs)
            else:
                r = await client.completions.create(prompt=prompt, **kwargs)
            if stream:
                text, reason = "", None
                async for c in r:
                    if c.choices:
                        text += (c.choices[0].delta.content if chat else c.choices[0].text) or ""
                        reason = c.choices[0].finish_reason or reason
            else:
                text = r.choices[0].message.content if chat else r.choices[0].text
                reason = r.choices[0].finish_reason
            if (text, reason) == refs[(prompt, chat)]:
                result["ok"] += 1
            else:
                result["mismatch"].append((i, prompt, chat, stream, text, reason, refs[(prompt, chat)]))

    async def malformed(j: int):
        what, headers, content, status = bad[j % len(bad)]
        path = "/v1/completions" if what == "10 MB body" else "/v1/chat/completions"
        async with gate:
            r = await raw.post(url + path, content=content, headers=headers)
        try:
            err = r.json()["error"]
            shaped = (
                set(err) == {"message", "type", "param", "code"}
                and err["type"] == "invalid_request_error"
                and err["message"]
                and "\n" not in err["message"]
            )
        except (ValueError, KeyError, TypeError):
            shaped = False
        if r.status_code == status and shaped:
            result["bad_ok"] += 1
        else:
            result["bad_wrong"].append((what, r.status_code, r.text[:200]))

    tasks = []
    for i in range(GOOD):
        tasks.append(good(i))
        if i % 5 == 0:  # interleave the malformed ones
            tasks.append(malformed(i // 5))
    await asyncio.gather(*tasks)
    await client.close()
    await raw.aclose()
    return result


def test_soak(live):
    url, proc, model_dir = live
    refs = references(model_dir)
    # warm-up at full batch size, then the size to come back to
    warm = asyncio.run(_warm(url))
    assert warm == 64
    before = rss_bytes(proc.pid)
    start = time.monotonic()
    result = asyncio.run(soak(url, refs))
    elapsed = time.monotonic() - start
    assert not result["mismatch"], f"{len(result['mismatch'])} mismatches, first: {result['mismatch'][:2]}"
    assert not result["bad_wrong"], result["bad_wrong"][:3]
    assert result["ok"] == GOOD - GOOD // DROP_EVERY and result["dropped"] == GOOD // DROP_EVERY
    assert result["bad_ok"] == GOOD // 5
    assert proc.poll() is None and httpx.get(url + "/health").json()["status"] == "ok"
    deadline = time.monotonic() + 30
    while True:
        m = scrape(url)
        idle = (
            m["vllm:num_requests_running"],
            m["vllm:num_requests_waiting"],
            m["leapdecode:kv_cache_tokens"],
            m["leapdecode:kv_cache_bytes"],
        )
        if idle == (0, 0, 0, 0) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert idle == (0, 0, 0, 0)
    assert m["vllm:request_success_total"] >= GOOD
    # dropped streams are cancelled in the engine, not decoded to the end (most are still running when dropped)
    aborts = scrape_abort(url)
    assert 1 <= aborts <= GOOD // DROP_EVERY
    after = rss_bytes(proc.pid)
    assert abs(after - before) <= 0.10 * before, (before, after)
    print(
        f"\nsoak: {result['ok']} completed identical to solo greedy, {result['dropped']} dropped mid-stream, "
        f"({aborts:.0f} cancelled in the engine), {result['bad_ok']} malformed answered 4xx, {elapsed:.1f} s; after: running 0, KV 0 tokens; "
        f"RSS {before / 2**20:.0f} -> {after / 2**20:.0f} MiB"
    )


async def _warm(url: str) -> int:
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=300)
    rs = await asyncio.gather(
        *(
            client.chat.completions.create(
                model="tiny",
                messages=[{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
                max_tokens=MAX_TOKENS,
                temperature=0,
            )
            for i in range(64)
        )
    )
    await client.close()
    return len(rs)
