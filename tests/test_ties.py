"""Real ties, not a rationale about their absence.

Scaling a head by 8 is exact in floating point: it keeps every tie and every relative margin, so "decisive" models do
not rule ties out. Here ties are built: tiny models whose output head has duplicated rows (an exact tie wherever the
duplicated token wins: argmax, as HF `generate`, takes the first index) and rows one ulp apart (near-ties that two
GEMM shapes may order differently). Every path (fused decoder, HF forward, argmax head, drafters) must emit HF's
first-index token at exact ties; at a near-tie a divergence is excused only within the rounding bound, and the
comparison goes on from there (HF greedy continued from leapdecode's own token) to the end. A bf16 target is compared
with HF's own bf16 greedy the same way.
"""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import tiny_model

import leapdecode.verify as verify_module
from leapdecode import kernels
from leapdecode.controller import DraftLengthController
from leapdecode.decode import decode
from leapdecode.drafters import make_drafter
from leapdecode.runner import Runner
from leapdecode.sampling import SamplingConfig

TIE_BOUND = 2.0**-14  # of max |logit| in the row: fp32 reordering error, see tests/test_lossless.py
BF16_TIE_BOUND = 2.0**-5  # bf16 keeps 8 bits (unit 2^-8); a 2-layer model chains a few roundings of that size
PROMPTS = [[5, 6, 7, 8, 5, 6, 7], [40, 41, 42, 40, 41], [3, 90, 17, 3, 90, 17, 3, 90]]
MAX_NEW = 24


def hf_greedy(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    with torch.no_grad():
        ids = torch.tensor([prompt])
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=0
        )
    return out[0, len(prompt) :].tolist()


def excused_divergences(model, prompt: list[int], out: list[int], bound: float) -> list[int]:
    """Compare `out` with HF greedy to the end. At each first difference the two tokens' logits (one HF forward over
    the common prefix) must be within `bound` of the row's logit scale: then the divergence is excused and the
    comparison continues with HF greedy from leapdecode's token on. Returns the excused positions; a difference
    beyond the bound fails with its margin."""
    excused, j = [], 0
    while j < len(out):  # (an excused divergence at the last token leaves nothing more to compare)
        reference = out[:j] + hf_greedy(model, prompt + out[:j], len(out) - j)
        diff = next((i for i in range(j, len(out)) if out[i] != reference[i]), None)
        if diff is None:
            assert len(reference) == len(out)
            return excused
        with torch.no_grad():
            row = model(torch.tensor([prompt + out[:diff]])).logits[0, -1].float()
        margin, scale = float(row[reference[diff]] - row[out[diff]]), float(row.abs().max())
        assert abs(margin) <= bound * scale, (
            f"position {diff}: {out[diff]} instead of HF's {reference[diff]}, margin {margin:.3g} > "
            f"{bound * scale:.3g} (excused before it: {excused})"
        )
        excused.append(diff)
        j = diff + 1
    return excused


def leapdecode_greedy(model, prompt, drafter, packed_weights=True, max_new_tokens=MAX_NEW) -> list[int]:
    out, _ = decode(
        Runner(model, packed_weights=packed_weights),
        prompt,
        drafter,
        sampling=SamplingConfig(),
        controller=DraftLengthController(k_init=4, adaptive=False),
        max_new_tokens=max_new_tokens,
        eos_ids=set(),
        context_length=256,
    )
    return out


def drafters(model):
    return [
        make_drafter("none"),
        make_drafter("prompt-lookup"),
        make_drafter("draft-model", draft_model=model, confidence=0.0),  # always right: drafts ride through ties
    ]


def settings_paths():
    """(name, kernel settings, packed_weights): every way leapdecode computes a greedy row."""
    return [
        ("fused+auto", dict(), True),
        ("fused+argmax-head", dict(argmax_head="on"), True),
        ("fused+packed", dict(linear="packed", argmax_head="off"), True),
        ("hf-decoder", dict(decoder="hf"), True),
        ("hf-forward", dict(), False),
    ]


@pytest.fixture(scope="module")
def tied():
    """A decisive tiny Llama whose most frequent greedy token `a` gets two exact copies in the head, one at a lower
    index (which then wins every tie, as argmax takes the first index) and one higher."""
    model = tiny_model("llama", seed=21, vocab=96)
    counts = torch.bincount(torch.tensor([t for p in PROMPTS for t in hf_greedy(model, p, MAX_NEW)]), minlength=96)
    a = int(counts.argmax())
    low, high = (a - 1) % 96, (a + 1) % 96
    low, high = min(low, high), max(low, high)
    if low > a:  # a is 0: both copies are above it
        low, high = a, high
    tied_model = copy.deepcopy(model)
    with torch.no_grad():
        tied_model.lm_head.weight[low] = model.lm_head.weight[a]
        tied_model.lm_head.weight[high] = model.lm_head.weight[a]
    return tied_model, a, min(low, a)


