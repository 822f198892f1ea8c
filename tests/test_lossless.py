"""Losslessness: greedy speculative decoding emits exactly the tokens of plain greedy decoding (HF `generate`)."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import VOCAB, noisy_copy, tiny_head, tiny_model
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from leapdecode.controller import DraftLengthController
from leapdecode.decode import decode
from leapdecode.drafters import make_drafter
from leapdecode.drafters.draft_model import LOOKUP
from leapdecode.models.quantize import quantize_int8
from leapdecode.runner import Runner
from leapdecode.sampling import SamplingConfig

ARCHS = ["llama", "qwen2", "qwen2-q4"]  # q4: 4-bit weights, bf16 products; HF greedy runs the same q4 model


@pytest.fixture(scope="module")
def models():
    out = {}
    for i, arch in enumerate(ARCHS):
        target = tiny_model(arch, seed=10 + i)
        out[arch] = {
            "target": target,
            "drafts": {
                "self": target,  # always agrees: long accepted runs, exercises k growth and EOS inside drafts
                "noisy": noisy_copy(target, seed=20 + i, noise=0.5),  # agrees sometimes
                "independent": tiny_model(arch, seed=30 + i),  # rarely agrees: many rejections and rollbacks
                "int8": quantize_int8(noisy_copy(target, seed=40 + i, noise=0.2)),  # the default draft precision
            },
            "heads": {"trained": tiny_head(target, trained=True)[0], "random": tiny_head(target, trained=False)[0]},
        }
    return out


def hf_greedy(model, prompt: list[int], max_new_tokens: int, eos: int | None) -> list[int]:
    with torch.no_grad():
        ids = torch.tensor([prompt])
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=0,
        )
    tokens = out[0, len(prompt) :].tolist()
    if eos is not None and eos in tokens:
        tokens = tokens[: tokens.index(eos) + 1]
    return tokens


@st.composite
def prompts(draw):
    """Random prompts, often with repeated chunks so that lookup drafters find matches."""
    chunk = draw(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=8))
    prefix = draw(st.lists(st.integers(0, VOCAB - 1), max_size=12))
    repeats = draw(st.integers(1, 4))
    return (prefix + chunk * repeats)[:40] or [1]


def run_property(models, arch, data):
    prompt = data.draw(prompts(), label="prompt")
    drafter_name = data.draw(
        st.sampled_from(["none", "prompt-lookup", "ngram", "draft-model", "head", "select"]), label="drafter"
    )
    k = data.draw(st.integers(1, 8), label="k")
    adaptive = data.draw(st.booleans(), label="adaptive")
    max_new = data.draw(st.integers(1, 40), label="max_new_tokens")
    target = models[arch]["target"]
    reference = hf_greedy(target, prompt, max_new, None)
    eos_choice = data.draw(st.sampled_from(["none", "inside", "first", "absent"]), label="eos")
    eos = {
        "none": None,
        "inside": reference[len(reference) // 2],
        "first": reference[0],
        "absent": next(t for t in range(VOCAB) if t not in reference),
    }[eos_choice]
    if eos is not None:
        reference = hf_greedy(target, prompt, max_new, eos)
    options = {}
    if drafter_name == "draft-model":
        kind = data.draw(st.sampled_from(["self", "noisy", "independent", "int8"]), label="draft")
        options = {
            "draft_model": models[arch]["drafts"][kind],
            "confidence": data.draw(st.sampled_from([0.0, 0.05, 0.5]), label="confidence"),  # 0.5: "after" copies
            "lookup": data.draw(st.sampled_from(LOOKUP), label="lookup"),
        }
    elif drafter_name == "prompt-lookup":
        options = {"max_ngram": data.draw(st.integers(1, 4), label="max_ngram")}
    elif drafter_name == "head":
        options = {
            "head": models[arch]["heads"][data.draw(st.sampled_from(["trained", "random"]), label="head")],
            "lookup_ngram": data.draw(st.integers(0, 3), label="lookup_ngram"),
            "confidence": data.draw(st.sampled_from([0.0, 0.1, 0.5]), label="confidence"),
        }
    elif drafter_name == "ngram":
        options = {"store_key": f"test-{arch}"}
    elif drafter_name == "select":
        head = models[arch]["heads"][data.draw(st.sampled_from(["trained", "random"]), label="head")]
        candidates = [
            make_drafter("head", head=head),
            make_drafter("prompt-lookup"),
            make_drafter("ngram", store_key=f"test-select-{arch}"),
        ]
        options = {"candidates": candidates, "trial_steps": data.draw(st.integers(0, 4), label="trial_steps")}
    drafter = make_drafter(drafter_name, **options)
    out, stats = decode(
        Runner(target),
        prompt,
        drafter,
        sampling=SamplingConfig(),
        controller=DraftLengthController(k_init=k, k_max=max(k, 8), adaptive=adaptive),
        max_new_tokens=max_new,
        eos_ids=set() if eos is None else {eos},
        context_length=512,
    )
    assert out == reference, f"{drafter_name} diverged from plain greedy"
    assert stats.new_tokens == len(out)
    assert sum(stats.accepted_per_step) == len(out)
    assert stats.forward_passes == len(stats.accepted_per_step) <= len(out)


@pytest.mark.parametrize("arch", ARCHS)
@settings(max_examples=110, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_greedy_speculative_equals_plain_greedy(models, arch, data):
    run_property(models, arch, data)


def test_self_drafting_is_accepted_in_long_runs(models):
    """A draft model identical to the target is always right: fewer forwards than tokens (the test can fail).
    The draft length is fixed: a draft model as costly as the target never pays, so the adaptive controller would
    rightly stop drafting (its choices are tested with synthetic timings in test_controller.py)."""
    target = models["llama"]["target"]
    drafter = make_drafter("draft-model", draft_model=target, confidence=0.0)
    out, stats = decode(
        Runner(target),
        [3, 1, 4, 1, 5],
        drafter,
        sampling=SamplingConfig(),
        controller=DraftLengthController(k_init=4, adaptive=False),
        max_new_tokens=40,
        eos_ids=set(),
        context_length=512,
    )
    assert out == hf_greedy(target, [3, 1, 4, 1, 5], 40, None)
    assert stats.forward_passes <= 10
    assert stats.acceptance_rate == 1.0


def test_context_limit_stops_generation(models):
    target = models["qwen2"]["target"]
    prompt = list(range(20))
    out, stats = decode(
        Runner(target),
        prompt,
        make_drafter("prompt-lookup"),
        sampling=SamplingConfig(),
        controller=DraftLengthController(),
        max_new_tokens=100,
        eos_ids=set(),
        context_length=32,
    )
    assert len(prompt) + len(out) == 32
    assert stats.stop_reason == "context"
    assert out == hf_greedy(target, prompt, 12, None)


# ------------------------------------------------------------------ models whose argmax is not made decisive

# The near-tie bound. Speculative and plain greedy run the same fp32 arithmetic in different orders: a (k+1)-row
# verification GEMM against one row, keys read from the cache against recomputed ones. Reordering a length-n
# reduction changes its result by at most n * u * sum|a_i b_i| (u = 2^-24), in practice about sqrt(n) * u of the
# operands' scale, and a 2-layer model chains a handful of such reductions (n <= 128 here). Their accumulated error
# is a few hundred u of the logit scale at most; we allow TIE_BOUND = 2^-14 (1024 u) of max |logit| in that row. A
# real verification bug makes the first differing token one whose logit is a typical gap (orders of magnitude above
# that) below the argmax, so it cannot hide under the bound.
TIE_BOUND = 2.0**-14


@pytest.fixture(scope="module")
def undecided():
    """Tiny models with unscaled output heads (logits close together, near-ties possible) and their drafts."""
    out = {}
    for i, arch in enumerate(ARCHS):
        target = tiny_model(arch, seed=50 + i, head_scale=1.0)
        out[arch] = {
            "target": target,
            "noisy": noisy_copy(target, seed=60 + i, noise=0.3),
            "independent": tiny_model(arch, seed=70 + i, head_scale=1.0),
            "int8": quantize_int8(noisy_copy(target, seed=80 + i, noise=0.1)),
        }
    return out


def unexplained_difference(model, prompt: list[int], out: list[int], reference: list[int]) -> str | None:
    """None when out equals the reference, or when at their first difference the two tokens' logits (one fp32
    forward over the common prefix) are within TIE_BOUND of the row's logit scale; else what differs and by how much."""
    if out == reference:
        return None
    j = next((i for i, (a, b) in enumerate(zip(out, reference)) if a != b), min(len(out), len(reference)))
    if j == min(len(out), len(reference)):
        return f"lengths differ ({len(out)} vs {len(reference)}) with no differing token"
    with torch.no_grad():
        row = model(torch.tensor([prompt + reference[:j]])).logits[0, -1].float()
    margin, scale = float(row[reference[j]] - row[out[j]]), float(row.abs().max())
    if abs(margin) <= TIE_BOUND * scale:
        return None
    return (
        f"position {j}: {out[j]} instead of {reference[j]}, logit margin {margin:.3g} > bound {TIE_BOUND * scale:.3g}"
    )


