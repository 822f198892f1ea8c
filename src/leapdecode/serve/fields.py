"""Every request field OpenAI and vLLM document, and what this server does with it: honours it, refuses it with a 400
that names it (when set to anything but its neutral value), or takes it as metadata that changes no output. A field
in none of these lists is unknown: it is ignored, logged, and listed in the `x-leapdecode-ignored-fields` header.

The fields this server honours are declared (and validated) on the request models in protocol.py.
"""

from __future__ import annotations

# metadata: accepted, changes nothing in the answer (vLLM ignores these too, or only logs them)
METADATA = (
    "user",
    "metadata",
    "store",
    "service_tier",
    "safety_identifier",
    "prompt_cache_key",
    "prompt_cache_retention",
    "cache_salt",
)

# field -> (is the value neutral?, why it is refused otherwise); a field the request model declares is honoured
# instead (so implementing a field is declaring it there)


def _falsy(v) -> bool:
    return v in (None, False, 0, 0.0, "", [], {})


def _neutral(*values):
    return lambda v: v is None or v in values


COMMON_REFUSED = {
    "length_penalty": (_neutral(1), "it applies to beam search, which this server does not do"),
    "use_beam_search": (_falsy, "beam search is not supported"),
    "logits_processors": (_falsy, ""),
    "spaces_between_special_tokens": (_neutral(True), ""),
    "guided_decoding_backend": (_falsy, "structured output always runs on llguidance"),
    "guided_whitespace_pattern": (_falsy, ""),
    "structural_tag": (_falsy, ""),
    "kv_transfer_params": (_falsy, ""),
    "vllm_xargs": (_falsy, ""),
}

COMPLETIONS_REFUSED = {
    "prompt_embeds": (_falsy, ""),
}

CHAT_REFUSED = {
    "functions": (_falsy, "function calling is not supported"),
    "function_call": (_neutral("none"), "function calling is not supported"),
    "audio": (_falsy, "audio output is not supported"),
    "modalities": (lambda v: v is None or v == ["text"], 'only ["text"] is supported'),
    "reasoning_effort": (_falsy, "the served model has no reasoning settings"),
    "verbosity": (_falsy, ""),
    "web_search_options": (_falsy, "web search is not supported"),
    "mm_processor_kwargs": (_falsy, ""),
}

RESPONSES_REFUSED = {
    "background": (_falsy, "responses are answered in the call"),
    "conversation": (_falsy, "send the history in input, or continue with previous_response_id"),
    "prompt": (_falsy, "stored prompt templates are not supported"),
    "reasoning": (lambda v: not v or (isinstance(v, dict) and not any(v.values())), "the model has no such settings"),
    "truncation": (_neutral("disabled"), "send an input that fits the context"),
    "max_tool_calls": (lambda v: v is None, ""),
    "stream_options": (lambda v: True, ""),  # include_obfuscation: padding for streams over the internet
}

MESSAGE_FIELDS = {"role", "content", "name", "tool_calls", "tool_call_id"}
MESSAGE_REFUSED = {
    "function_call": (_falsy, "function calling is not supported"),
    "audio": (_falsy, "audio is not supported"),
    "refusal": (lambda v: True, ""),  # an assistant message sent back as this server answered it
    "reasoning_content": (lambda v: True, ""),
}


def refused(chat: bool) -> dict:
    return {**COMMON_REFUSED, **(CHAT_REFUSED if chat else COMPLETIONS_REFUSED)}


def check(data: dict, declared: set[str], table: dict, chat: bool = False) -> tuple[tuple[str, str] | None, list[str]]:
    """(param, message) of the first field set to what this server cannot do, or None; and the unknown fields.
    `declared`: the fields of the request model (honoured, and validated there); `table`: the refused fields
    (`refused(chat)` or RESPONSES_REFUSED); `chat`: check each of `messages` too."""
    unknown = []
    for name, value in data.items():
        if name in declared:
            continue
        if name in table:
            neutral, why = table[name]
            if not neutral(value):
                return (name, f"{name} is not supported by this server" + (f" ({why})" if why else "")), []
        elif name not in METADATA:
            unknown.append(name)
    if chat and isinstance(data.get("messages"), list):
        for i, message in enumerate(data["messages"]):
            if not isinstance(message, dict):
                continue
            for name, value in message.items():
                if name in MESSAGE_REFUSED:
                    neutral, why = MESSAGE_REFUSED[name]
                    if not neutral(value):
                        return (f"messages.{i}.{name}", f"messages[{i}].{name} is not supported ({why})"), []
                elif name not in MESSAGE_FIELDS:
                    unknown.append(f"messages.{i}.{name}")
    return None, unknown
