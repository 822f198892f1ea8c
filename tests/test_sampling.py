"""Speculative sampling keeps the target's distribution: chi-square goodness-of-fit against exact probabilities.

Each test has a negative control (a deliberately wrong acceptance rule) that the same test must reject, so the
statistical check is shown to have power.
"""

from __future__ import annotations

import pytest
import torch
from conftest import noisy_copy, tiny_model
from scipy.stats import chisquare

from leapdecode import verify
from leapdecode.controller import DraftLengthController
from leapdecode.decode import decode
from leapdecode.drafters import make_drafter
from leapdecode.drafters.prediction import with_prediction
from leapdecode.runner import Runner
from leapdecode.sampling import SamplingConfig, probabilities

ALPHA = 1e-3


def goodness_of_fit(counts: dict, expected_probs: dict, n: int) -> float:
    """p-value of observed counts against exact probabilities; cells expecting < 5 are pooled into one."""
    observed, expected, pool_o, pool_e = [], [], 0.0, 0.0
    for cell, prob in expected_probs.items():
        if prob * n >= 5:
            observed.append(counts.get(cell, 0))
            expected.append(prob * n)
        else:
            pool_o += counts.get(cell, 0)
            pool_e += prob * n
    observed.append(pool_o + sum(c for cell, c in counts.items() if cell not in expected_probs))
    expected.append(pool_e)
    if expected[-1] == 0:
        observed, expected = observed[:-1], expected[:-1]
    return float(chisquare(observed, torch.tensor(expected).double().numpy() * sum(observed) / sum(expected)).pvalue)


def first_position_counts(p, q, draft_sampler, n, seed, accept=verify.speculative_accept):
    gen = torch.Generator().manual_seed(seed)
    counts: dict = {}
    for _ in range(n):
        draft = draft_sampler(gen)
        token = accept(draft, None if q is None else q.expand(len(draft), -1), p, [gen] * (len(draft) + 1))[0]
        counts[token] = counts.get(token, 0) + 1
    return counts


@pytest.mark.parametrize("deterministic_draft", [False, True])
def test_rule_preserves_target_distribution(deterministic_draft):
    torch.manual_seed(0)
    vocab = 6
    p = torch.softmax(torch.randn(4, vocab) * 1.5, -1)  # target at 3 draft positions + 1 bonus
    q = torch.softmax(torch.randn(1, vocab) * 1.5, -1)  # drafter distribution
    if deterministic_draft:
        sampler = lambda g: torch.tensor([2, 4, 1])  # noqa: E731 (a lookup drafter's fixed guess)
        q_used = None
    else:
        sampler = lambda g: torch.multinomial(q[0], 3, replacement=True, generator=g)  # noqa: E731
        q_used = q
    n = 6000
    expected = {t: float(p[0, t]) for t in range(vocab)}
    counts = first_position_counts(p, q_used, sampler, n, seed=1)
    assert goodness_of_fit(counts, expected, n) > ALPHA

    def accept_without_residual(draft, draft_probs, target_probs, generators):  # negative control: resample from p
        out = verify.speculative_accept(draft, draft_probs, target_probs, generators)
        return out if len(out) > 1 else [int(torch.multinomial(target_probs[0], 1, generator=generators[0]))]

    wrong = first_position_counts(p, q_used, sampler, n, seed=1, accept=accept_without_residual)
    assert goodness_of_fit(wrong, expected, n) < ALPHA


def exact_sequence_probs(model, prompt, steps, cfg) -> dict:
    """Exact probability of every token sequence of length `steps` under the target's sampling distribution."""
    probs = {(): 1.0}
    for _ in range(steps):
        nxt = {}
        for seq, pr in probs.items():
            with torch.no_grad():
                logits = model(torch.tensor([prompt + list(seq)])).logits[0, -1:]
            dist = probabilities(logits, cfg)[0]
            for t in range(dist.shape[0]):
                if dist[t] > 0:
                    nxt[seq + (t,)] = pr * float(dist[t])
        probs = nxt
    return probs


