"""A prompt as token ids: a string (through the chat template when the tokenizer has one), chat messages, or token
ids as they are. Every entry point (generate, the Engine, the server, the benchmarks) encodes through this one
function, so a prompt means the same tokens everywhere."""

from __future__ import annotations

import copy
import pathlib
from typing import Sequence

from .errors import LeapDecodeError, require

Messages = Sequence[dict]
# apply_chat_template's own arguments: a template variable of these names would change how it is called, not the text
RESERVED_VARIABLES = frozenset(
    ("conversation", "messages", "tools", "documents", "chat_template", "add_generation_prompt", "tokenize",
     "continue_final_message", "padding", "truncation", "max_length", "return_tensors", "return_dict",
     "return_assistant_tokens_mask", "tokenizer_kwargs")
)  # fmt: skip


def encode_prompt(
    tokenizer,
    prompt: str | Messages | Sequence[int],
    raw: bool = False,
    tools: list[dict] | None = None,
    continue_final: bool = False,
    generation_prompt: bool = True,
    documents: list[dict] | None = None,
    variables: dict | None = None,
    special_tokens: bool | None = None,
    template: str | None = None,
) -> list[int]:
    """Token ids of the prompt: through the chat template when the tokenizer has one (unless raw), else as is.
    A list of token ids is taken as it is. `tools`: function definitions the chat template shows the model.
    `continue_final`: the last message is left open and the answer continues it (a prefilled answer), instead of a new
    turn; `generation_prompt`: the template's opening of the assistant's turn (vLLM's `add_generation_prompt`);
    `documents`: for a template that renders them (RAG); `variables`: more of the template's variables (vLLM's
    `chat_template_kwargs`, e.g. Qwen3's `enable_thinking`); `special_tokens`: whether the tokenizer adds its own
    special tokens (e.g. a BOS) around the text (vLLM's `add_special_tokens`; None: yes for raw text, no for a
    template's text, which holds them already); `template`: a chat template to render with instead of the tokenizer's."""
    if isinstance(prompt, (list, tuple)) and prompt and all(isinstance(t, int) for t in prompt):
        vocab = len(tokenizer)
        bad = next((t for t in prompt if not 0 <= t < vocab), None)
        require(bad is None, f"token id {bad} is outside the tokenizer's vocabulary of {vocab}")
        return list(prompt)
    if isinstance(prompt, str):
        require(prompt.strip() != "", "the prompt is empty")
        if raw or not (template or getattr(tokenizer, "chat_template", None)):
            return tokenizer(prompt, add_special_tokens=special_tokens is not False)["input_ids"]
        prompt = [{"role": "user", "content": prompt}]
    require(len(prompt) > 0, "the prompt is empty")
    text = chat_text(tokenizer, prompt, tools, continue_final, generation_prompt, documents, variables, template)
    return tokenizer(text, add_special_tokens=bool(special_tokens))["input_ids"]


def chat_text(
    tokenizer,
    messages: Messages,
    tools: list[dict] | None = None,
    continue_final: bool = False,
    generation_prompt: bool = True,
    documents: list[dict] | None = None,
    variables: dict | None = None,
    template: str | None = None,
) -> str:
    """The chat template's text of `messages` (encode_prompt's options; the server's /tokenize renders through
    here too, so its count is the one a chat completion would use)."""
    require(
        (template or getattr(tokenizer, "chat_template", None)) is not None,
        "a list of chat messages needs a tokenizer with a chat template; pass a string with raw=True instead",
    )
    clash = sorted(RESERVED_VARIABLES & set(variables or ()))
    require(not clash, f"chat template variables may not be named {', '.join(clash)} (set by their own options)")
    extra = {**(variables or {})}
    if tools:
        extra["tools"] = tools
    if documents:
        extra["documents"] = documents
    if continue_final:
        extra["continue_final_message"] = True
    if template:
        extra["chat_template"] = template
    opening = generation_prompt and not continue_final
    return tokenizer.apply_chat_template(list(messages), add_generation_prompt=opening, tokenize=False, **extra)


def read_chat_template(value: str) -> str:
    """A chat template given as vLLM's `--chat-template` takes it: a file's path or the template's text; checked to
    parse now (a one-line error), not at the first request."""
    path = pathlib.Path(value).expanduser()
    if len(value) < 4096 and path.is_file():
        value = path.read_text(encoding="utf-8")
    elif "{{" not in value and "{%" not in value:
        raise LeapDecodeError(f"chat template {value!r} is neither a file nor a Jinja template")
    return parse_chat_template(value)


def parse_chat_template(value: str) -> str:
    """`value` once it parses as Jinja (as transformers renders chat templates), else a one-line LeapDecodeError."""
    from jinja2 import TemplateSyntaxError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    try:
        ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).parse(value)
    except TemplateSyntaxError as e:
        raise LeapDecodeError(f"the chat template does not parse: {e.message} (line {e.lineno})") from None
    return value


def with_chat_template(tokenizer, template: str | None):
    """The tokenizer, or a copy of it that renders chat messages with `template` instead of its own."""
    if template is None:
        return tokenizer
    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.chat_template = template
    return tokenizer


# fill-in-the-middle tokens, prefix / suffix / middle: Qwen2.5-Coder's, then StarCoder's (and models trained like it)
FIM_TOKENS = (("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"), ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"))


def fim_token_ids(tokenizer) -> tuple[int, int, int] | None:
    """The tokenizer's fill-in-the-middle tokens (prefix, suffix, middle), or None where it has none."""
    unknown = getattr(tokenizer, "unk_token_id", None)
    for names in FIM_TOKENS:
        ids = tokenizer.convert_tokens_to_ids(list(names))
        if all(isinstance(i, int) and i != unknown for i in ids):
            return tuple(ids)
    return None


def fill_in_the_middle(tokenizer, prefix: str, suffix: str) -> list[int]:
    """Token ids that ask a code model for the text between `prefix` and `suffix` (prefix-suffix-middle order, as
    Qwen2.5-Coder and StarCoder were trained): what an editor's completion sends as a prompt and OpenAI's `suffix`."""
    ids = fim_token_ids(tokenizer)
    require(ids is not None, "this model has no fill-in-the-middle tokens (<|fim_prefix|>... or <fim_prefix>...)")
    before, after, middle = ids
    encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    return [before, *encode(prefix), after, *encode(suffix), middle]
