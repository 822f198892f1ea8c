"""OpenAI request bodies, their validation, and OpenAI's error shape.

Bodies are parsed here rather than by FastAPI so that every bad request, whatever is wrong with it (not JSON, wrong
types, out-of-range numbers, unsupported features), gets the same answer OpenAI gives: a 4xx status and
`{"error": {"message", "type", "param", "code"}}` with a one-line message naming the offending field.
Every field OpenAI or vLLM documents is either honoured or, set to anything but its neutral value, refused with a 400
naming it (fields.py), so a client never gets an answer to a different question than the one it asked. Unknown
fields are ignored, logged, and listed in the answer's `x-leapdecode-ignored-fields` header.
"""

from __future__ import annotations

import json
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError

from ..errors import LeapDecodeError
from ..prompt import RESERVED_VARIABLES, parse_chat_template
from . import fields


class APIError(Exception):
    """An error answered to the client as OpenAI's JSON error body."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        type: str = "invalid_request_error",
        headers: dict | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, _one_line(message), param, code, type
        self.headers = headers

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def _one_line(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= 500 else text[:497] + "..."


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: Optional[StrictBool] = False
    continuous_usage_stats: Optional[StrictBool] = False  # vLLM's: with include_usage, the usage so far in every chunk


Number = Union[StrictInt, float]
MAX_BAD_WORDS = 128


class _Common(BaseModel):
    """Fields shared by both endpoints, with OpenAI's ranges."""

    model_config = ConfigDict(extra="ignore")
    model: str = Field(min_length=1)
    max_tokens: Optional[StrictInt] = Field(default=None, ge=1)
    temperature: Optional[Number] = Field(default=None, ge=0.0, le=2.0)
    top_p: Optional[Number] = Field(default=None, gt=0.0, le=1.0)
    top_k: Optional[StrictInt] = Field(default=None, ge=-1)  # vLLM's -1 = off, as 0
    seed: Optional[StrictInt] = None
    stop: Optional[Union[str, list[str]]] = None
    stream: Optional[StrictBool] = False
    stream_options: Optional[StreamOptions] = None
    stream_interval: Optional[StrictInt] = Field(default=None, ge=1)  # vLLM's: tokens a streamed chunk holds at least
    n: Optional[StrictInt] = Field(default=1, ge=1, le=16)
    best_of: Optional[StrictInt] = None
    min_p: Optional[Number] = Field(default=None, ge=0.0, le=1.0)
    min_tokens: Optional[StrictInt] = Field(default=None, ge=0)
    stop_token_ids: Optional[list[StrictInt]] = None
    allowed_token_ids: Optional[list[StrictInt]] = Field(default=None, min_length=1)  # vLLM's: the only tokens out
    # vLLM's: words the answer may not contain; bounded, since every step checks each against each verified row
    bad_words: Optional[list[str]] = Field(default=None, max_length=MAX_BAD_WORDS)
    ignore_eos: Optional[StrictBool] = None
    include_stop_str_in_output: Optional[StrictBool] = None  # vLLM's: the text keeps the stop string that ended it
    skip_special_tokens: Optional[StrictBool] = None  # vLLM's: false keeps special tokens in the text
    frequency_penalty: Optional[Number] = Field(default=None, ge=-2.0, le=2.0)
    presence_penalty: Optional[Number] = Field(default=None, ge=-2.0, le=2.0)
    repetition_penalty: Optional[Number] = Field(default=None, gt=0.0)
    logit_bias: Optional[dict[str, Number]] = None  # token id (as a string, as JSON keys are) -> bias in [-100, 100]
    response_format: Optional[dict[str, Any]] = None  # OpenAI's: text, json_object, json_schema
    structured_outputs: Optional[dict[str, Any]] = None  # vLLM's: json, json_object, regex, choice, grammar
    guided_json: Optional[Union[dict[str, Any], str]] = None  # vLLM's older names for the same
    guided_regex: Optional[str] = None
    guided_choice: Optional[list[str]] = None
    guided_grammar: Optional[str] = None
    request_id: Optional[str] = Field(default=None, min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._:-]+$")
    return_token_ids: Optional[StrictBool] = None  # vLLM's: prompt_token_ids and each choice's token_ids
    return_tokens_as_token_ids: Optional[StrictBool] = None  # vLLM's: logprobs name tokens "token_id:{id}"
    prompt_logprobs: Optional[StrictInt] = Field(default=None, ge=0, le=20)  # vLLM's: each prompt token's, and top N
    # vLLM's: keep N prompt tokens (-1: as many as the context holds), the last N (left, the default) or the first
    truncate_prompt_tokens: Optional[StrictInt] = Field(default=None, ge=-1)
    truncation_side: Optional[Literal["left", "right"]] = None
    priority: Optional[StrictInt] = None  # vLLM's: under --scheduling-policy priority, lower is served first
    add_special_tokens: Optional[StrictBool] = None  # vLLM's: the tokenizer's own special tokens (e.g. BOS) or not

    def unsupported(self) -> tuple[str, str] | None:
        """(param, message) for a declared field set to something this server cannot do."""
        if self.best_of not in (None, self.n):
            return "best_of", "best_of is not supported by this server; use n"
        if self.truncate_prompt_tokens == 0:
            return "truncate_prompt_tokens", "truncate_prompt_tokens must be at least 1 (or -1: the context length)"
        return None

    def truncated(self, ids: list[int], context: int) -> list[int]:
        """The prompt's token ids as truncate_prompt_tokens and truncation_side keep them."""
        keep = context if self.truncate_prompt_tokens == -1 else self.truncate_prompt_tokens
        if keep is None or len(ids) <= keep:
            return ids
        return ids[:keep] if self.truncation_side == "right" else ids[-keep:]

    def sequences(self) -> int:
        """Engine requests this call becomes: prompts x n."""
        return self.n

    def structured(self) -> tuple[str, dict] | None:
        """(the field that asked, the grammar as RequestParams.structured_output takes it), or None; APIError(400)
        where the body asks for two or for a response_format this server does not know."""
        asked = {}
        fmt = self.response_format or {"type": "text"}
        kind = fmt.get("type")
        if kind == "json_object":
            asked["response_format"] = {"json_object": True}
        elif kind == "json_schema":
            schema = (fmt.get("json_schema") or {}).get("schema")
            if not isinstance(schema, dict):
                raise APIError(400, "response_format.json_schema.schema must be a JSON schema", "response_format")
            asked["response_format"] = {"json": schema}
        elif kind != "text":
            raise APIError(
                400, f"response_format: type must be text, json_object or json_schema, got {kind!r}", "response_format"
            )
        if self.structured_outputs:
            asked["structured_outputs"] = self.structured_outputs
        for key in ("json", "regex", "choice", "grammar"):
            if getattr(self, f"guided_{key}") is not None:
                asked[f"guided_{key}"] = {key: getattr(self, f"guided_{key}")}
        if len(asked) > 1:
            raise APIError(400, f"ask for one structured output, not {' and '.join(asked)}", next(iter(asked)))
        return next(iter(asked.items()), None)

    def num_logprobs(self) -> int | None:
        return None


