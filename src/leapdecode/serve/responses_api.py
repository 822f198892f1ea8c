"""OpenAI's Responses API (`POST /v1/responses`, `GET` and `DELETE /v1/responses/{id}`) over the chat path.

A Responses call is a chat call in another shape: `instructions` and `input` (a string, or items: messages with text
parts, the model's earlier `function_call`s and their `function_call_output`s) become chat messages, `text.format`
becomes `response_format`, flat function tools become chat tools. The call then runs as a chat completion does (the
same jobs, engine requests, admission, deadlines and lossless decoding) and its answer is reshaped into output items:
a `message` with `output_text`, and `function_call` items. Streaming sends the Responses events (`response.created`,
`response.output_text.delta`, ..., `response.completed`), each with its `sequence_number`; an answer cut by
`max_output_tokens` ends with `response.completed` holding status "incomplete", as vLLM sends it (the `openai`
client's stream helper waits for that event).

`store` (OpenAI's default: true) keeps a finished response in a bounded in-memory store (least recently used out
first), so `previous_response_id` can continue a conversation and `GET /v1/responses/{id}` return it; a restart
forgets them. Fields this server cannot honour are refused with a 400 naming them (fields.RESPONSES_REFUSED).
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError

from . import fields
from .protocol import APIError, ChatCompletionRequest, Number, json_object, validated
from .response_store import not_found

LOGPROBS_INCLUDE = "message.output_text.logprobs"


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str = Field(min_length=1)
    input: Union[str, list[dict[str, Any]]]
    instructions: Optional[str] = None
    max_output_tokens: Optional[StrictInt] = Field(default=None, ge=1)
    temperature: Optional[Number] = Field(default=None, ge=0.0, le=2.0)
    top_p: Optional[Number] = Field(default=None, gt=0.0, le=1.0)
    top_k: Optional[StrictInt] = Field(default=None, ge=-1)  # vLLM's sampling extras, as on the chat endpoint
    min_p: Optional[Number] = Field(default=None, ge=0.0, le=1.0)
    seed: Optional[StrictInt] = None
    repetition_penalty: Optional[Number] = Field(default=None, gt=0.0)
    priority: Optional[StrictInt] = None  # vLLM's, as on the chat endpoint
    stream: Optional[StrictBool] = False
    text: Optional[dict[str, Any]] = None
    tools: Optional[list[dict[str, Any]]] = None
    tool_choice: Optional[Union[str, dict[str, Any]]] = None
    parallel_tool_calls: Optional[StrictBool] = None
    top_logprobs: Optional[StrictInt] = Field(default=None, ge=0, le=20)
    include: Optional[list[str]] = None
    store: Optional[StrictBool] = True
    previous_response_id: Optional[str] = None
    metadata: Optional[dict[str, str]] = None
    user: Optional[str] = None


class ResponsesCall:
    """One `POST /v1/responses`: `body` is the chat request it runs as; `collect` and `events` give its answer."""

    chat = True

    def __init__(self, state, raw: bytes):
        self.state = state
        data = json_object(raw)
        bad, self.ignored = fields.check(data, set(ResponsesRequest.model_fields), fields.RESPONSES_REFUSED)
        if bad:
            raise APIError(400, bad[1], param=bad[0], code="unsupported_parameter")
        self.request = request = validated(ResponsesRequest, data)
        history = []
        if request.previous_response_id is not None:
            stored = state.responses.get(request.previous_response_id)
            if stored is None:
                raise not_found(request.previous_response_id, "previous_response_id")
            history = stored[1]
        self.conversation = history + input_messages(request.input)  # what a later call continues from
        system = [{"role": "system", "content": request.instructions}] if request.instructions else []
        logprobs = request.top_logprobs is not None or LOGPROBS_INCLUDE in (request.include or ())
        chat = {
            "model": request.model,
            "messages": system + self.conversation,
            "stream": request.stream,
            "max_tokens": request.max_output_tokens,
            "temperature": request.temperature,
            "top_p": request.top_p,
            "top_k": request.top_k,
            "min_p": request.min_p,
            "seed": request.seed,
            "repetition_penalty": request.repetition_penalty,
            "priority": request.priority,
            "response_format": _response_format(request.text),
            "tools": [_chat_tool(t, i) for i, t in enumerate(request.tools or [])] or None,
            "tool_choice": _chat_tool_choice(request.tool_choice),
            "parallel_tool_calls": request.parallel_tool_calls,
            "logprobs": logprobs,
            "top_logprobs": request.top_logprobs if logprobs else None,
        }
        try:
            self.body = ChatCompletionRequest.model_validate({k: v for k, v in chat.items() if v is not None})
        except ValidationError as e:  # only message contents can still be wrong here
            raise APIError(400, f"input: {e.errors()[0]['msg']}", param="input") from None
        self.id = "resp_" + uuid.uuid4().hex
        self.created = int(time.time())
        self.sequence = 0

    # ---- the response object ----------------------------------------------------------------------------------------

    def response(self, status: str, output: list[dict], usage: dict | None = None, error: dict | None = None) -> dict:
        r = self.request
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created,
            "completed_at": int(time.time()) if status in ("completed", "incomplete") else None,
            "status": status,
            "error": error,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "background": False,
            "instructions": r.instructions,
            "max_output_tokens": r.max_output_tokens,
            "model": self.state.model_name,
            "output": output,
            "parallel_tool_calls": r.parallel_tool_calls is not False,
            "previous_response_id": r.previous_response_id,
            "reasoning": None,
            "store": bool(r.store),
            "temperature": 1.0 if r.temperature is None else float(r.temperature),
            "text": {"format": (r.text or {}).get("format") or {"type": "text"}},
            "tool_choice": r.tool_choice or ("auto" if r.tools else "none"),
            "tools": r.tools or [],
            "top_logprobs": r.top_logprobs,
            "top_p": 1.0 if r.top_p is None else float(r.top_p),
            "truncation": "disabled",
            "usage": usage,
            "user": r.user,
            "metadata": r.metadata or {},
        }

    def _finish(self, output: list[dict], reason: str | None, run) -> dict:
        """The finished response (stored if asked); its `leapdecode` object holds the speculative decoding stats."""
        chat_usage = run.token_usage()
        usage = {
            "input_tokens": chat_usage["prompt_tokens"],
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": chat_usage["completion_tokens"],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": chat_usage["total_tokens"],
        }
        response = self.response("incomplete" if reason == "length" else "completed", output, usage)
        response["leapdecode"] = run.spec([0])
        if self.request.store:
            self.state.responses.put(response, self.conversation + _answer_messages(output))
        return response

    async def collect(self, run) -> dict:
        result = await run.collect()
        choice = result["choices"][0]
        message, reason = choice["message"], choice["finish_reason"]
        status = "incomplete" if reason == "length" else "completed"
        output = []
        if message["content"] or not message.get("tool_calls"):
            logprobs = (choice["logprobs"] or {}).get("content") if self.body.logprobs else None
            output.append(_message_item(_item_id("msg"), message["content"] or "", status, logprobs))
        output += [_call_item(call) for call in message.get("tool_calls", [])]
        return self._finish(output, reason, run)

    # ---- streaming ----------------------------------------------------------------------------------------------------

    def _event(self, kind: str, **payload) -> str:
        event = {"type": kind, "sequence_number": self.sequence, **payload}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(event, ensure_ascii=False)}\n\n"

    def _text_events(self, index: int, item_id: str, text: str, logprobs: list, status: str):
        """The events that close a message item whose text has been sent."""
        item = _message_item(item_id, text, status, logprobs if self.body.logprobs else None)
        where = {"item_id": item_id, "output_index": index, "content_index": 0}
        yield self._event("response.output_text.done", **where, text=text, logprobs=logprobs)
        yield self._event("response.content_part.done", **where, part=item["content"][0])
        yield self._event("response.output_item.done", output_index=index, item=item)

    def _open_message(self, index: int, item_id: str):
        yield self._event(
            "response.output_item.added", output_index=index, item=_message_item(item_id, None, "in_progress")
        )
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        yield self._event(
            "response.content_part.added", item_id=item_id, output_index=index, content_index=0, part=part
        )

    async def events(self, run):
        """Responses streaming events; the text streams as it comes, except where tool calls may hold it (it is read
        for calls once whole, as chat streaming does)."""
        yield self._event("response.created", response=self.response("in_progress", []))
        yield self._event("response.in_progress", response=self.response("in_progress", []))
        tools = run.tools is not None
        msg_id, text, logprobs, output, reason = _item_id("msg"), [], [], [], None
        if not tools:
            for event in self._open_message(0, msg_id):
                yield event
        async for _, out in run.outputs():
            entries = ((await run.logprobs_of(0, out.logprobs)) or {}).get("content", []) if out.logprobs else []
            logprobs += entries
            text.append(out.text)
            if out.text and not tools:
                where = {"item_id": msg_id, "output_index": 0, "content_index": 0}
                yield self._event("response.output_text.delta", **where, delta=out.text, logprobs=entries)
            if out.finished:
                reason = out.finish_reason
        if run.failure is not None:
            error = {"code": run.failure.code or "server_error", "message": run.failure.message}
            yield self._event("error", **error, param=run.failure.param)
            yield self._event("response.failed", response=self.response("failed", [], error=error))
            return
        status = "incomplete" if reason == "length" else "completed"
        content, calls = "".join(text), []
        if tools:
            content, calls, _ = run.tool_calls_of(content, reason)
            if content or not calls:
                for event in self._open_message(0, msg_id):
                    yield event
                where = {"item_id": msg_id, "output_index": 0, "content_index": 0}
                yield self._event("response.output_text.delta", **where, delta=content or "", logprobs=logprobs)
        if content or not calls:
            for event in self._text_events(0, msg_id, content or "", logprobs, status):
                yield event
            output.append(_message_item(msg_id, content or "", status, logprobs if self.body.logprobs else None))
        for call in calls:
            index, item = len(output), _call_item(call)
            yield self._event("response.output_item.added", output_index=index, item={**item, "arguments": ""})
            where = {"item_id": item["id"], "output_index": index}
            yield self._event("response.function_call_arguments.delta", **where, delta=item["arguments"])
            yield self._event("response.function_call_arguments.done", **where, arguments=item["arguments"])
            yield self._event("response.output_item.done", output_index=index, item=item)
            output.append(item)
        response = self._finish(output, reason, run)
        yield self._event("response.completed", response=response)  # status "incomplete" inside, as vLLM sends it


# ---- requests in, items out -------------------------------------------------------------------------------------------


ROLES = ("user", "assistant", "system", "developer")
TEXT_PARTS = ("input_text", "output_text", "text")


def input_messages(items: str | list[dict]) -> list[dict]:
    """`input` as chat messages: a string is one user message; items are messages (text content or text parts),
    `function_call` (an assistant's tool call) and `function_call_output` (a tool message)."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not items:
        raise APIError(400, "input: must not be empty", param="input")
    messages: list[dict] = []
    for i, item in enumerate(items):
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ROLES:
                raise APIError(400, f"input[{i}].role must be one of {', '.join(ROLES)}", f"input.{i}.role")
            role = "system" if role == "developer" else role
            messages.append({"role": role, "content": _text(item.get("content"), f"input[{i}].content")})
        elif kind == "function_call":
            name, arguments, call_id = item.get("name"), item.get("arguments"), item.get("call_id")
            if not all(isinstance(x, str) for x in (name, arguments, call_id)):
                raise APIError(400, f"input[{i}]: a function_call has string name, arguments and call_id", f"input.{i}")
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            if messages and messages[-1]["role"] == "assistant" and "tool_calls" in messages[-1]:
                messages[-1]["tool_calls"].append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            if not isinstance(item.get("call_id"), str):
                raise APIError(400, f"input[{i}]: a function_call_output has a string call_id", f"input.{i}")
            output = _text(item.get("output"), f"input[{i}].output")
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": output})
        else:
            raise APIError(
                400,
                f"input[{i}]: items of type {kind!r} are not supported (message, function_call and "
                "function_call_output are)",
                f"input.{i}.type",
            )
    return messages


def _text(content, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") in TEXT_PARTS and isinstance(p.get("text"), str) for p in content
    ):
        return "".join(p["text"] for p in content)
    param = where.replace("[", ".").replace("]", "")
    raise APIError(400, f"{where}: only text is supported (a string or input_text parts)", param)


def _response_format(text: dict | None) -> dict | None:
    fmt = (text or {}).get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object", "json_schema"):
        raise APIError(400, "text.format: type must be text, json_object or json_schema", "text.format")
    if fmt["type"] == "json_schema":
        if not isinstance(fmt.get("schema"), dict):
            raise APIError(400, "text.format.schema must be a JSON schema", "text.format.schema")
        return {"type": "json_schema", "json_schema": {"name": fmt.get("name"), "schema": fmt["schema"]}}
    return {"type": fmt["type"]}


def _chat_tool(tool: dict, i: int) -> dict:
    if tool.get("type") != "function" or not isinstance(tool.get("name"), str):
        raise APIError(
            400,
            f"tools[{i}]: only function tools ({{'type': 'function', 'name', 'parameters'}}) are supported",
            "tools",
        )
    function = {k: tool[k] for k in ("name", "description", "parameters") if tool.get(k) is not None}
    return {"type": "function", "function": function}


def _chat_tool_choice(choice):
    if isinstance(choice, dict):
        if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
            raise APIError(400, "tool_choice: name a function as {'type': 'function', 'name': ...}", "tool_choice")
        return {"type": "function", "function": {"name": choice["name"]}}
    return choice


def _item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _message_item(item_id: str, text: str | None, status: str, logprobs: list | None = None) -> dict:
    content = []
    if text is not None:
        part = {"type": "output_text", "text": text, "annotations": []}
        if logprobs is not None:
            part["logprobs"] = logprobs
        content.append(part)
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}


def _call_item(call: dict) -> dict:
    return {
        "type": "function_call",
        "id": _item_id("fc"),
        "call_id": call["id"],
        "name": call["function"]["name"],
        "arguments": call["function"]["arguments"],
        "status": "completed",
    }


def _answer_messages(output: list[dict]) -> list[dict]:
    """The response's output items as the chat messages a continuation sends back."""
    items = [
        {"role": "assistant", "content": item["content"][0]["text"] if item["content"] else ""}
        if item["type"] == "message"
        else item
        for item in output
    ]
    return input_messages(items) if items else []
