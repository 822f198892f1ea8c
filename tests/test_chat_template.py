"""vLLM's `--chat-template` (`leapdecode serve` and `generate`, `Engine(chat_template=...)`): chat messages are
rendered with the given template (a file or its text) instead of the model's own, everywhere the server renders them
(completions, /tokenize, tool history), without changing the loaded model's tokenizer; a template that does not
parse is one line at start. A request's own `chat_template` is taken only with --trust-request-chat-template."""

from __future__ import annotations

import json

import httpx
import pytest
from live_server import client_of, served
from tiny_hf import CHAT_TEMPLATE, make_tiny_hf_dir

from leapdecode import generate
from leapdecode.cli import main
from leapdecode.engine import Engine
from leapdecode.errors import LeapDecodeError
from leapdecode.models import resolve_model
from leapdecode.prompt import read_chat_template
from leapdecode.serve.security import Security

TEMPLATE = "{{ 'w9 w9 ' }}" + CHAT_TEMPLATE  # the tiny template behind two words of its own
MESSAGES = [{"role": "user", "content": "hello w1 w2"}]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return str(make_tiny_hf_dir(tmp_path_factory.mktemp("template") / "tiny", context=128))


@pytest.fixture(scope="module")
def target(tiny_dir):
    return resolve_model(tiny_dir)


def rendered(target, template=TEMPLATE) -> list[int]:
    text = target.tokenizer.apply_chat_template(
        MESSAGES, chat_template=template, add_generation_prompt=True, tokenize=False
    )
    return target.tokenizer(text, add_special_tokens=False)["input_ids"]


def test_read_chat_template(tmp_path):
    path = tmp_path / "t.jinja"
    path.write_text(TEMPLATE)
    assert read_chat_template(str(path)) == TEMPLATE == read_chat_template(TEMPLATE)
    with pytest.raises(LeapDecodeError, match="does not parse"):
        read_chat_template("{% for m in messages %}{{ m }}")
    with pytest.raises(LeapDecodeError, match="neither a file nor"):
        read_chat_template(str(tmp_path / "missing.jinja"))


def test_the_engine_renders_with_it_and_leaves_the_model_as_it_was(target):
    own = target.tokenizer.chat_template
    (result,) = Engine(target, chat_template=TEMPLATE).generate_many([MESSAGES], max_new_tokens=4)
    assert result.prompt_ids == rendered(target) != rendered(target, own)
    assert result.token_ids == generate(target, rendered(target), max_new_tokens=4, prefix_cache=False).token_ids
    assert target.tokenizer.chat_template == own
    (plain,) = Engine(target).generate_many([MESSAGES], max_new_tokens=4)
    assert plain.prompt_ids == rendered(target, own)


def test_the_server_renders_with_it_everywhere(target):
    with served(target, chat_template=TEMPLATE) as (url, _):
        r = client_of(url).chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=4, temperature=0, extra_body={"return_token_ids": True}
        )
        assert r.model_extra["prompt_token_ids"] == rendered(target)
        count = httpx.post(url + "/tokenize", json={"model": "tiny", "messages": MESSAGES}).json()["count"]
        assert count == len(rendered(target)) == r.usage.prompt_tokens
        refused = httpx.post(
            url + "/v1/chat/completions", json={"model": "tiny", "messages": MESSAGES, "chat_template": "{{ 1 }}"}
        )
        assert refused.status_code == 400 and "--trust-request-chat-template" in refused.json()["error"]["message"]


def test_a_request_brings_its_own_template_where_the_server_trusts_it(target):
    """vLLM's --trust-request-chat-template: a chat request's `chat_template` renders its messages (the completion and
    /tokenize alike) and only its; one that does not parse is a 400 naming it."""
    own = {"model": "tiny", "messages": MESSAGES, "chat_template": TEMPLATE}
    with served(target, {"security": Security(trust_request_chat_template=True)}) as (url, _):
        client = client_of(url)
        extra = {"chat_template": TEMPLATE, "return_token_ids": True}
        r = client.chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=4, temperature=0, extra_body=extra
        )
        assert r.model_extra["prompt_token_ids"] == rendered(target)
        alone = generate(target, rendered(target), max_new_tokens=4, prefix_cache=False)
        assert r.choices[0].model_extra["token_ids"] == alone.token_ids
        assert httpx.post(url + "/tokenize", json=own).json()["count"] == len(rendered(target))
        plain = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=1, temperature=0)
        assert plain.usage.prompt_tokens == len(rendered(target, target.tokenizer.chat_template))
        for path in ("/v1/chat/completions", "/tokenize"):
            bad = httpx.post(url + path, json={**own, "chat_template": "{% for m in messages %}{{ m }}"})
            assert bad.status_code == 400 and bad.json()["error"]["param"] == "chat_template", path
            assert "does not parse" in bad.json()["error"]["message"]


def test_generate_cli(capsys, tiny_dir, tmp_path):
    path = tmp_path / "t.jinja"
    path.write_text(TEMPLATE)
    assert main(["generate", "hello w1 w2", "--model", tiny_dir, "--chat-template", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["prompt_tokens"] == len(rendered(resolve_model(tiny_dir)))
    assert main(["generate", "hi", "--model", tiny_dir, "--chat-template", "{% if %}"]) == 2
    err = capsys.readouterr().err.strip()
    assert "does not parse" in err and len(err.splitlines()) == 1


def test_serve_flag_reaches_the_server_settings():
    from leapdecode.cli import build_parser
    from leapdecode.serve.cli import server_options

    for argv, trusted in (([], False), (["--trust-request-chat-template"], True)):
        args = build_parser().parse_args(["serve", *argv])
        assert server_options(args)["security"].trust_request_chat_template is trusted