class CompletionRequest(_Common):
    prompt: Union[str, list[str], list[StrictInt], list[list[StrictInt]]]
    echo: Optional[StrictBool] = False
    logprobs: Optional[StrictInt] = Field(default=None, ge=0, le=20)
    max_tokens: Optional[StrictInt] = Field(default=None, ge=0)  # 0: the echoed prompt alone (scoring it)
    suffix: Optional[str] = None  # the text after the completion: fill-in-the-middle (prompt.fill_in_the_middle)

    def unsupported(self):
        if self.suffix and self.echo:
            return "suffix", "suffix and echo do not go together (the answer is the middle, not a continuation)"
        if self.max_tokens == 0 and not self.echo and self.prompt_logprobs is None:
            return "max_tokens", "max_tokens 0 needs echo or prompt_logprobs (it scores the prompt alone)"
        return super().unsupported()

    def num_logprobs(self) -> int | None:
        """Top alternatives per output token the engine reports (None: no logprobs)."""
        return self.logprobs

    def sequences(self) -> int:
        p = self.prompt
        prompts = 1 if isinstance(p, str) or (p and isinstance(p[0], int)) else len(p)
        return prompts * self.n

    def prompts(self) -> list:
        """The prompts of the request: strings or token id lists (a list of strings or of id lists is a batch)."""
        p = self.prompt
        if isinstance(p, str) or (p and isinstance(p[0], int)):
            return [p]
        return list(p)


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, list[dict], None] = None
    name: Optional[str] = None  # passed to the chat template, as vLLM does
    tool_calls: Optional[list[dict[str, Any]]] = None  # an assistant's calls, sent back in the history
    tool_call_id: Optional[str] = None  # a tool message answers this call

    def text(self, index: int) -> str:
        return text_of(self.content, f"messages.{index}.content")