@pytest.mark.parametrize(
    "drafter_name,cfg",
    [
        ("draft-model", SamplingConfig(temperature=0.8, top_k=4, top_p=0.9)),
        pytest.param("draft-model", SamplingConfig(temperature=1.0), marks=[pytest.mark.slow, pytest.mark.tiny]),
        pytest.param("prompt-lookup", SamplingConfig(temperature=1.2), marks=[pytest.mark.slow, pytest.mark.tiny]),
    ],
)
def test_end_to_end_sampling_matches_plain_sampling(drafter_name, cfg):
    """Four generated tokens: the first from prefill, the next three through one step of a 2-token draft plus its
    bonus token (or shorter steps after a rejection): every row of a real draft, compared with the exact law of whole
    sequences. (Three tokens would leave room for 1-token drafts only.)"""
    vocab = 4
    target = tiny_model("llama", seed=3, head_scale=2.0, vocab=vocab)
    draft = noisy_copy(target, seed=4, noise=0.7)
    prompt = [1, 2, 3, 1, 2]
    exact = exact_sequence_probs(target, prompt, 4, cfg)
    n = 1500
    longest: list[int] = []

    def sample_counts(wrong_rule: bool) -> dict:
        counts: dict = {}
        for seed in range(n):
            drafter = make_drafter(
                drafter_name, **({"draft_model": draft, "confidence": 0.0} if drafter_name == "draft-model" else {})
            )
            run_cfg = SamplingConfig(cfg.temperature, cfg.top_k, cfg.top_p, seed=seed)
            out, stats = decode(
                Runner(target),
                prompt,
                drafter,
                sampling=run_cfg,
                controller=DraftLengthController(k_init=3, adaptive=False),
                max_new_tokens=4,
                eos_ids=set(),
                context_length=64,
            )
            counts[tuple(out)] = counts.get(tuple(out), 0) + 1
            longest.append(max(stats.accepted_per_step))
        return counts

    assert goodness_of_fit(sample_counts(False), exact, n) > ALPHA
    assert drafter_name != "draft-model" or longest.count(3) > n / 20, (
        "2-token drafts were rarely both accepted: their bonus row went untested"
    )
    original = verify.speculative_accept

    def accept_everything(draft_tokens, draft_probs, target_probs, generators):  # negative control
        k = len(draft_tokens)
        return draft_tokens.tolist() + [int(torch.multinomial(target_probs[k], 1, generator=generators[k]))]

    import leapdecode.sequence as decode_module

    decode_module.speculative_accept = accept_everything
    try:
        wrong = sample_counts(True)
    finally:
        decode_module.speculative_accept = original
    assert goodness_of_fit(wrong, exact, n) < ALPHA


@pytest.mark.parametrize("seed", range(12))
def test_seeded_sampling_is_the_same_for_every_model_free_drafter_and_draft_length(seed):
    """Each output position draws from its own seeded stream, so a model-free drafter (q one-hot) changes how many
    forwards a seeded sample takes, never which tokens it is: plain sampling's tokens, whatever k is chosen."""
    target = tiny_model("qwen2", seed=5, head_scale=1.5)
    prompt = [7, 8, 9, 7, 8, 9, 7, 8]
    cfg = SamplingConfig(temperature=0.9, top_k=20, top_p=0.95, seed=seed)

    def sample(name: str, k: int, adaptive: bool, prediction=()) -> list[int]:
        out, _ = decode(
            Runner(target),
            prompt,
            with_prediction(make_drafter(name), prediction),
            sampling=cfg,
            controller=DraftLengthController(k_init=k, k_max=8, adaptive=adaptive),
            max_new_tokens=24,
            eos_ids=set(),
            context_length=128,
        )
        return out

    plain = sample("none", 1, False)
    for name, k, adaptive in (("prompt-lookup", 3, False), ("prompt-lookup", 8, True), ("ngram", 5, False)):
        assert sample(name, k, adaptive) == plain, (name, k, adaptive)
    assert sample("none", 1, False) == plain  # and the same seed gives the same tokens again
    for prediction in (plain, plain[::-1]):  # copies of a request's prediction (drafters.prediction) are one-hot too
        assert sample("none", 4, True, prediction) == plain


