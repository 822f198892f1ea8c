"""Drafters by name, with what they share across requests loaded once: the draft model, the draft head. One factory
for generate, the Engine (one fresh drafter per request: drafters keep per-request state) and the benchmarks."""

from __future__ import annotations

import weakref
from typing import Callable

import torch

from ..errors import LeapDecodeError, require
from ..kernels import install_packed_linear
from ..models.resolve import resolve_model
from . import Drafter, make_drafter


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
    if drafter == "prompt-lookup":
        options.setdefault("calibration", shared_calibration(target.model, drafter))
    if drafter == "head":
        options["head"] = attached_head(target, options.pop("head", None) or target.name)
    make_drafter(drafter, **options)  # fail now on a bad name or option
    return lambda: make_drafter(drafter, **options)


SELECT_CANDIDATES = ("head", "prompt-lookup", "ngram")


def _select_factory(target, candidates=None, head=None, store_key=None, **options) -> Callable[[], Drafter]:
    """Drafter 'select': a per-request choice among `candidates` (names; default: the shipped head where the target
    has one, prompt lookup and n-grams), each built as it would be alone (`head`, `store_key` go to theirs)."""
    from ..heads.model import has_shipped_head

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
    from ..heads.model import has_shipped_head

    return "head" if has_shipped_head(target_name) else "prompt-lookup"


_calibrations: "weakref.WeakKeyDictionary[torch.nn.Module, dict]" = weakref.WeakKeyDictionary()


def shared_calibration(model: torch.nn.Module, drafter: str):
    """The acceptance calibration (drafters.calibration) that every `drafter` of this target model shares, across the
    requests of an engine and the calls of `generate` alike (a draft head keeps its own, on the head)."""
    from .calibration import AcceptanceCalibration

    return _calibrations.setdefault(model, {}).setdefault(drafter, AcceptanceCalibration())


_heads: "weakref.WeakKeyDictionary[torch.nn.Module, dict]" = weakref.WeakKeyDictionary()


def attached_head(target, source):
    """The draft head from `source` (a directory, or a target name with a shipped head) attached to the target;
    loaded once per target model, in the precision that steps it fastest on this host (heads.precision: fp32, bf16,
    int8 or q8 weights, timed on the head itself). Its precision changes its drafts a little, never the output."""
    from ..heads.model import load_head
    from ..heads.precision import fastest, int8_available, int8_head, q8_available, q8_head

    loaded = _heads.setdefault(target.model, {})
    if str(source) not in loaded:
        fp32 = load_head(source, dtype=torch.float32).attach(target.model)
        candidates = {"float32": fp32, "bfloat16": load_head(source, dtype=torch.bfloat16).attach(target.model)}
        if int8_available():
            candidates["int8"] = int8_head(fp32)
        if q8_available():
            candidates["q8"] = q8_head(fp32)
        for head in candidates.values():  # timed on the routes it drafts on
            install_packed_linear(head)
        loaded[str(source)] = candidates[fastest(candidates)]
    return loaded[str(source)]