@pytest.mark.parametrize("arch", ARCHS)
@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_greedy_on_undecided_models_differs_from_hf_only_at_near_ties(undecided, arch, data):
    """The reference is HF `generate` greedy on a model whose head is not scaled: every difference must be a near-tie
    (see TIE_BOUND) at the first differing position; anything else fails."""
    prompt = data.draw(prompts(), label="prompt")
    name = data.draw(st.sampled_from(["none", "prompt-lookup", "ngram", "draft-model"]), label="drafter")
    k = data.draw(st.integers(1, 8), label="k")
    max_new = data.draw(st.integers(1, 40), label="max_new_tokens")
    target = undecided[arch]["target"]
    options = {"prompt-lookup": {"max_ngram": 2}, "ngram": {"store_key": f"undecided-{arch}"}, "none": {}}.get(name)
    if name == "draft-model":
        kind = data.draw(st.sampled_from(["noisy", "independent", "int8"]), label="draft")
        options = {
            "draft_model": undecided[arch][kind],
            "confidence": data.draw(st.sampled_from([0.0, 0.5]), label="confidence"),
            "lookup": data.draw(st.sampled_from(LOOKUP), label="lookup"),
        }
    out, _ = decode(
        Runner(target),
        prompt,
        make_drafter(name, **options),
        sampling=SamplingConfig(),
        controller=DraftLengthController(k_init=k, k_max=8, adaptive=data.draw(st.booleans())),
        max_new_tokens=max_new,
        eos_ids=set(),
        context_length=512,
    )
    problem = unexplained_difference(target, prompt, out, hf_greedy(target, prompt, max_new, None))
    assert problem is None, f"{name} diverged from HF greedy beyond a near-tie: {problem}"