def hf_probabilities(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """The distribution HF `generate(do_sample=True)` draws from: its own warpers, in its order."""
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    scores = logits.float()
    warpers = [TemperatureLogitsWarper(cfg.temperature)]
    if cfg.top_k:
        warpers.append(TopKLogitsWarper(cfg.top_k))
    if cfg.top_p < 1:
        warpers.append(TopPLogitsWarper(cfg.top_p))
    for warper in warpers:
        scores = warper(None, scores)
    return scores.softmax(-1)


def test_top_p_from_candidates_drops_what_the_full_sort_drops():
    """top_p_drop's fast route (sorting only the tokens above a cut) gives the full sort's set on rows of a real
    vocabulary's size: spread, peaked and tied logits (ties at the boundary go the sorted route); and it is the route
    most rows take, so this compares it rather than the fallback."""
    from leapdecode import sampling

    gen = torch.Generator().manual_seed(1)
    fast = [0, 0, 0, 0]  # rows the fast route decided, by kind (of 120 each)
    for trial in range(240):
        vocab = (1024, 8192, 49152)[trial % 3]
        kind = trial % 4
        if kind == 0:  # spread
            logits = torch.randn(2, vocab, generator=gen) * (1 + trial % 7)
        elif kind == 1:  # a few likely tokens, as a language model's
            logits = torch.randn(2, vocab, generator=gen) * 2
            logits[:, torch.randint(0, vocab, (16,), generator=gen)] += 6 + torch.rand(16, generator=gen) * 8
        elif kind == 2:  # few levels: ties everywhere, at the boundary too
            logits = (torch.randn(5, generator=gen) * 4)[torch.randint(0, 5, (2, vocab), generator=gen)]
        else:  # one level far above the rest: top_p cuts inside the tie
            logits = torch.randn(2, vocab, generator=gen)
            logits[:, :40] = 20.0
        top_p = float(torch.empty(()).uniform_(0.05, 0.999, generator=gen))
        expected = sampling._top_p_drop_sorted(logits, top_p)
        assert torch.equal(sampling.top_p_drop(logits, top_p), expected), (trial, top_p)
        probs = logits.softmax(-1)
        for row in range(2):
            total = float(probs[row].double().sum())
            fast[kind] += sampling._top_p_drop_fast(logits[row], probs[row], total, 1 - top_p) is not None
    assert fast[0] + fast[1] > 160 and fast[3] < 120, fast  # untied rows mostly fast; a cut inside a tie is sorted
    cfg = SamplingConfig(temperature=0.8, top_p=0.9)
    logits = torch.randn(8, 49152, generator=gen) * 4
    torch.testing.assert_close(probabilities(logits, cfg), hf_probabilities(logits, cfg), rtol=1e-6, atol=1e-7)
    assert torch.equal(probabilities(logits, cfg) > 0, hf_probabilities(logits, cfg) > 0)


def tied_logits(gen: torch.Generator, rows: int, vocab: int) -> torch.Tensor:
    """Logits drawn from a few levels, so that many tokens tie (also at the top-k and top-p boundaries)."""
    levels = torch.tensor([0.0, -0.6931471805599453, -1.3862943611198906, -2.5, -4.0])  # log 1, log 1/2, log 1/4
    return levels[torch.randint(0, len(levels), (rows, vocab), generator=gen)]


@pytest.mark.parametrize(
    "temperature,top_k,top_p",
    [
        (1.0, 0, 1.0),
        (0.7, 0, 1.0),
        (1.3, 5, 1.0),
        (1.0, 0, 0.5),
        (0.8, 0, 0.9),
        (1.0, 3, 0.75),
        (0.6, 8, 0.3),
        (1.0, 0, 0.25),
        (1.0, 1, 1.0),
        (2.0, 0, 0.999),
    ],
)
def test_probabilities_match_hf_logits_warpers(temperature, top_k, top_p):
    gen = torch.Generator().manual_seed(0)
    cfg = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p)
    for logits in (
        torch.randn(64, 40, generator=gen) * 3,
        tied_logits(gen, 256, 12),
        torch.zeros(4, 8),
        torch.tensor([[0.0, 0.0, 0.0, 0.0, -9.0]]),
    ):
        ours, theirs = probabilities(logits, cfg), hf_probabilities(logits, cfg)
        assert torch.equal(ours > 0, theirs > 0), "a different set of tokens survives top-k/top-p"
        torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-7)


def test_top_p_boundary_tie_keeps_the_tokens_hf_keeps():
    """Four equal tokens, top_p 0.5: the mass before the third reaches 0.5 exactly, so two survive; which two is
    decided by HF's sort, and leapdecode must keep the same two (else the sampled distribution differs)."""
    cfg = SamplingConfig(temperature=1.0, top_p=0.5)
    logits = torch.zeros(1, 4)
    assert torch.equal(probabilities(logits, cfg), hf_probabilities(logits, cfg))
    assert int((probabilities(logits, cfg) > 0).sum()) == 2
