"""Speculative sampling over whole steps: drafts of 2-6 tokens, every output position checked.

The check is a per-position conditional chi-square. Under a correct rule, each output token z_j is drawn from the
target's sampling distribution p(. | z_<j), whatever was drafted, accepted or rejected before it. For the tokens of
one group (here: the row r of the step that emitted them, so every draft position is tested on its own, and the
token before them, so that dependence on the previous token cannot cancel out),
O = observed one-hot counts and E = sum of the exact p(. | prefix) vectors; O - E is a sum of martingale differences
with covariance C = sum(diag p - p p^T), so T = (O - E)^T C^+ (O - E) is chi-square with rank(C) degrees of freedom.
Group statistics add up (independent martingale components), giving one p-value per run.

The target is either a bigram table (the step rule runs through the production `SequenceState`, no model needed) or
a tiny transformer with a sampling draft model (through `decode`). Every subtle wrong rule below must be rejected by
the same test, so the test is shown to have power against it.
"""

from __future__ import annotations

import pytest
import torch
from conftest import noisy_copy, tiny_model
from scipy.stats import chi2

import leapdecode.sequence as sequence_module
from leapdecode.controller import DraftLengthController
from leapdecode.decode import decode
from leapdecode.drafters import Draft, Drafter, make_drafter
from leapdecode.runner import Runner
from leapdecode.sampling import SamplingConfig, generator_at, probabilities
from leapdecode.sequence import SequenceState
from leapdecode.verify import _sample

ALPHA = 1e-3
V = 6


def conditional_chi_square(records, key=None) -> float:
    """records: (group, token, exact probability vector). p-value of the summed per-group statistic. `key` maps a
    record's group to the group it is tested in (any grouping decided before the token is a valid one)."""
    groups: dict = {}
    for group, token, p in records:
        group = group if key is None else key(group)
        o, e, c = groups.setdefault(
            group,
            [
                torch.zeros(len(p), dtype=torch.float64),
                torch.zeros(len(p), dtype=torch.float64),
                torch.zeros(len(p), len(p), dtype=torch.float64),
            ],
        )
        p = p.double()
        o[token] += 1
        e += p
        c += torch.diag(p) - torch.outer(p, p)
    stat, dof = 0.0, 0
    for o, e, c in groups.values():
        if e.sum() < 30:  # too few tokens for the normal approximation: skip the group
            continue
        stat += float((o - e) @ torch.linalg.pinv(c, hermitian=True, rtol=1e-9) @ (o - e))
        dof += int(torch.linalg.matrix_rank(c, hermitian=True, rtol=1e-9))
    assert dof > 0
    return float(chi2.sf(stat, dof))


# ------------------------------------------------------------------ subtly wrong acceptance rules (controls)


def buggy_accept(bug: str):
    """verify.speculative_accept with one planted bug."""

    def accept(draft, draft_probs, target_probs, generators):
        states = [g.get_state() for g in generators]
        k = draft.shape[0]
        tokens = draft.tolist()
        for i in range(k):
            gen = generators[i]
            if bug == "generators shifted by one" and i > 0:
                gen = torch.Generator()
                gen.set_state(states[i - 1])  # row i replays row i-1's randomness
            if draft_probs is None:
                y = _sample(target_probs[i], gen)
                if y != tokens[i]:
                    return tokens[:i] + [y]
                continue
            q = draft_probs[0] if bug == "q of row 0 for every row" else draft_probs[i]
            x = tokens[0] if bug == "p/q of the wrong token" else tokens[i]
            if torch.rand((), generator=gen) * q[x] < target_probs[i, x]:
                continue
            if bug == "rows >= 4 accept every draft" and i >= 4:
                continue
            if bug == "residual without q":
                residual = target_probs[i]
            elif bug == "residual of half q":
                residual = (target_probs[i] - q / 2).clamp_min(0)
            else:
                residual = (target_probs[i] - q).clamp_min(0)
            if residual.sum() <= 0:
                residual = target_probs[i]
            return tokens[:i] + [_sample(residual, gen)]
        return tokens + [_sample(target_probs[k], generators[k])]

    return accept