def test_near_tie_check_rejects_a_decisive_difference(undecided):
    """The explanation has teeth: a token swapped for the runner-up where the top-2 gap is above the bound fails,
    the same swap at a manufactured exact tie passes."""
    target = undecided["llama"]["target"]
    prompt = [5, 6, 7, 5, 6]
    reference = hf_greedy(target, prompt, 12, None)
    with torch.no_grad():
        rows = target(torch.tensor([prompt + reference])).logits[0, len(prompt) - 1 : -1]
    top2 = rows.topk(2)
    j = int(((top2.values[:, 0] - top2.values[:, 1]) / rows.abs().amax(-1)).argmax())
    swapped = reference[:j] + [int(top2.indices[j, 1])]
    assert "logit margin" in unexplained_difference(target, prompt, swapped, reference)
    tied = copy.deepcopy(target)
    with torch.no_grad():
        tied.lm_head.weight[int(top2.indices[j, 1])] = tied.lm_head.weight[reference[j]]
    assert unexplained_difference(tied, prompt, swapped, reference) is None


def test_speculation_stops_at_the_context_limit_where_plain_decoding_does(models):
    """A step emits one token more than it drafts: a draft may only fill the context up to one short of its limit, or
    the last step runs one token past where plain decoding stops (seen with a drafter that always drafts)."""
    target = models["llama"]["target"]
    for context_length in range(8, 16):
        lengths = set()
        for drafter in (make_drafter("none"), make_drafter("draft-model", draft_model=target, confidence=0.0)):
            out, stats = decode(
                Runner(target),
                [1, 2, 3, 4],
                drafter,
                sampling=SamplingConfig(),
                controller=DraftLengthController(k_init=4, adaptive=False),
                max_new_tokens=50,
                eos_ids=set(),
                context_length=context_length,
            )
            assert stats.stop_reason == "context" and out == hf_greedy(target, [1, 2, 3, 4], len(out), None)
            lengths.add(4 + len(out))
        assert lengths == {context_length}, (context_length, lengths)
