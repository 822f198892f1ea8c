"""The public Python API: `generate`, mirroring the names of HF `model.generate`. Only the front: the pieces it puts
together live where they belong (models.resolve_model, prompt.encode_prompt, drafters.factory, params, decode)."""

from __future__ import annotations

from typing import Callable, Sequence

from .controller import DraftLengthController, costs_for
from .decode import decode
from .drafters import Drafter
from .drafters.factory import build_drafter
from .drafters.prediction import with_prediction
from .errors import require
from .kv.prefix_cache import PrefixCache
from .kv.prefix_cache import for_model as prefix_cache_for
from .models.resolve import resolve_model
from .params import DraftConfig, RequestParams, prediction_ids
from .prompt import Messages, encode_prompt
from .runner import Runner
from .stats import GenerationResult
from .structured import grammar_for
from .text import TextStream

DRAFT_OPTIONS = ("draft_length", "max_draft_length", "adaptive_draft_length")


def generate(
    model,
    prompt: str | Messages | Sequence[int],
    params: RequestParams | None = None,
    *,
    tokenizer=None,
    drafter: str | Drafter = "none",
    draft_model=None,
    dtype: str = "float32",
    draft_dtype: str = "int8",
    kv_press=None,
    packed_weights: bool = True,
    drafter_options: dict | None = None,
    stream: Callable[[list[int]], None] | None = None,
    prefix_cache: bool | PrefixCache = True,
    **options,
) -> GenerationResult:
    """Generate a continuation of `prompt` (a string, chat messages or token ids) with speculative decoding.

    Greedy (temperature 0) output is token for token that of plain greedy decoding; with temperature > 0 the output
    follows the same distribution as plain sampling. `model`: a packaged name, directory or GGUF file (loaded once per
    process and dtype), a LoadedModel, or an HF model with `tokenizer=`. `drafter`: a name in
    leapdecode.drafters.DRAFTERS, "auto" (the model's shipped draft head if it has one, else prompt lookup) or a
    Drafter. `stream` receives each step's new token ids. A draft model given by name loads in `draft_dtype` (int8 by
    default, see models.quantize: the draft's precision changes speed, never the output).
    The request's settings come as `params` (a RequestParams) or as its fields by keyword (max_new_tokens,
    temperature, top_p, top_k, seed, stop, raw, min_p, stop_token_ids, ignore_eos, min_tokens); the draft length's
    as draft_length, max_draft_length, adaptive_draft_length (see params.DraftConfig).
    `prefix_cache`: calls on one model share a cache of their prompts' and outputs' keys/values (kv.prefix_cache:
    the next turn of a chat computes only its new message); a PrefixCache of the caller's own, or False for none.
    `packed_weights=False` runs the target's linear layers through HF's own `F.linear` instead of pre-packed weights
    (same numbers in bf16; in fp32 they round differently, as any two GEMMs do).
    """
    draft = DraftConfig(**{k: options.pop(k) for k in DRAFT_OPTIONS if k in options})
    params = RequestParams.of(params, **options)
    require(params.prompt_logprobs is None, "generate does not score prompts: use the Engine for `prompt_logprobs`")
    target = resolve_model(model, tokenizer, dtype)
    prompt_ids = encode_prompt(target.tokenizer, prompt, params.raw)
    params.prepare(target.tokenizer)
    grammar = grammar_for(params.structured_output, target)
    context = target.context_length
    require(
        len(prompt_ids) < context,
        f"the prompt has {len(prompt_ids)} tokens but {target.name} has a context of {context} tokens",
    )
    if kv_press is not None:
        kv_press.check(target.model)
    chosen = with_prediction(
        build_drafter(drafter, target, draft_model, draft_dtype, **(drafter_options or {})),
        prediction_ids(target.tokenizer, params.prediction),
    )
    if prefix_cache is True:
        prefix_cache = prefix_cache_for(target.model)
    runner = Runner(target.model, kv_press, packed_weights, prefix_cache=prefix_cache or None)
    logprobs = None if params.logprobs is None else []
    text = None
    if params.stop:
        text = TextStream(
            target.tokenizer, params.stop, None, params.include_stop_str_in_output, params.skip_special_tokens
        )
    tokens, stats = decode(
        runner,
        prompt_ids,
        chosen,
        sampling=params.sampling,
        controller=DraftLengthController(**draft.controller_options(), costs=costs_for(target.model)),
        max_new_tokens=params.max_new_tokens,
        eos_ids=set(target.eos_token_ids),
        context_length=context,
        on_tokens=stream,
        logprobs_sink=logprobs,
        text=text,
        grammar=grammar,
        **params.state_options(),
    )
    return GenerationResult(
        text=text.text
        if text is not None and text.stopped
        else target.tokenizer.decode(tokens, skip_special_tokens=params.skip_special_tokens),
        token_ids=tokens,
        prompt_ids=prompt_ids,
        stats=stats,
        model=target.name,
        drafter=chosen.name,
        logprobs=logprobs,
    )