def text_of(content: str | list[dict] | None, param: str) -> str:
    """A content field's text: a string, or the concatenation of its text parts; APIError(400) for other parts."""
    if content is None or isinstance(content, str):
        return content or ""
    parts = []
    for part in content:
        if part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise APIError(400, f"{param}: only text parts are supported", param)
        parts.append(part["text"])
    return "".join(parts)


class Prediction(BaseModel):
    """OpenAI's Predicted Outputs: text the answer is expected to largely repeat (drafters.prediction copies it)."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["content"]
    content: Union[str, list[dict]]


class ChatTemplateFields(BaseModel):
    """How chat messages are rendered (vLLM's fields; chat completions and /tokenize)."""

    add_generation_prompt: Optional[StrictBool] = True  # the template opens the assistant's turn
    continue_final_message: Optional[StrictBool] = False  # the answer continues the last message (prefill)
    chat_template_kwargs: Optional[dict[str, Any]] = None  # more variables for the chat template
    documents: Optional[list[dict[str, str]]] = None  # for a template that renders them (HF's `documents`)
    chat_template: Optional[str] = None  # this request's own template (needs --trust-request-chat-template)

    def template_problem(self) -> tuple[str, str] | None:
        """(param, message) for template fields that cannot go together, or None."""
        if self.continue_final_message and self.add_generation_prompt is not False:
            return "continue_final_message", "continue_final_message needs add_generation_prompt set to false"
        clash = sorted(RESERVED_VARIABLES & set(self.chat_template_kwargs or ()))
        if clash:
            return "chat_template_kwargs", f"chat_template_kwargs may not set {', '.join(clash)}: use its own field"
        return None

    def template_options(self) -> dict:
        """prompt.encode_prompt's template options this request asks for."""
        return dict(
            continue_final=bool(self.continue_final_message),
            generation_prompt=self.add_generation_prompt is not False,
            documents=self.documents,
            variables=self.chat_template_kwargs,
            template=self.chat_template,
        )

    def check_own_template(self, trusted: bool) -> None:
        """APIError(400) for a request's own `chat_template` unless the server trusts them and it parses."""
        if self.chat_template is None:
            return
        if not trusted:
            raise APIError(
                400,
                "chat_template: a template per request is taken only from a server started with "
                "--trust-request-chat-template (or start it with --chat-template for every request)",
                "chat_template",
            )
        try:
            parse_chat_template(self.chat_template)
        except LeapDecodeError as e:
            raise APIError(400, f"chat_template: {e}", "chat_template") from None

    def template_of(self, tokenizer):
        """The chat template this request renders with: its own, else the tokenizer's (None where neither has one)."""
        return self.chat_template if self.chat_template is not None else getattr(tokenizer, "chat_template", None)


class ChatCompletionRequest(_Common, ChatTemplateFields):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: Optional[StrictInt] = Field(default=None, ge=1)
    logprobs: Optional[StrictBool] = False
    top_logprobs: Optional[StrictInt] = Field(default=None, ge=0, le=20)
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Optional[Union[str, dict[str, Any]]] = None
    parallel_tool_calls: Optional[StrictBool] = None
    echo: Optional[StrictBool] = False  # vLLM's: the answer starts with the last message where it is the assistant's
    prediction: Optional[Prediction] = None  # OpenAI's Predicted Outputs

    def unsupported(self):
        if self.top_logprobs is not None and not self.logprobs:
            return "top_logprobs", "top_logprobs needs logprobs set to true"
        return self.template_problem() or super().unsupported()

    def num_logprobs(self) -> int | None:
        """Top alternatives per output token the engine reports (None: no logprobs)."""
        return (self.top_logprobs or 0) if self.logprobs else None

    def chat(self) -> list[dict]:
        return chat_messages(self.messages)

    def predicted(self) -> str:
        """The prediction's text ("" for none)."""
        return "" if self.prediction is None else text_of(self.prediction.content, "prediction.content")

    def echoed(self) -> str:
        """What `echo` puts before the answer: the last message's text where it is the assistant's, else nothing."""
        last = self.messages[-1]
        return last.text(len(self.messages) - 1) if self.echo and last.role == "assistant" else ""


def chat_messages(messages: list[Message]) -> list[dict]:
    """The messages as the chat template takes them (serve/tools.py puts an assistant's tool_calls in its form)."""
    out = []
    for i, m in enumerate(messages):
        message = {"role": "system" if m.role == "developer" else m.role, "content": m.text(i)}
        for key in ("name", "tool_calls", "tool_call_id"):
            if getattr(m, key) is not None:
                message[key] = getattr(m, key)
        out.append(message)
    return out


def json_object(raw: bytes) -> dict:
    """The request body as a JSON object; APIError(400) where it is not one."""
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise APIError(
            400, f"the request body is not valid JSON: {getattr(e, 'msg', e)}", code="invalid_json"
        ) from None
    if not isinstance(data, dict):
        raise APIError(400, "the request body must be a JSON object")
    return data


def validated(model_class: type[BaseModel], data: dict, unions: tuple[str, ...] = ()):
    """`data` as a `model_class`; APIError(400) naming the first bad field (a field of `unions` by itself: a union
    reports each alternative, and the field is what the client needs to fix)."""
    try:
        return model_class.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        param = ".".join(str(x) for x in first["loc"]) or None
        top = str(first["loc"][0]) if first["loc"] else None
        if top in unions and first["type"] != "missing":
            param, msg = top, _union_message(top)
        else:
            msg = first["msg"]
        raise APIError(400, f"{param}: {msg}" if param else msg, param=param) from None


def parse(model_class: type[_Common], raw: bytes) -> tuple[_Common, list[str]]:
    """A validated request from the raw body, and the unknown fields it had (ignored); APIError(400) naming the
    first bad or unsupported field otherwise."""
    data = json_object(raw)
    chat = model_class is ChatCompletionRequest
    bad, unknown = fields.check(data, set(model_class.model_fields), fields.refused(chat), chat)
    if bad:
        raise APIError(400, bad[1], param=bad[0], code="unsupported_parameter")
    request = validated(model_class, data, ("prompt", "stop"))
    bad = request.unsupported()
    if bad:
        raise APIError(400, bad[1], param=bad[0], code="unsupported_parameter")
    return request, unknown


def _union_message(field: str) -> str:
    return {
        "prompt": "must be a string, a list of strings, a list of token ids or a list of token id lists",
        "stop": "must be a string or a list of strings",
    }[field]


def usage(prompt_tokens: int, completion_tokens: int, prediction: tuple[int, int] | None = None) -> dict[str, Any]:
    """OpenAI's usage object; `prediction`: (accepted, rejected) prediction tokens, for a call with a prediction."""
    out = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    if prediction is not None:
        accepted, rejected = prediction
        out["completion_tokens_details"] = {
            "accepted_prediction_tokens": accepted,
            "rejected_prediction_tokens": rejected,
        }
    return out
