"""OpenAI request bodies, their validation, and OpenAI's error shape.

Bodies are parsed here rather than by FastAPI so that every bad request, whatever is wrong with it (not JSON, wrong
types, out-of-range numbers, unsupported features), gets the same answer OpenAI gives: a 4xx status and
`{"error": {"message", "type", "param", "code"}}` with a one-line message naming the offending field.
Unknown fields are ignored, as OpenAI-compatible servers do; known ones that this server cannot honour (logprobs,
penalties, tools, ...) are refused rather than silently dropped, so a client never gets an answer to a different
question than the one it asked.
"""

from __future__ import annotations

import json
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError


class APIError(Exception):
    """An error answered to the client as OpenAI's JSON error body."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        type: str = "invalid_request_error",
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, _one_line(message), param, code, type

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def _one_line(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= 500 else text[:497] + "..."


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: Optional[StrictBool] = False


Number = Union[StrictInt, float]


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
    n: Optional[StrictInt] = Field(default=1, ge=1, le=16)
    presence_penalty: Optional[Number] = None
    frequency_penalty: Optional[Number] = None
    repetition_penalty: Optional[Number] = None
    logit_bias: Optional[dict] = None
    best_of: Optional[StrictInt] = None
    user: Optional[str] = None

    def unsupported(self) -> tuple[str, str] | None:
        """(param, message) for a field set to something this server cannot do."""
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name) not in (None, 0, 0.0):
                return (
                    name,
                    f"{name} is not supported by this server (speculative decoding keeps the model's own distribution); leave it at 0",
                )
        if self.repetition_penalty not in (None, 1, 1.0):
            return "repetition_penalty", "repetition_penalty is not supported by this server; leave it at 1"
        if self.logit_bias:
            return "logit_bias", "logit_bias is not supported by this server"
        if self.best_of not in (None, self.n):
            return "best_of", "best_of is not supported by this server; use n"
        return None


class CompletionRequest(_Common):
    prompt: Union[str, list[str], list[StrictInt], list[list[StrictInt]]]
    echo: Optional[StrictBool] = False
    logprobs: Optional[StrictInt] = None
    suffix: Optional[str] = None

    def unsupported(self):
        if self.logprobs not in (None, 0):
            return "logprobs", "logprobs are not supported by this server"
        if self.suffix:
            return "suffix", "suffix is not supported by this server"
        return super().unsupported()

    def prompts(self) -> list:
        """The prompts of the request: strings or token id lists (a list of strings or of id lists is a batch)."""
        p = self.prompt
        if isinstance(p, str) or (p and isinstance(p[0], int)):
            return [p]
        return list(p)


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant"]
    content: Union[str, list[dict], None] = None

    def text(self, index: int) -> str:
        if isinstance(self.content, str):
            return self.content
        if self.content is None:
            return ""
        parts = []
        for part in self.content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise APIError(
                    400, f"messages[{index}].content: only text parts are supported", f"messages.{index}.content"
                )
            parts.append(part["text"])
        return "".join(parts)


class ChatCompletionRequest(_Common):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: Optional[StrictInt] = Field(default=None, ge=1)
    logprobs: Optional[StrictBool] = False
    top_logprobs: Optional[StrictInt] = None
    tools: Optional[list] = None
    response_format: Optional[dict] = None

    def unsupported(self):
        if self.logprobs or self.top_logprobs:
            return "logprobs", "logprobs are not supported by this server"
        if self.tools:
            return "tools", "tools are not supported by this server"
        if self.response_format and self.response_format.get("type", "text") != "text":
            return "response_format", 'only response_format {"type": "text"} is supported by this server'
        return super().unsupported()

    def chat(self) -> list[dict]:
        return [
            {"role": "system" if m.role == "developer" else m.role, "content": m.text(i)}
            for i, m in enumerate(self.messages)
        ]


def parse(model_class: type[_Common], raw: bytes) -> _Common:
    """A validated request from the raw body; APIError(400) naming the first bad field otherwise."""
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise APIError(
            400, f"the request body is not valid JSON: {getattr(e, 'msg', e)}", code="invalid_json"
        ) from None
    if not isinstance(data, dict):
        raise APIError(400, "the request body must be a JSON object")
    try:
        request = model_class.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        param = ".".join(str(x) for x in first["loc"]) or None
        # a union reports each alternative; the field itself is what the client needs to fix
        top = str(first["loc"][0]) if first["loc"] else None
        if top in ("prompt", "stop") and first["type"] != "missing":
            param, msg = top, _union_message(top)
        else:
            msg = first["msg"]
        raise APIError(400, f"{param}: {msg}" if param else msg, param=param) from None
    bad = request.unsupported()
    if bad:
        raise APIError(400, bad[1], param=bad[0], code="unsupported_parameter")
    return request


def _union_message(field: str) -> str:
    return {
        "prompt": "must be a string, a list of strings, a list of token ids or a list of token id lists",
        "stop": "must be a string or a list of strings",
    }[field]


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
