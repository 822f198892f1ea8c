"""Tool calling in chat completions (OpenAI's `tools`, `tool_choice`, `parallel_tool_calls`).

`tool_choice: "required"` or a named function: the answer is generated under a JSON grammar (structured.py) and
returned as `tool_calls`, so the calls always parse and name a declared tool with arguments that follow its schema,
whatever the model and its template (as vLLM does for these two choices). "required" asks for a list of
`{"name", "parameters"}` objects (one at most without `parallel_tool_calls`); a named function for its arguments;
both as compact JSON (free whitespace is where a weak model loops until max_tokens).
`"auto"` (OpenAI's default when tools are given) needs a chat template that shows the model its tools; the model's
text is then read for Hermes-style calls (`<tool_call>{"name": ..., "arguments": ...}</tool_call>`, the format of
Qwen2.5's template, whose tags are special tokens and so absent from the text unless `skip_special_tokens` is false:
an answer that is nothing but such objects is read as calls too): calls to declared tools become `tool_calls`, the
rest stays `content`. `"none"`: the tools are ignored.
Grammar or not, decoding is the same step rule, so the lossless guarantee holds under speculation.

History: assistant messages with `tool_calls` and `tool` messages go to the template as HF templates take them
(arguments as objects); a template that does not render `tool_calls` gets them as Hermes text in the content.
"""

from __future__ import annotations

import json
import re
import uuid

from .protocol import APIError

CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
EMPTY_PARAMETERS = {"type": "object", "properties": {}}


def knows_tools(template) -> bool:
    """Whether a chat template renders a `tools` list (so "auto" can show the model its tools)."""
    template = template or ""
    return "tools" in (template if isinstance(template, str) else json.dumps(template))


class ToolChoice:
    """What one chat request asks of its tools: `mode` none, auto, required or named (`name`)."""

    def __init__(self, tools: list[dict] | None, choice, parallel: bool | None):
        self.functions = {}
        for i, tool in enumerate(tools or []):
            function = tool.get("function") if isinstance(tool, dict) else None
            name = function.get("name") if isinstance(function, dict) else None
            if tool.get("type", "function") != "function" or not isinstance(name, str) or not name:
                raise APIError(
                    400, f"tools[{i}]: a tool is {{'type': 'function', 'function': {{'name', ...}}}}", "tools"
                )
            parameters = function.get("parameters") or EMPTY_PARAMETERS
            if not isinstance(parameters, dict):
                raise APIError(400, f"tools[{i}].function.parameters must be a JSON schema", "tools")
            self.functions[name] = {**function, "parameters": parameters}
        self.parallel = parallel is not False
        self.name = None
        if choice is None:
            choice = "auto" if self.functions else "none"
        if isinstance(choice, dict):
            self.name = (choice.get("function") or {}).get("name")
            if choice.get("type") != "function" or self.name not in self.functions:
                raise APIError(
                    400, f"tool_choice names no declared function: {json.dumps(choice)[:200]}", "tool_choice"
                )
            choice = "named"
        if choice not in ("none", "auto", "required", "named"):
            raise APIError(
                400, f"tool_choice must be none, auto, required or a function, got {choice!r}", "tool_choice"
            )
        if choice != "none" and not self.functions:
            raise APIError(400, f"tool_choice {choice!r} needs tools", "tool_choice")
        self.mode = choice

    @property
    def active(self) -> bool:
        return self.mode != "none"

    def template_tools(self) -> list[dict] | None:
        """The tools as the chat template takes them."""
        return [{"type": "function", "function": f} for f in self.functions.values()] if self.active else None

    def structured(self) -> dict | None:
        """The grammar of a required or named call (RequestParams.structured_output), else None."""
        if self.mode == "named":
            return {"json": self.functions[self.name]["parameters"], "disable_any_whitespace": True}
        if self.mode != "required":
            return None
        call = {
            "anyOf": [
                {
                    "type": "object",
                    "properties": {"name": {"const": name}, "parameters": f["parameters"]},
                    "required": ["name", "parameters"],
                    "additionalProperties": False,
                }
                for name, f in self.functions.items()
            ]
        }
        calls = {"type": "array", "items": call, "minItems": 1, **({} if self.parallel else {"maxItems": 1})}
        return {"json": calls, "disable_any_whitespace": True}  # calls, not prose: no room for a model to wander

    def parse(self, text: str) -> tuple[str | None, list[dict]]:
        """(content, OpenAI tool_calls) of a finished answer; no calls where its text holds none that parse."""
        if self.mode == "named":
            arguments = _json(text)
            return (
                (None, [_call(self.name, json.dumps(arguments, ensure_ascii=False))])
                if arguments is not None
                else (text, [])
            )
        if self.mode == "required":
            calls = _json(text)
            if not isinstance(calls, list):
                return text, []
            return None, [_call(c["name"], json.dumps(c["parameters"], ensure_ascii=False)) for c in calls]
        calls, rest = [], text
        for match in CALL.finditer(text):
            call = self._declared(_json(match.group(1)))
            if call is not None:
                calls.append(call)
                rest = rest.replace(match.group(0), "", 1)
        if not calls:  # templates whose <tool_call> tags are special tokens (Qwen2.5's) leave the bare objects
            bare = [self._declared(value) for value in _json_values(text)]
            if bare and all(call is not None for call in bare):
                return None, bare
        return (rest.strip() or None) if calls else text, calls

    def _declared(self, value) -> dict | None:
        """A Hermes call object ({"name", "arguments"}) to a declared tool as an OpenAI tool call, else None."""
        if not isinstance(value, dict) or value.get("name") not in self.functions:
            return None
        arguments = value.get("arguments", value.get("parameters", {}))
        return _call(value["name"], json.dumps(arguments, ensure_ascii=False))