def test_duplicated_head_rows_are_exact_ties_that_hf_breaks_at_the_first_index(tied):
    model, a, first = tied
    seen = 0
    for prompt in PROMPTS:
        out = hf_greedy(model, prompt, MAX_NEW)
        seen += out.count(first)
        with torch.no_grad():
            rows = model(torch.tensor([prompt + out])).logits[0, len(prompt) - 1 : -1]
        for j, token in enumerate(out):
            if token == first:  # the copies tie bit for bit in HF's own logits, and HF took the first one
                assert rows[j, a] == rows[j, first] and rows[j].argmax() == first
    assert seen >= 5, "the duplicated token is rarely the argmax: the test would prove little"


@pytest.mark.parametrize("name, setting, packed", settings_paths(), ids=[p[0] for p in settings_paths()])
def test_every_path_breaks_exact_ties_at_the_first_index(tied, name, setting, packed):
    model, _, _ = tied
    with kernels.configured(**setting):
        for prompt in PROMPTS:
            reference = hf_greedy(model, prompt, MAX_NEW)
            for drafter in drafters(model):
                assert leapdecode_greedy(model, prompt, drafter, packed) == reference, (name, drafter.name)


def test_a_last_index_tie_break_is_caught(tied, monkeypatch):
    """The planted bug: verification that breaks exact ties at the last index."""
    model, _, _ = tied

    def last_index_accept(draft, target_logits):
        flipped = target_logits.flip(-1)
        target = target_logits.shape[-1] - 1 - flipped.argmax(-1)
        k = draft.shape[0]
        n = int((draft == target[:k]).cumprod(0).sum()) if k else 0
        return target[: n + 1].tolist()

    import leapdecode.sequence as sequence_module

    monkeypatch.setattr(sequence_module, "greedy_accept", last_index_accept)
    assert any(
        leapdecode_greedy(model, prompt, make_drafter("none")) != hf_greedy(model, prompt, MAX_NEW)
        for prompt in PROMPTS
    )
    assert verify_module.greedy_accept is not last_index_accept


@pytest.fixture(scope="module")
def near_tied():
    """The head's row of the most frequent greedy token `a` copied to its neighbours, each one ulp away in every
    coordinate (one up, one down): logits of a and its copies differ by rounding-sized amounts, real near-ties."""
    model = tiny_model("llama", seed=22, vocab=96)
    counts = torch.bincount(torch.tensor([t for p in PROMPTS for t in hf_greedy(model, p, MAX_NEW)]), minlength=96)
    a = int(counts.argmax())
    near = copy.deepcopy(model)
    with torch.no_grad():
        w = model.lm_head.weight[a]
        near.lm_head.weight[(a + 1) % 96] = torch.nextafter(w, torch.full_like(w, float("inf")))
        near.lm_head.weight[(a - 1) % 96] = torch.nextafter(w, torch.full_like(w, float("-inf")))
    return near


@pytest.mark.parametrize("name, setting, packed", settings_paths(), ids=[p[0] for p in settings_paths()])
def test_near_ties_one_ulp_apart_diverge_only_within_the_bound_and_the_rest_still_matches(
    near_tied, name, setting, packed
):
    with kernels.configured(**setting):
        for prompt in PROMPTS:
            for drafter in drafters(near_tied):
                excused_divergences(near_tied, prompt, leapdecode_greedy(near_tied, prompt, drafter, packed), TIE_BOUND)


def test_the_comparison_goes_on_after_an_excused_divergence(tied):
    """A swap at an exact tie is excused; a decisive wrong token after it is still caught."""
    model, a, first = tied
    prompt = next(p for p in PROMPTS if first in hf_greedy(model, p, MAX_NEW))
    reference = hf_greedy(model, prompt, MAX_NEW)
    j = reference.index(first)
    other = a if first != a else (a + 1) % 96  # the other copy: the same logit, bit for bit
    swapped = reference[:j] + [other]
    swapped += hf_greedy(model, prompt + swapped, MAX_NEW - len(swapped))
    assert excused_divergences(model, prompt, swapped, TIE_BOUND) == [j]
    with torch.no_grad():
        row = model(torch.tensor([prompt + swapped[: j + 2]])).logits[0, -1]
    bad = swapped[: j + 2] + [int(row.argsort()[0])]  # the least likely token, right after the excused one
    bad += hf_greedy(model, prompt + bad, MAX_NEW - len(bad))
    with pytest.raises(AssertionError, match=f"position {j + 2}"):
        excused_divergences(model, prompt, bad, TIE_BOUND)


def test_a_bf16_target_matches_hf_bf16_greedy_up_to_bf16_near_ties():
    """bf16 is lossless against bf16 greedy only up to its own rounding: every divergence must be a bf16 near-tie, and
    the output after it must go on matching HF's bf16 greedy."""
    model = tiny_model("llama", seed=23).to(torch.bfloat16)
    excused = 0
    for prompt in PROMPTS:
        for drafter in drafters(model):
            out = leapdecode_greedy(model, prompt, drafter)
            excused += len(excused_divergences(model, prompt, out, BF16_TIE_BOUND))
    assert excused <= 3 * len(PROMPTS)
