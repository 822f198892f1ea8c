"""What one completion call asks of the engine: its prompts tokenized (off the event loop, see tokenizing.py), checked
against the context, and turned into one engine request per (prompt, choice); then submitted together."""

from __future__ import annotations

import asyncio

from ..errors import LeapDecodeError
from ..params import prediction_ids
from ..structured import Grammar, StructuredOutput, grammar_for
from .engine_thread import Streaming
from .protocol import APIError
from .tokenizing import decode, encode_all, fim_all
from .tools import ToolChoice, knows_tools, template_history


async def build_jobs(state, body, chat: bool) -> list[dict]:
    """One engine request per (prompt, choice): its token ids and parameters. APIError(400) on what cannot run."""
    context = state.engine.context_length
    tools = ToolChoice(body.tools, body.tool_choice, body.parallel_tool_calls) if chat else None
    prompts = [_chat(state, body, tools)] if chat else body.prompts()
    param = "messages" if chat else "prompt"
    if not prompts:
        raise APIError(400, f"{param}: must not be empty", param=param)
    temperature = 1.0 if body.temperature is None else float(body.temperature)
    top_p = 1.0 if body.top_p is None else float(body.top_p)
    requested = (body.max_completion_tokens or body.max_tokens) if chat else body.max_tokens
    stop = [body.stop] if isinstance(body.stop, str) else body.stop
    if stop is not None and not all(stop):
        raise APIError(400, "stop: stop strings must not be empty", param="stop")
    vocab = state.tokenizers.vocab
    for field in ("stop_token_ids", "allowed_token_ids"):
        bad = next((t for t in getattr(body, field) or () if not 0 <= t < vocab), None)
        if bad is not None:
            raise APIError(400, f"{field}: {bad} is outside the vocabulary of {vocab}", param=field)
    logit_bias = _logit_bias(body.logit_bias, vocab)
    if body.priority and state.engine.scheduler.config.policy != "priority":
        raise APIError(400, "priority is only taken when the server runs with --scheduling-policy priority", "priority")
    if not all(word.strip() for word in body.bad_words or ()):
        raise APIError(400, "bad_words: a word must not be empty", param="bad_words")
    asked = body.structured()
    if tools is not None and tools.structured():
        if asked:
            raise APIError(400, f"tool_choice {tools.mode!r} already shapes the answer; drop {asked[0]}", asked[0])
        asked = ("tool_choice", tools.structured())
    structured, grammar = None, None
    if asked:
        structured = _structured(*asked)
        grammar = await state.tokenizers.run(_compile, state.engine, structured, asked[0])
    template_tools = tools.template_tools() if tools is not None else None
    template = body.template_options() if chat else {}
    if not chat and body.suffix:
        encoded = await state.tokenizers.run(lambda tok: fim_all(tok, prompts, body.suffix))
    else:
        special = body.add_special_tokens  # vLLM's defaults: yes for completions, no for a chat template's text
        encoded = await state.tokenizers.run(
            lambda tok: encode_all(tok, prompts, chat, param, template_tools, special_tokens=special, **template)
        )
    all_ids = [body.truncated(ids, context) for ids in encoded]
    predicted = body.predicted() if chat else ""
    prediction = None  # tokenized off the event loop, as the prompts are
    if predicted:
        prediction = tuple(await state.tokenizers.run(lambda tok: prediction_ids(tok, predicted)))
    # vLLM's stream_interval: tokens a streamed chunk carries at least; the server's --stream-interval is the least
    streaming = state.streaming
    pacing = Streaming(max(streaming.interval, body.stream_interval or 1), streaming.max_delay) if body.stream else None
    echoes = [body.echoed()] if chat else [""] * len(all_ids)
    if not chat and body.echo:
        skip = body.skip_special_tokens is not False
        echoes = await state.tokenizers.run(lambda tok: [decode(tok, ids, skip) for ids in all_ids])
    jobs = []
    for ids, echo in zip(all_ids, echoes):
        room = context - len(ids)
        if room <= 0:
            raise APIError(
                400,
                f"This model's maximum context length is {context} tokens; the {param} has {len(ids)} tokens",
                param=param,
                code="context_length_exceeded",
            )
        max_tokens = requested if requested is not None else (room if chat else min(16, room))
        if max_tokens > room:
            raise APIError(
                400,
                f"This model's maximum context length is {context} tokens; you requested "
                f"{len(ids) + max_tokens} tokens ({len(ids)} in the {param}, {max_tokens} for the "
                "completion)",
                param="max_completion_tokens" if chat and body.max_completion_tokens else "max_tokens",
                code="context_length_exceeded",
            )
        if (body.min_tokens or 0) > max_tokens:
            raise APIError(
                400, f"min_tokens ({body.min_tokens}) must not exceed max_tokens ({max_tokens})", param="min_tokens"
            )
        for j in range(body.n):
            jobs.append(
                dict(
                    prompt_ids=ids,
                    echo=echo,
                    tools=tools if tools is not None and tools.active else None,
                    grammar=grammar,
                    priority=body.priority or 0,
                    pacing=pacing,
                    params=dict(
                        max_new_tokens=max_tokens,
                        temperature=temperature,
                        top_p=top_p,
                        top_k=max(0, body.top_k or 0),
                        seed=None if body.seed is None else body.seed + j,
                        stop=stop,
                        min_p=float(body.min_p or 0.0),
                        min_tokens=body.min_tokens or 0,
                        stop_token_ids=tuple(body.stop_token_ids or ()),
                        ignore_eos=bool(body.ignore_eos),
                        logprobs=body.num_logprobs(),
                        prompt_logprobs=_prompt_logprobs(body, chat, max_tokens),
                        repetition_penalty=float(body.repetition_penalty or 1.0),
                        frequency_penalty=float(body.frequency_penalty or 0.0),
                        presence_penalty=float(body.presence_penalty or 0.0),
                        logit_bias=logit_bias,
                        allowed_token_ids=tuple(body.allowed_token_ids or ()),
                        bad_words=tuple(body.bad_words or ()),
                        include_stop_str_in_output=bool(body.include_stop_str_in_output),
                        skip_special_tokens=body.skip_special_tokens is not False,
                        structured_output=structured,
                        prediction=prediction,
                    ),
                )
            )
    return jobs


