"""vLLM's `add_special_tokens` over HTTP, on a tokenizer that adds a BOS as Llama's does: completions add it by
default and not with false; a chat template's text gets none by default and one with true. The answer is that of
`generate` on the same token ids alone."""

from __future__ import annotations

import pytest
from live_server import client_of, served
from tiny_hf import WORDS, _save
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from leapdecode import generate
from leapdecode.models import resolve_model

BOS = len(WORDS)  # a word of its own after the usual ones: the other ids stay those of tiny_hf


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    words = WORDS + ["<s>"]
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", BOS)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="<eos>", bos_token="<s>")
    path = _save(tmp_path_factory.mktemp("bos") / "tiny", tokenizer, context=128, seed=0, eos=1)
    return resolve_model(str(path))


@pytest.fixture(scope="module")
def client(target):
    with served(target) as (url, _):
        yield client_of(url)


def prompt_ids(response) -> list[int]:
    extra = response.model_extra if "prompt_token_ids" in response.model_extra else response.choices[0].model_extra
    return extra["prompt_token_ids"]


@pytest.mark.parametrize("special", [None, True, False])
def test_completions(client, target, special):
    extra = {"return_token_ids": True} | ({} if special is None else {"add_special_tokens": special})
    r = client.completions.create(model="tiny", prompt="w1 w2 w3", max_tokens=6, temperature=0, extra_body=extra)
    words = target.tokenizer("w1 w2 w3", add_special_tokens=False)["input_ids"]
    ids = prompt_ids(r)
    assert ids == ([BOS] + words if special is not False else words)
    assert r.choices[0].text == generate(target, ids, max_new_tokens=6, prefix_cache=False).text


@pytest.mark.parametrize("special", [None, False, True])
def test_chat(client, target, special):
    messages = [{"role": "user", "content": "hello w4 w5"}]
    extra = {"return_token_ids": True} | ({} if special is None else {"add_special_tokens": special})
    r = client.chat.completions.create(model="tiny", messages=messages, max_tokens=6, temperature=0, extra_body=extra)
    text = target.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    templated = target.tokenizer(text, add_special_tokens=False)["input_ids"]
    ids = prompt_ids(r)
    assert ids == ([BOS] + templated if special else templated)
    assert r.choices[0].message.content == generate(target, ids, max_new_tokens=6, prefix_cache=False).text
