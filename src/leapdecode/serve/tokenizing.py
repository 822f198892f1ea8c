"""Tokenizing and chat templating off the event loop, with tokenizers of the server's own.

A 4 MiB prompt takes seconds to tokenize; on the event loop that would stall every stream. Here each worker thread
owns a private copy of the model's tokenizer (copied before the engine thread starts), so the server never shares a
tokenizer object with the engine (which decodes its outputs with its own, under its own lock) nor between its own
threads: a fast tokenizer is not safe to use from two threads at once. Fast tokenizers release the GIL while they
encode, so the event loop and the engine thread keep running meanwhile.

Also the bodies of vLLM's /tokenize and /detokenize routes.
"""

from __future__ import annotations

import asyncio
import copy
import queue
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt

from ..errors import LeapDecodeError
from ..prompt import chat_text, encode_prompt, fill_in_the_middle
from .protocol import APIError, ChatTemplateFields, Message, chat_messages
from .tools import ToolChoice, template_history

WORKERS = 2


class TokenizerPool:
    def __init__(self, tokenizer, workers: int = WORKERS):
        self._free: queue.SimpleQueue = queue.SimpleQueue()
        self.copies = [copy.deepcopy(tokenizer) for _ in range(workers)]
        for tokenizer_copy in self.copies:
            self._free.put(tokenizer_copy)
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix="leapdecode-tokenize")
        self.vocab = len(tokenizer)
        self.strings: dict[int, str] = {}  # token id -> its text (logprobs), filled as needed, on the event loop

    async def run(self, fn, *args) -> Any:
        """`fn(tokenizer, *args)` on a worker thread with a tokenizer no other thread uses meanwhile."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, self._call, fn, args)

    def _call(self, fn, args):
        tokenizer = self._free.get()
        try:
            return fn(tokenizer, *args)
        finally:
            self._free.put(tokenizer)

    async def token_strings(self, ids) -> dict[int, str]:
        """The text of each token alone (special tokens spelled out, as vLLM's logprobs show them)."""
        missing = sorted(set(ids) - set(self.strings))
        if missing:
            texts = await self.run(lambda tok: [tok.decode([t], skip_special_tokens=False) for t in missing])
            self.strings.update(zip(missing, texts))
        return self.strings

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def encode_all(tokenizer, prompts: list, chat: bool, param: str, tools: list[dict] | None = None, **options):
    """Token ids of each prompt, as the engine would encode them (chat: the template, with `tools` if any; completions:
    raw; `options`: prompt.encode_prompt's template options and `special_tokens`)."""
    out = []
    for i, prompt in enumerate(prompts):
        where = param if len(prompts) == 1 else f"{param}[{i}]"
        try:
            ids = encode_prompt(tokenizer, prompt, raw=not chat, tools=tools, **options)
        except LeapDecodeError as e:
            raise APIError(400, f"{where}: {e}", param=param) from None
        except Exception as e:  # the chat template raised (its own checks, e.g. roles that must alternate)
            raise APIError(400, f"{where}: the chat template refused it: {type(e).__name__}", param=param) from None
        if not ids:
            raise APIError(400, f"{where}: the prompt is empty", param=param)
        out.append(ids)
    return out


def fim_all(tokenizer, prompts: list, suffix: str) -> list[list[int]]:
    """Token ids of each (text) prompt followed by `suffix`, as a fill-in-the-middle request (completions' suffix)."""
    out = []
    for prompt in prompts:
        if not isinstance(prompt, str):
            raise APIError(400, "suffix: the prompt must be text, not token ids", param="suffix")
        try:
            out.append(fill_in_the_middle(tokenizer, prompt, suffix))
        except LeapDecodeError as e:
            raise APIError(400, f"suffix: {e}", param="suffix") from None
    return out


def decode(tokenizer, ids: list[int], skip_special: bool = True) -> str:
    return tokenizer.decode(ids, skip_special_tokens=skip_special)


# ---- /tokenize and /detokenize (vLLM's shapes) ----------------------------------------------------------------------


class TokenizeRequest(ChatTemplateFields):
    model_config = ConfigDict(extra="ignore")
    model: Optional[str] = None
    prompt: Optional[str] = None
    messages: Optional[list[Message]] = Field(default=None, min_length=1)
    add_special_tokens: Optional[StrictBool] = None
    tools: Optional[list[dict[str, Any]]] = None
    return_token_strs: Optional[StrictBool] = False


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: Optional[str] = None
    tokens: list[StrictInt]


def tokenize(tokenizer, body: TokenizeRequest) -> dict:
    if (body.prompt is None) == (body.messages is None):
        raise APIError(400, "send either prompt or messages", param="prompt")
    if body.prompt is not None:
        ids = tokenizer(body.prompt, add_special_tokens=body.add_special_tokens is not False)["input_ids"]
    else:
        ids = tokenizer(_chat_text(tokenizer, body), add_special_tokens=bool(body.add_special_tokens))["input_ids"]
    strs: Union[list[str], None] = tokenizer.convert_ids_to_tokens(ids) if body.return_token_strs else None
    return {"count": len(ids), "tokens": ids, "token_strs": strs}


def _chat_text(tokenizer, body: TokenizeRequest) -> str:
    """The template's text of the messages, as a chat completion with the same fields renders it."""
    template = body.template_of(tokenizer)
    if template is None:
        raise APIError(400, "messages: the model has no chat template", param="messages")
    problem = body.template_problem()
    if problem is not None:
        raise APIError(400, problem[1], param=problem[0])
    tools = ToolChoice(body.tools, None, None).template_tools() if body.tools else None
    messages = template_history(template, chat_messages(body.messages))
    try:
        return chat_text(tokenizer, messages, tools, **body.template_options())
    except Exception as e:  # the chat template raised (its own checks, e.g. roles that must alternate)
        raise APIError(400, f"messages: the chat template refused it: {type(e).__name__}", param="messages") from None


def detokenize(tokenizer, body: DetokenizeRequest, vocab: int) -> dict:
    bad = next((t for t in body.tokens if not 0 <= t < vocab), None)
    if bad is not None:
        raise APIError(400, f"tokens: token id {bad} is outside the vocabulary of {vocab}", param="tokens")
    return {"prompt": tokenizer.decode(body.tokens)}