SAMPLED_BUGS = [
    "residual without q",
    "residual of half q",
    "q of row 0 for every row",
    "p/q of the wrong token",
    "generators shifted by one",
]


# ------------------------------------------------------------------ bigram target, table drafter


class TableDrafter(Drafter):
    """A sampling draft 'model' whose next-token law depends on the last token: q(. | last) from a table."""

    name = "table"

    def __init__(self, q_logits: torch.Tensor):
        self.q_logits = q_logits

    def start(self, prompt_ids, sampling):
        self.sampling, self.gen = sampling, generator_at(sampling.seed, 0, stream=1)

    def propose(self, context, k):
        last, tokens, dists = context[-1], [], []
        for _ in range(k):
            q = probabilities(self.q_logits[last][None], self.sampling)[0]
            last = int(torch.multinomial(q, 1, generator=self.gen))
            tokens.append(last)
            dists.append(q)
        return Draft(tokens, torch.stack(dists) if tokens else None)


def tables(seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(V, V, generator=g) * 1.5, torch.randn(V, V, generator=g) * 1.5


def bigram_records(p_logits, make, cfg, k, runs, max_new=14):
    """Run `runs` seeded requests through SequenceState with a bigram target; record (row, token, exact p)."""
    exact = probabilities(p_logits, cfg)  # row t: the target's law after token t
    records, longest = [], 0
    for seed in range(runs):
        prompt = [seed % V, (seed // V) % V, seed % V]
        seq = SequenceState(
            prompt,
            make(),
            sampling=SamplingConfig(cfg.temperature, cfg.top_k, cfg.top_p, seed=seed),
            controller=DraftLengthController(k_init=k, k_max=k, adaptive=False),
            max_new_tokens=max_new,
            eos_ids=set(),
            context_length=10_000,
        )
        logits = p_logits[prompt[-1]][None]
        while True:
            last = seq.context[-1]
            new, _ = seq.accept(logits)
            for row, token in enumerate(new):
                records.append(((row, last), token, exact[last]))
                last = token
            longest = max(longest, len(new))
            if seq.finished:
                break
            logits = p_logits[torch.tensor(seq.propose(k))]
    assert longest >= 3, "no step accepted two drafted tokens: positions >= 1 were never tested"
    return records


CONFIGS = [SamplingConfig(temperature=1.0), SamplingConfig(temperature=0.7, top_k=4, top_p=0.9)]


@pytest.mark.parametrize("cfg", CONFIGS, ids=["t1", "t0.7-topk-topp"])
@pytest.mark.parametrize("k", [2, 6])
def test_sampled_drafts_keep_every_position_exact(cfg, k):
    p_logits, q_logits = tables(seed=k)
    records = bigram_records(p_logits, lambda: TableDrafter(q_logits), cfg, k, runs=300)
    assert conditional_chi_square(records) > ALPHA


def tokens_per_row(records) -> dict[int, int]:
    counts: dict[int, int] = {}
    for (row, _), _, _ in records:
        counts[row] = counts.get(row, 0) + 1
    return counts


K_DEEP = 6


def deep_records(runs: int = 300):
    """k = 6 with a drafter close to the target (most drafts accepted), so the deepest rows and the bonus token get
    hundreds of tokens each."""
    p_logits, _ = tables(seed=11)
    g = torch.Generator().manual_seed(12)
    q_logits = p_logits + 0.6 * torch.randn(V, V, generator=g)
    return lambda: bigram_records(
        p_logits, lambda: TableDrafter(q_logits), SamplingConfig(temperature=1.0), K_DEEP, runs=runs, max_new=30
    )


def test_every_draft_row_and_the_bonus_token_get_enough_tested_tokens():
    """Rows 0..k (row k: the bonus token after k accepted drafts) each hold at least 150 tokens; tested per row (and
    per row and previous token), each passes."""
    records = deep_records()()
    counts = tokens_per_row(records)
    assert all(counts.get(row, 0) >= 150 for row in range(K_DEEP + 1)), counts
    assert conditional_chi_square(records, key=lambda group: group[0]) > ALPHA
    assert conditional_chi_square(records) > ALPHA


def test_a_bug_on_deep_rows_only_is_rejected(monkeypatch):
    """Rows >= 4 accept every draft (no acceptance test there): rows 0-3 are untouched, only the deep rows carry q's
    law instead of p's; the per-row test must see it."""
    monkeypatch.setattr(sequence_module, "speculative_accept", buggy_accept("rows >= 4 accept every draft"))
    records = deep_records()()
    assert conditional_chi_square([r for r in records if r[0][0] < 4], key=lambda group: group[0]) > ALPHA
    assert conditional_chi_square(records, key=lambda group: group[0]) < ALPHA


@pytest.mark.parametrize("name", ["prompt-lookup", "ngram"])
def test_model_free_drafts_keep_every_position_exact(name):
    p_logits, _ = tables(seed=7)
    options = {"max_ngram": 1} if name == "prompt-lookup" else {"store_key": "test-sampling-steps"}
    records = bigram_records(
        p_logits, lambda: make_drafter(name, **options), SamplingConfig(temperature=1.0), 5, runs=400
    )
    assert conditional_chi_square(records) > ALPHA


@pytest.mark.parametrize("bug", SAMPLED_BUGS)
def test_wrong_rules_are_rejected_with_sampled_drafts(bug, monkeypatch):
    monkeypatch.setattr(sequence_module, "speculative_accept", buggy_accept(bug))
    p_logits, q_logits = tables(seed=4)
    # 600 runs: at 300 the subtlest bug (half of q left in the residual) sits near ALPHA, where the random stream decides
    records = bigram_records(p_logits, lambda: TableDrafter(q_logits), SamplingConfig(temperature=1.0), 4, runs=600)
    assert conditional_chi_square(records) < ALPHA, bug


def test_replayed_randomness_is_rejected_with_model_free_drafts(monkeypatch):
    monkeypatch.setattr(sequence_module, "speculative_accept", buggy_accept("generators shifted by one"))
    p_logits, _ = tables(seed=7)
    records = bigram_records(
        p_logits, lambda: make_drafter("prompt-lookup", max_ngram=1), SamplingConfig(temperature=1.0), 5, runs=400
    )
    assert conditional_chi_square(records) < ALPHA


# ------------------------------------------------------------------ tiny transformer, sampling draft model


def model_records(target, draft, cfg, runs, k=4, max_new=6, lookup="off"):
    records, longest = [], 0
    for seed in range(runs):
        prompt = [seed % V, 2, 3, (seed // V) % V]
        run_cfg = SamplingConfig(cfg.temperature, cfg.top_k, cfg.top_p, seed=seed)
        out, stats = decode(
            Runner(target),
            prompt,
            make_drafter("draft-model", draft_model=draft, confidence=0.5 if lookup == "after" else 0.0, lookup=lookup),
            sampling=run_cfg,
            controller=DraftLengthController(k_init=k, k_max=k, adaptive=False),
            max_new_tokens=max_new,
            eos_ids=set(),
            context_length=64,
        )
        with torch.no_grad():
            logits = target(torch.tensor([prompt + out])).logits[0, len(prompt) - 1 : len(prompt) - 1 + len(out)]
        exact = probabilities(logits, cfg)
        rows = [r for n in stats.accepted_per_step for r in range(n)]
        longest = max(longest, *stats.accepted_per_step)
        records += [
            ((row, (prompt + out)[len(prompt) + j - 1]), token, exact[j])
            for j, (row, token) in enumerate(zip(rows, out))
        ]
    assert longest >= 3, "no step accepted two drafted tokens: positions >= 1 were never tested"
    return records


@pytest.fixture(scope="module")
def transformer_pair():
    target = tiny_model("llama", seed=3, head_scale=6.0, vocab=V)
    return target, noisy_copy(target, seed=4, noise=1.0)


@pytest.mark.parametrize("lookup", ["off", "first", "after"])
def test_draft_model_steps_keep_every_position_exact(transformer_pair, monkeypatch, lookup):
    """With lookup, drafts mix tokens copied from the request (q one-hot) with sampled ones (q of the draft model),
    before or after them (after: where the draft model's confidence falls under 0.5), so both kinds of row meet in one
    verification."""
    target, draft = transformer_pair
    cfg = SamplingConfig(temperature=0.9, top_p=0.95)
    longer = {} if lookup == "off" else {"max_new": 12, "k": 6}  # room for repeats to copy
    records = model_records(target, draft, cfg, runs=200, lookup=lookup, **longer)
    assert conditional_chi_square(records) > ALPHA
    monkeypatch.setattr(sequence_module, "speculative_accept", buggy_accept("p/q of the wrong token"))
    records = model_records(target, draft, cfg, runs=200, lookup=lookup, **longer)
    assert conditional_chi_square(records) < ALPHA


def test_plain_sampling_draws_position_j_from_its_own_generator():
    """Output position j is decided by generator_at(seed, j) alone (what makes seeded output independent of k)."""
    target = tiny_model("qwen2", seed=5, head_scale=1.5, vocab=V)
    cfg = SamplingConfig(temperature=1.0, seed=11)
    prompt = [1, 2, 3]
    out, _ = decode(
        Runner(target),
        prompt,
        make_drafter("none"),
        sampling=cfg,
        controller=DraftLengthController(k_init=1, adaptive=False),
        max_new_tokens=6,
        eos_ids=set(),
        context_length=64,
    )
    with torch.no_grad():
        logits = target(torch.tensor([prompt + out])).logits[0, len(prompt) - 1 : -1]
    exact = probabilities(logits, cfg)
    assert out == [_sample(exact[j], generator_at(11, j)) for j in range(len(out))]


@pytest.mark.parametrize("lookup", ["first", "after"])
def test_copied_draft_rows_are_one_hot_and_written_rows_are_the_draft_models_q(transformer_pair, lookup):
    """Where a draft mixes copied and written tokens, each row of its q is the one-hot of a copied token or exactly the
    draft model's distribution after the tokens before it, and the copies sit where `lookup` puts them (first: a
    prefix, after: a suffix). A q that misstates a copied token's probability would bias acceptance."""
    target, draft_model = transformer_pair
    cfg = SamplingConfig(temperature=0.9, top_p=0.95, seed=0)
    drafter = make_drafter("draft-model", draft_model=draft_model, confidence=0.5, lookup=lookup)
    mixed = 0
    for seed in range(V**3):
        context = [seed % V, 2, 3, (seed // V) % V, 2, 3, seed // V**2]
        drafter.start(context[:3], cfg)
        draft = drafter.propose(context, 6)
        if draft.probs is None:
            continue
        with torch.no_grad():
            logits = draft_model(torch.tensor([context + draft.tokens])).logits[0, len(context) - 1 : -1]
        q = probabilities(logits, cfg)
        copied = [not torch.allclose(row, q_i, atol=1e-5) for row, q_i in zip(draft.probs, q)]
        for t, row, is_copy in zip(draft.tokens, draft.probs, copied):
            assert not is_copy or (row[t] == 1 and row.sum() == 1), (seed, draft.tokens, row)
        expected_order = sorted(copied, reverse=lookup == "first")  # copies first, or copies last
        assert copied == expected_order, (seed, copied)
        mixed += any(copied) and not all(copied)
    assert mixed >= 5, f"only {mixed} mixed drafts: the test did not exercise the mix"