def template_history(template, messages: list[dict]) -> list[dict]:
    """Chat messages as a chat template takes them (template_message on each)."""
    template = template or ""
    renders_calls = "tool_calls" in (template if isinstance(template, str) else str(template))
    return [template_message(m, i, renders_calls) for i, m in enumerate(messages)]


def template_message(message: dict, index: int, template_renders_calls: bool) -> dict:
    """History message `index` as the chat template takes it: an assistant's tool_calls with their arguments as
    objects (HF templates' convention), or, where the template does not render tool_calls, as Hermes text in the
    content."""
    calls = message.pop("tool_calls", None)
    if not calls:
        return message
    where = f"messages.{index}.tool_calls"
    if message["role"] != "assistant":
        raise APIError(400, f"messages[{index}].tool_calls: only an assistant message makes tool calls", where)
    rendered = []
    for i, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise APIError(
                400, f"messages[{index}].tool_calls[{i}]: a call is {{'function': {{'name', 'arguments'}}}}", where
            )
        arguments = function.get("arguments", "{}")
        parsed = _json(arguments) if isinstance(arguments, str) else arguments
        rendered.append({"type": "function", "function": {"name": function["name"], "arguments": parsed or {}}})
    if template_renders_calls:
        return {**message, "tool_calls": rendered}
    text = "\n".join(
        "<tool_call>\n"
        + json.dumps({"name": c["function"]["name"], "arguments": c["function"]["arguments"]})
        + "\n</tool_call>"
        for c in rendered
    )
    return {**message, "content": (message.get("content") or "") + text}


def _call(name: str, arguments: str) -> dict:
    return {
        "id": "call_" + uuid.uuid4().hex[:24],
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def _json_values(text: str) -> list:
    """The JSON values that make up `text` one after another (whitespace between), or [] where it is not that."""
    decoder, values, at = json.JSONDecoder(), [], 0
    while at < len(text):
        while at < len(text) and text[at].isspace():
            at += 1
        if at == len(text):
            break
        try:
            value, at = decoder.raw_decode(text, at)
        except ValueError:
            return []
        values.append(value)
    return values


def _json(text: str):
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return None
