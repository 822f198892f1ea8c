"""Drafters: one file each, one interface (`propose(context, k)`, `observe(context, n_new)`)."""

from __future__ import annotations

from ..errors import LeapDecodeError
from .base import Draft, Drafter
from .draft_model import DraftModelDrafter
from .head import HeadDrafter
from .ngram import NGramDrafter
from .none import NoDrafter
from .oracle import OracleDrafter
from .prompt_lookup import PromptLookupDrafter
from .select import SelectDrafter

DRAFTERS = ("none", "prompt-lookup", "ngram", "draft-model", "head", "select")

__all__ = [
    "Draft",
    "Drafter",
    "DRAFTERS",
    "make_drafter",
    "NoDrafter",
    "PromptLookupDrafter",
    "NGramDrafter",
    "DraftModelDrafter",
    "HeadDrafter",
    "OracleDrafter",
    "SelectDrafter",
]


def make_drafter(name: str, *, draft_model=None, reference: list[int] | None = None, head=None, **options) -> Drafter:
    """Build a drafter by its CLI name. `draft_model` (an HF model) is required for draft-model, `head` (a DraftHead
    attached to the target) for head, `candidates` (Drafter instances) for select, `reference` (the known greedy
    continuation) for oracle."""
    if name == "none":
        return NoDrafter()
    if name == "prompt-lookup":
        return PromptLookupDrafter(**options)
    if name == "ngram":
        return NGramDrafter(**options)
    if name == "draft-model":
        if draft_model is None:
            raise LeapDecodeError("drafter 'draft-model' needs a draft model (--draft-model NAME)")
        return DraftModelDrafter(draft_model, **options)
    if name == "head":
        if head is None:
            raise LeapDecodeError("drafter 'head' needs a trained draft head (leapdecode.heads.load_head)")
        return HeadDrafter(head, **options)
    if name == "select":
        return SelectDrafter(**options)
    if name == "oracle":
        if reference is None:
            raise LeapDecodeError("drafter 'oracle' needs the reference continuation (benchmark only)")
        return OracleDrafter(reference)
    raise LeapDecodeError(f"unknown drafter '{name}': choose one of {', '.join(DRAFTERS)}")