def _prompt_logprobs(body, chat: bool, max_tokens: int) -> int | None:
    """The engine's prompt_logprobs: vLLM's `prompt_logprobs` field, or for an echoed completion its logprobs
    setting (the echo carries the prompt's logprobs; 0 where max_tokens 0 asks for the prompt alone), the larger
    where both ask; None where neither does."""
    echoed = None
    if not chat and body.echo:
        echoed = body.logprobs if body.logprobs is not None else (0 if max_tokens == 0 else None)
    asked = [n for n in (echoed, body.prompt_logprobs) if n is not None]
    return max(asked) if asked else None


def _chat(state, body, tools: ToolChoice) -> list[dict]:
    """The call's messages for the chat template; "auto" tool calls need a template that shows the model its tools."""
    body.check_own_template(state.security.trust_request_chat_template)
    template = body.template_of(state.engine.tokenizer)
    if tools.mode == "auto" and not knows_tools(template):
        raise APIError(
            400,
            f"tool_choice 'auto' needs a chat template that shows the model its tools; {state.model_name}'s does not: "
            "use tool_choice 'required' or name a function (the answer then follows the tools' schemas)",
            "tool_choice",
        )
    return template_history(template, body.chat())


def _structured(field: str, spec: dict) -> StructuredOutput:
    try:
        return StructuredOutput.of(spec)
    except LeapDecodeError as e:
        raise APIError(400, f"{field}: {e}", field) from None


def _compile(tokenizer, engine, structured: StructuredOutput, field: str) -> Grammar:
    """The grammar compiled on a tokenizer worker (the first one builds llguidance's view of the tokenizer)."""
    try:
        return grammar_for(structured, engine.target, tokenizer)
    except LeapDecodeError as e:
        raise APIError(400, f"{field}: {e}", field) from None


def _logit_bias(bias: dict[str, float] | None, vocab: int) -> dict[int, float] | None:
    """OpenAI's logit_bias (token ids as JSON's string keys) as {token id: bias}; APIError(400) where it is not."""
    if not bias:
        return None
    out = {}
    for key, value in bias.items():
        token = int(key) if key.strip().isdigit() else -1
        if not 0 <= token < vocab:
            raise APIError(400, f"logit_bias: {key!r} is not a token id of the vocabulary of {vocab}", "logit_bias")
        if not -100 <= value <= 100:
            raise APIError(400, f"logit_bias: the bias of token {token} must be in [-100, 100]", "logit_bias")
        out[token] = float(value)
    return out


def submit(state, jobs: list[dict]) -> tuple[asyncio.Queue, dict[int, int]]:
    """Queue every job in the engine, sharing one output queue; all or none (a refused one cancels the others)."""
    queue: asyncio.Queue = asyncio.Queue()
    index: dict[int, int] = {}
    try:
        for i, job in enumerate(jobs):
            rid, _ = state.thread.submit(
                job["prompt_ids"],
                queue=queue,
                raw=True,
                grammar=job["grammar"],
                priority=job["priority"],
                pacing=job["pacing"],
                **job["params"],
            )
            index[rid] = i
    except LeapDecodeError as e:
        for rid in index:
            state.thread.cancel(rid)
        raise APIError(400, str(e)) from None
    return queue, index
