"""The public Python API: `generate`, mirroring the names of HF `model.generate`."""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from .controller import DraftLengthController
from .decode import decode
from .drafters import Drafter, make_drafter
from .errors import LeapDecodeError, require
from .runner import Runner
from .sampling import SamplingConfig
from .stats import GenerationStats

Messages = Sequence[dict]


@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]  # the new tokens only
    prompt_ids: list[int]
    stats: GenerationStats
    model: str
    drafter: str

    def as_dict(self) -> dict:
        return {
            "text": self.text,
            "token_ids": self.token_ids,
            "model": self.model,
            "drafter": self.drafter,
            **self.stats.as_dict(),
        }


def resolve_model(model, tokenizer=None, dtype="float32"):
    """Accept a spec string, a LoadedModel, or an HF model with its tokenizer; return a LoadedModel."""
    from .models import LoadedModel, load_model

    if isinstance(model, LoadedModel):
        return model
    if isinstance(model, str):
        return load_model(model, dtype=dtype)
    if isinstance(model, torch.nn.Module):
        require(
            tokenizer is not None, "an already loaded model needs its tokenizer: generate(model, prompt, tokenizer=tok)"
        )
        name = getattr(model.config, "name_or_path", "") or type(model).__name__
        return LoadedModel(model=model.eval(), tokenizer=tokenizer, name=name, path=name)
    raise LeapDecodeError(f"model must be a name, a path, a LoadedModel or an HF model, got {type(model).__name__}")


def encode_prompt(tokenizer, prompt: str | Messages | Sequence[int], raw: bool = False) -> list[int]:
    """Token ids of the prompt: through the chat template when the tokenizer has one (unless raw), else as is.
    A list of token ids is taken as it is."""
    if isinstance(prompt, (list, tuple)) and prompt and all(isinstance(t, int) for t in prompt):
        vocab = len(tokenizer)
        bad = next((t for t in prompt if not 0 <= t < vocab), None)
        require(bad is None, f"token id {bad} is outside the tokenizer's vocabulary of {vocab}")
        return list(prompt)
    if isinstance(prompt, str):
        require(prompt.strip() != "", "the prompt is empty")
        if raw or not getattr(tokenizer, "chat_template", None):
            return tokenizer(prompt, add_special_tokens=True)["input_ids"]
        prompt = [{"role": "user", "content": prompt}]
    require(len(prompt) > 0, "the prompt is empty")
    require(
        getattr(tokenizer, "chat_template", None) is not None,
        "a list of chat messages needs a tokenizer with a chat template; pass a string with raw=True instead",
    )
    text = tokenizer.apply_chat_template(list(prompt), add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def same_tokenizer(a, b) -> bool:
    return a is b or _vocab_fingerprint(a) == _vocab_fingerprint(b)


_fingerprints: "weakref.WeakKeyDictionary[object, int]" = weakref.WeakKeyDictionary()


def _vocab_fingerprint(tokenizer) -> int:
    """Hash of the token -> id map, computed once per tokenizer object (get_vocab() of a 150k vocabulary is slow);
    kept beside the tokenizer, not on it."""
    if tokenizer not in _fingerprints:
        _fingerprints[tokenizer] = hash(frozenset(tokenizer.get_vocab().items()))
    return _fingerprints[tokenizer]


def build_drafter(drafter: str | Drafter, target, draft_model=None, draft_dtype="int8", **options) -> Drafter:
    """A Drafter instance from its name ('auto': see default_drafter); loads and checks the draft model for
    'draft-model'. A draft model goes with 'draft-model' or 'auto' (which then means 'draft-model'), never ignored."""
    if isinstance(drafter, Drafter):
        _check_draft_model(drafter.name, draft_model)
        return drafter
    return drafter_factory(drafter, target, draft_model, draft_dtype, **options)()


def _check_draft_model(drafter: str, draft_model) -> None:
    require(
        draft_model is None or drafter == "draft-model",
        f"a draft model (--draft-model) is used only by the draft-model drafter, not by '{drafter}': "
        "drop it, or use drafter 'draft-model' (or 'auto')",
    )


def drafter_factory(drafter: str, target, draft_model=None, draft_dtype="int8", **options) -> Callable[[], Drafter]:
    """A function that makes a fresh drafter (one per request: drafters keep per-request state), with what they
    share loaded once: the draft model, the draft head. Bad names and missing pieces fail here, not per request."""
    if draft_model is not None and drafter == "auto":
        drafter = "draft-model"
    _check_draft_model(drafter, draft_model)
    if drafter == "auto":
        drafter = default_drafter(target.name)
    if drafter == "select":
        return _select_factory(target, **options)
    if drafter == "draft-model" and draft_model is not None:
        draft = resolve_model(draft_model, tokenizer=target.tokenizer, dtype=draft_dtype)
        if not same_tokenizer(draft.tokenizer, target.tokenizer):
            raise LeapDecodeError(
                f"draft model '{draft.name}' uses a different tokenizer from '{target.name}': "
                "speculative decoding needs the same vocabulary"
            )
        options["draft_model"] = draft.model
    if drafter == "ngram":
        options.setdefault("store_key", target.name)
    if drafter == "head":
        options["head"] = attached_head(target, options.pop("head", None) or target.name)
    make_drafter(drafter, **options)  # fail now on a bad name or option
    return lambda: make_drafter(drafter, **options)


SELECT_CANDIDATES = ("head", "prompt-lookup", "ngram")


def _select_factory(target, candidates=None, head=None, store_key=None, **options) -> Callable[[], Drafter]:
    """Drafter 'select': a per-request choice among `candidates` (names; default: the shipped head where the target
    has one, prompt lookup and n-grams), each built as it would be alone (`head`, `store_key` go to theirs)."""
    from .heads.model import has_shipped_head

    names = list(candidates or [n for n in SELECT_CANDIDATES if n != "head" or head or has_shipped_head(target.name)])
    for name in names:
        require(name in SELECT_CANDIDATES, f"select candidates come from {', '.join(SELECT_CANDIDATES)}, not '{name}'")
    own = {"head": {"head": head} if head else {}, "ngram": {"store_key": store_key} if store_key else {}}
    makers = [drafter_factory(n, target, **own.get(n, {})) for n in names]
    make_drafter("select", candidates=[m() for m in makers], **options)  # fail now on a bad option
    return lambda: make_drafter("select", candidates=[m() for m in makers], **options)


def default_drafter(target_name: str) -> str:
    """The fastest drafter measured without a draft model (docs/benchmarks.md): the shipped draft head where the
    target has one, else prompt lookup."""
    from .heads.model import has_shipped_head

    return "head" if has_shipped_head(target_name) else "prompt-lookup"


_heads: "weakref.WeakKeyDictionary[torch.nn.Module, dict]" = weakref.WeakKeyDictionary()


def attached_head(target, source):
    """The draft head from `source` (a directory, or a target name with a shipped head) attached to the target;
    loaded once per target model. It runs in bf16, the precision it ships in, where bf16 products measure faster on
    this CPU (kernels.bf16_pays; even without native bf16, reading half the bytes can pay): same acceptance; elsewhere
    in fp32."""
    from .heads.model import load_head
    from .kernels import bf16_pays

    loaded = _heads.setdefault(target.model, {})
    if str(source) not in loaded:
        dtype = torch.bfloat16 if bf16_pays() else torch.float32
        loaded[str(source)] = load_head(source, dtype=dtype).attach(target.model)
    return loaded[str(source)]


def generate(
    model,
    prompt: str | Messages | Sequence[int],
    *,
    tokenizer=None,
    drafter: str | Drafter = "none",
    draft_model=None,
    max_new_tokens: int = 128,
    temperature: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    seed: int | None = None,
    raw: bool = False,
    dtype: str = "float32",
    draft_dtype: str = "int8",
    draft_length: int = 4,
    max_draft_length: int = 16,
    adaptive_draft_length: bool = True,
    kv_press=None,
    packed_weights: bool = True,
    drafter_options: dict | None = None,
    stream: Callable[[list[int]], None] | None = None,
) -> GenerationResult:
    """Generate a continuation of `prompt` (a string or chat messages) with speculative decoding.

    Greedy (temperature 0) output is token for token that of plain greedy decoding; with temperature > 0 the output
    follows the same distribution as plain sampling. `drafter`: a name in leapdecode.drafters.DRAFTERS, "auto" (the
    model's shipped draft head if it has one, else prompt lookup) or a Drafter. `stream` receives each step's new
    token ids. A draft model given by name loads in `draft_dtype` (int8 by default, see models.quantize: the draft's
    precision changes speed, never the output).
    `packed_weights=False` runs the target's linear layers through HF's own `F.linear` instead of pre-packed weights
    (same numbers in bf16; in fp32 they round differently, as any two GEMMs do).
    """
    require(
        isinstance(max_new_tokens, int) and max_new_tokens > 0,
        f"max_new_tokens must be a positive integer, got {max_new_tokens}",
    )
    sampling = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
    controller = DraftLengthController(
        k_init=min(draft_length, max_draft_length), k_max=max_draft_length, adaptive=adaptive_draft_length
    )
    target = resolve_model(model, tokenizer, dtype)
    prompt_ids = encode_prompt(target.tokenizer, prompt, raw)
    context = target.context_length
    require(
        len(prompt_ids) < context,
        f"the prompt has {len(prompt_ids)} tokens but {target.name} has a context of {context} tokens",
    )
    if kv_press is not None:
        kv_press.check(target.model)
    chosen = build_drafter(drafter, target, draft_model, draft_dtype, **(drafter_options or {}))
    runner = Runner(target.model, press=kv_press, packed_weights=packed_weights)
    tokens, stats = decode(
        runner,
        prompt_ids,
        chosen,
        sampling=sampling,
        controller=controller,
        max_new_tokens=max_new_tokens,
        eos_ids=set(target.eos_token_ids),
        context_length=context,
        on_tokens=stream,
    )
    text = target.tokenizer.decode(tokens, skip_special_tokens=True)
    return GenerationResult(
        text=text, token_ids=tokens, prompt_ids=prompt_ids, stats=stats, model=target.name, drafter=chosen.name
    )
