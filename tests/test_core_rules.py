"""Unit proofs of the rules the losslessness guarantee rests on, fast enough to run for every mutant of a mutation run
(scripts: see CONTRIBUTING, "Mutation testing"): greedy and speculative acceptance (verify.py), the sampling
distribution and per-position randomness (sampling.py), the step rule of one request (sequence.py), a sequence's KV
slot and the flat-batch attention (kv/slots.py) and the batch draft planner (controller.plan_draft_lengths)."""

from __future__ import annotations

import pytest
import torch

from leapdecode.attention import grouped_sdpa
from leapdecode.controller import DraftDemand, DraftLengthController, StepCost, plan_draft_lengths
from leapdecode.drafters.base import EMPTY, Draft, Drafter
from leapdecode.errors import LeapDecodeError
from leapdecode.kv.slots import ROWS_ALONE_MAX, SPARE, CacheSlot, FlatBatch, Segment, SequenceKV, room_for
from leapdecode.sampling import SamplingConfig, generator_at, probabilities
from leapdecode.sequence import SequenceState, _match_vocab, _suppress
from leapdecode.verify import _sample, argmax_rows, greedy_accept, speculative_accept

# ------------------------------------------------------------------ greedy_accept


def one_hot_logits(tokens: list[int], vocab: int = 12) -> torch.Tensor:
    logits = torch.zeros(len(tokens), vocab)
    logits[torch.arange(len(tokens)), torch.tensor(tokens)] = 5.0
    return logits


@pytest.mark.parametrize(
    "draft, target, expected",
    [
        ([], [3], [3]),
        ([1, 2, 3], [1, 2, 3, 4], [1, 2, 3, 4]),  # all accepted, plus the target's own next token
        ([1, 5, 3], [1, 2, 3, 4], [1, 2]),  # the first mismatch ends the step, with the target's token there
        ([6, 2, 3], [1, 2, 3, 4], [1]),  # rows after a mismatch count for nothing, even where they match
        ([1, 2, 7], [1, 2, 3, 4], [1, 2, 3]),
    ],
)
def test_greedy_accept_is_the_longest_matching_prefix_plus_the_targets_token(draft, target, expected):
    assert greedy_accept(torch.tensor(draft, dtype=torch.long), one_hot_logits(target)) == expected


def test_greedy_accept_breaks_exact_ties_at_the_first_index_as_argmax_does():
    logits = torch.zeros(2, 6)
    logits[:, [2, 4]] = 1.0  # an exact tie between tokens 2 and 4 in both rows
    assert greedy_accept(torch.tensor([4]), logits) == [2]
    assert greedy_accept(torch.tensor([2]), logits) == [2, 2]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_argmax_rows_is_torch_s_argmax_ties_and_strided_rows_included(dtype):
    """verify.argmax_rows (NumPy's scan for fp32 on the CPU, torch's otherwise): the index torch's argmax gives, the
    first on an exact tie, on a 49k-token vocabulary and on rows taken out of a larger tensor."""
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 49152, generator=gen).to(dtype)
    logits[1, [7, 30000]] = 50.0  # a tie: the first index
    logits[3, -1] = 60.0
    for rows in (logits, logits[1:4], logits[:, 1:]):
        assert argmax_rows(rows) == rows.argmax(-1).tolist()
    assert argmax_rows(logits)[1] == 7
    assert argmax_rows(logits.clone().requires_grad_()) == logits.argmax(-1).tolist()  # outside inference mode too


# ------------------------------------------------------------------ speculative_accept, _sample


def generators(seed: int, n: int) -> list[torch.Generator]:
    return [generator_at(seed, i) for i in range(n)]


def test_one_hot_drafts_emit_exactly_the_tokens_plain_sampling_draws_at_each_position():
    """q = one-hot: y_i ~ p_i from row i's own generator; accepted while y_i == draft[i]; the first differing y_i
    ends the step; after k accepted, the bonus is drawn from row k's generator."""
    torch.manual_seed(0)
    p = torch.softmax(torch.randn(5, 7) * 2, -1)
    for seed in range(60):
        plain = [_sample(p[i], g) for i, g in enumerate(generators(seed, 5))]
        for k in range(5):
            draft = torch.tensor(plain[:k])
            draft_probs = None
            assert speculative_accept(draft, draft_probs, p, generators(seed, k + 1)) == plain[: k + 1]
            if k:
                wrong = draft.clone()
                wrong[k - 1] = (wrong[k - 1] + 1) % 7
                assert speculative_accept(wrong, None, p, generators(seed, k + 1)) == plain[:k]


def test_a_draft_with_q_equal_to_p_is_always_accepted_and_the_bonus_comes_from_the_last_row():
    torch.manual_seed(1)
    p = torch.softmax(torch.randn(4, 6), -1)
    for seed in range(40):
        draft = torch.multinomial(p[0], 3, replacement=True)
        out = speculative_accept(draft, p[:3].clone(), p, generators(seed, 4))
        assert out[:3] == draft.tolist() and len(out) == 4
        assert out[3] == _sample(p[3], generators(seed, 4)[3])


def test_a_token_the_target_cannot_produce_is_never_accepted_and_never_resampled():
    p = torch.tensor([[0.0, 0.5, 0.5, 0.0], [0.25, 0.25, 0.25, 0.25]])
    q = torch.tensor([[0.7, 0.1, 0.1, 0.1]])
    for seed in range(100):
        out = speculative_accept(torch.tensor([0]), q, p, generators(seed, 2))
        assert len(out) == 1 and out[0] in (1, 2)


def test_a_rejection_resamples_from_the_residual_max_p_minus_q():
    """p = (.5, .5, 0), q = (.9, .1, 0) on draft token 0: accepted with probability .5/.9; the residual is (0, .4, 0),
    so a rejection always yields token 1, never token 0 (p alone would give 0 half the time)."""
    p = torch.tensor([[0.5, 0.5, 0.0], [1 / 3, 1 / 3, 1 / 3]])
    q = torch.tensor([[0.9, 0.1, 0.0]])
    accepted = 0
    for seed in range(400):
        out = speculative_accept(torch.tensor([0]), q, p, generators(seed, 2))
        if len(out) == 2:
            accepted += 1
            assert out[0] == 0
        else:
            assert out == [1]
    assert 400 * 0.45 < accepted < 400 * 0.66  # 5/9 of 400 = 222


def test_each_row_draws_only_from_its_own_generator():
    """Row i's acceptance uses generators[i]: replacing the generator of a row it never reaches changes nothing;
    replacing the one of the row that decides changes the law."""
    p = torch.tensor([[0.5, 0.5], [0.5, 0.5], [0.5, 0.5]])
    q = torch.tensor([[0.9, 0.1], [0.9, 0.1]])
    for seed in range(30):
        gens = generators(seed, 3)
        out = speculative_accept(torch.tensor([0, 0]), q, p, gens)
        if len(out) == 1:  # decided at row 0: rows 1 and 2 were never drawn from
            assert gens[1].get_state().equal(generator_at(seed, 1).get_state())
            assert gens[2].get_state().equal(generator_at(seed, 2).get_state())


def test_acceptance_and_resampling_draw_only_from_the_rows_generators():
    """Seeded output must not depend on torch's global random state: the acceptance draw and the resample of row i
    come from generators[i] alone (each row's generator is advanced when that row decides)."""
    torch.manual_seed(2)
    p = torch.softmax(torch.randn(4, 6), -1)
    q = torch.softmax(torch.randn(3, 6), -1)
    for seed in range(40):
        draft = torch.multinomial(q[0], 3, replacement=True)
        outs = []
        for global_seed in (0, 1):
            torch.manual_seed(global_seed)
            gens = generators(seed, 4)
            outs.append(speculative_accept(draft, q, p, gens))
            decided = len(outs[-1]) - 1
            for i, g in enumerate(gens):
                fresh = generator_at(seed, i).get_state()
                assert g.get_state().equal(fresh) == (i > decided), (seed, i, decided)
        assert outs[0] == outs[1], seed


def test_residual_of_zero_mass_falls_back_to_p():
    """Where q >= p everywhere (p == q up to rounding), max(p - q, 0) is all zeros: a rejection then draws from p
    (here either token), not from the zeros (which would always give token 0)."""
    p = torch.tensor([[0.5, 0.5], [0.5, 0.5]])
    q = torch.tensor([[0.5, 0.6]])  # q(1) above p(1): rejected with probability 1/6
    rejected = [
        out[0]
        for seed in range(300)
        if len(out := speculative_accept(torch.tensor([1]), q, p, generators(seed, 2))) == 1
    ]
    assert len(rejected) > 20 and set(rejected) == {0, 1}


def test_sample_draws_in_proportion_to_the_weights_and_never_a_zero_weight():
    weights = torch.tensor([0.0, 1.0, 3.0, 0.0])
    counts = torch.zeros(4)
    gen = torch.Generator().manual_seed(0)
    for _ in range(4000):
        counts[_sample(weights, gen)] += 1
    assert counts[0] == counts[3] == 0
    assert 0.70 < counts[2] / 4000 < 0.80
    assert _sample(torch.tensor([0.0, 0.0, 2.0]), gen) == 2


# ------------------------------------------------------------------ sampling


def test_sampling_config_checks_and_seeds():
    for bad in (dict(temperature=-0.1), dict(top_p=0.0), dict(top_p=1.5), dict(top_k=-1)):
        with pytest.raises(LeapDecodeError):
            SamplingConfig(**bad)
    SamplingConfig(temperature=0.0, top_p=1.0, top_k=0)  # the edges are allowed
    assert SamplingConfig().greedy and not SamplingConfig(temperature=0.5).greedy
    assert SamplingConfig(temperature=1.0, seed=7).request_seed() == 7
    assert SamplingConfig(temperature=1.0, seed=0).request_seed() == 0
    assert len({SamplingConfig(temperature=1.0).request_seed() for _ in range(5)}) == 5


def test_generator_at_is_keyed_by_seed_position_and_stream():
    def draw(*key):
        return torch.rand(4, generator=generator_at(*key)).tolist()

    assert draw(3, 5) == draw(3, 5) == draw(3, 5, 0)
    assert len({tuple(draw(*key)) for key in ((3, 5), (3, 6), (4, 5), (3, 5, 1))}) == 4


def test_probabilities_apply_temperature_top_k_and_top_p():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    assert torch.allclose(probabilities(logits, SamplingConfig(temperature=1.0)), logits.softmax(-1))
    assert torch.allclose(probabilities(logits, SamplingConfig(temperature=0.5)), (logits / 0.5).softmax(-1))
    top2 = probabilities(logits, SamplingConfig(temperature=1.0, top_k=2))
    assert torch.allclose(top2, torch.tensor([[2.0, 1.0]]).softmax(-1).new_tensor([[*top2[0, :2].tolist(), 0, 0]]))
    assert top2[0, 2] == top2[0, 3] == 0 and torch.allclose(top2[0, :2], logits[0, :2].softmax(-1))
    assert torch.equal(probabilities(logits, SamplingConfig(temperature=1.0, top_k=4)) > 0, torch.ones(1, 4) > 0)
    nucleus = probabilities(logits, SamplingConfig(temperature=1.0, top_p=0.7))  # .64 alone is short of .7
    assert (nucleus > 0).tolist() == [[True, True, False, False]]
    assert probabilities(logits, SamplingConfig(temperature=1.0, top_p=0.6)).tolist()[0][0] == 1.0
    assert probabilities(logits, SamplingConfig(temperature=1.0)).dtype == torch.float32


def test_min_p_drops_tokens_below_its_share_of_the_top_one_as_hf_does():
    from transformers.generation.logits_process import MinPLogitsWarper

    logits = torch.randn(32, 20, generator=torch.Generator().manual_seed(3)) * 2
    for min_p in (0.05, 0.3, 1.0):
        ours = probabilities(logits, SamplingConfig(temperature=0.8, min_p=min_p))
        theirs = MinPLogitsWarper(min_p)(None, logits / 0.8).softmax(-1)
        assert torch.equal(ours > 0, theirs > 0) and bool((ours > 0).sum(-1).lt(20).any())
        torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-7)
    for bad in (-0.1, 1.5):
        with pytest.raises(LeapDecodeError):
            SamplingConfig(temperature=1.0, min_p=bad)
    SamplingConfig(temperature=1.0, min_p=1.0)


# ------------------------------------------------------------------ SequenceState


class ScriptedDrafter(Drafter):
    """Proposes the tokens given, records what it was told."""

    name = "scripted"

    def __init__(self, tokens=(), probs=None):
        self.tokens, self.probs, self.observed, self.started = list(tokens), probs, [], None

    def start(self, prompt_ids, sampling):
        self.started = (list(prompt_ids), sampling)

    def propose(self, context, k):
        return Draft(self.tokens[:k], None if self.probs is None else self.probs[:k]) if self.tokens else EMPTY

    def observe(self, context, n_new):
        self.observed.append((list(context), n_new))


def state(drafter=None, max_new=10, context=100, eos=(), prompt=(1, 2, 3), sampling=None):
    return SequenceState(
        list(prompt),
        drafter or ScriptedDrafter(),
        sampling=sampling or SamplingConfig(),
        controller=DraftLengthController(k_init=4, adaptive=False),
        max_new_tokens=max_new,
        eos_ids=set(eos),
        context_length=context,
    )


def test_room_leaves_space_for_the_steps_own_token():
    assert state(max_new=10, context=100).room == 9
    assert state(max_new=1).room == 0
    assert state(max_new=10, context=5).room == 1  # 3 prompt tokens: one draft plus its bonus fill 5
    assert state(max_new=10, context=4).room == 0
    assert state(max_new=10, context=3).room == 0  # never negative


def test_a_greedy_step_takes_the_accepted_prefix_and_reports_the_rollback():
    drafter = ScriptedDrafter([7, 8, 9])
    seq = state(drafter)
    assert drafter.started[0] == [1, 2, 3]
    new, rollback = seq.accept(one_hot_logits([6]))  # the prefill's logits: no draft
    assert (new, rollback) == ([6], 0) and seq.out == [6] and seq.context == [1, 2, 3, 6]
    assert seq.propose(2) == [6, 7, 8]  # the last token plus a draft of at most k
    new, rollback = seq.accept(one_hot_logits([7, 5, 1]))
    assert (new, rollback) == ([7, 5], 1) and seq.out == [6, 7, 5] and seq.context == [1, 2, 3, 6, 7, 5]
    s = seq.stats
    assert (s.forward_passes, s.drafted_tokens, s.accepted_draft_tokens, s.accepted_per_step) == (2, 2, 1, [1, 2])
    assert s.new_tokens == 3 and s.stop_reason == "" and not seq.finished
    assert drafter.observed == [([1, 2, 3, 6], 1), ([1, 2, 3, 6, 7, 5], 2)]
    assert seq.draft is EMPTY  # a step's draft is used once


def test_propose_is_capped_by_room_and_keeps_probs_aligned():
    probs = torch.eye(12)[[7, 0, 1]]
    seq = state(ScriptedDrafter([7, 0, 1], probs=probs), max_new=3)
    seq.accept(one_hot_logits([6]))
    assert seq.room == 1 and seq.propose(4) == [6, 7]
    assert seq.draft.tokens == [7] and torch.equal(seq.draft.probs, probs[:1])
    seq.accept(one_hot_logits([7, 2]))
    assert seq.out == [6, 7, 2] and seq.stats.stop_reason == "length" and seq.finished
    assert seq.propose(4) == [2] and seq.draft.tokens == []  # no room: nothing drafted


def test_eos_ends_the_output_inside_a_step_and_is_kept():
    drafter = ScriptedDrafter([4, 9, 5])
    seq = state(drafter, eos={9})
    seq.accept(one_hot_logits([3]))
    seq.propose(3)
    new, rollback = seq.accept(one_hot_logits([4, 9, 5, 1]))
    assert new == [4, 9] and seq.out == [3, 4, 9] and seq.stats.stop_reason == "eos"
    assert rollback == 0 and seq.stats.accepted_draft_tokens == 2
    assert len(drafter.observed) == 1  # a finished request's drafter learns nothing more


def test_max_new_tokens_and_the_context_stop_a_request_where_plain_decoding_does():
    seq = state(ScriptedDrafter([4, 4, 4, 4]), max_new=3)
    seq.accept(one_hot_logits([4]))
    seq.propose(4)
    new, _ = seq.accept(one_hot_logits([4, 4, 4]))
    assert seq.out == [4, 4, 4] and new == [4, 4] and seq.stats.stop_reason == "length"
    seq = state(ScriptedDrafter([4, 4, 4, 4]), context=6)
    seq.accept(one_hot_logits([4]))
    seq.propose(4)
    seq.accept(one_hot_logits([4, 4, 4]))
    assert len(seq.context) == 6 and seq.stats.stop_reason == "context"


def test_the_first_step_sets_time_to_first_token_once_and_finish_closes_the_record():
    seq = state(max_new=5)
    seq.accept(one_hot_logits([1]))
    first = seq.stats.time_to_first_token
    assert first > 0
    seq.propose(0)
    seq.accept(one_hot_logits([2]))
    assert seq.stats.time_to_first_token == first
    stats = seq.finish("abort")
    assert stats.stop_reason == "abort" and stats.new_tokens == 2 and stats.total_time > 0
    assert seq.finish().stop_reason == "abort"  # no reason: the one set stays


def test_a_step_tells_the_controller_what_it_measured_and_keeps_the_times(monkeypatch):
    """A fake clock (each reading 1 s later) makes every recorded time exact."""
    from types import SimpleNamespace

    clock = iter(range(1, 100))
    monkeypatch.setattr("leapdecode.sequence.time", SimpleNamespace(perf_counter=lambda: float(next(clock))))
    updates = []

    class Recording(DraftLengthController):
        def update(self, *args):
            updates.append(args)

    seq = SequenceState(
        [1, 2, 3],
        ScriptedDrafter([7, 8]),
        sampling=SamplingConfig(),
        controller=Recording(adaptive=False),
        max_new_tokens=10,
        eos_ids=set(),
        context_length=100,
    )  # the clock reads 1
    assert seq.stats.prompt_tokens == 3
    seq.accept(one_hot_logits([6]))  # reads 2
    assert seq.stats.time_to_first_token == 1.0
    seq.propose(2)  # reads 3 and 4
    seq.accept(one_hot_logits([7, 5, 1]), forward_tokens=3, forward_seconds=0.5)
    seq.propose(2)  # reads 5 and 6
    seq.accept(one_hot_logits([7, 8, 2]))
    assert updates == [(0, 0, 0, 0.0, 0.0), (2, 1, 3, 0.5, 1.0), (2, 2, 0, 0.0, 1.0)]
    assert seq.stats.time_to_first_token == 1.0 and seq.stats.draft_time == 2.0
    assert seq.finish().total_time == 6.0  # reads 7


def test_stop_tokens_are_masked_only_where_min_tokens_asks_and_only_inside_the_vocabulary():
    seq = state(eos={6})  # min_tokens defaults to 0: EOS may come first
    seq.accept(one_hot_logits([6]))
    assert seq.out == [6] and seq.stats.stop_reason == "eos"
    logits = torch.zeros(3, 12)
    masked = _suppress(logits, {2, 12, 40}, 2)  # ids the head does not have are left alone
    assert masked[:2, 2].eq(float("-inf")).all() and masked[2].eq(0).all() and masked[:, :2].eq(0).all()


def test_a_sampled_step_decides_output_position_j_with_generator_j():
    """With a one-hot draft, the tokens are plain sampling's: row i of a step that starts at output position n uses
    generator_at(seed, n + i)."""
    logits = torch.randn(6, 8)
    cfg = SamplingConfig(temperature=1.0, seed=5)
    p = probabilities(logits, cfg)
    plain = [_sample(p[j], generator_at(5, j)) for j in range(6)]
    seq = state(ScriptedDrafter(plain[1:4]), sampling=cfg, max_new=20)
    assert seq.sampling.seed == 5
    assert seq.accept(logits[:1])[0] == plain[:1]
    seq.propose(3)
    assert seq.accept(logits[1:5])[0] == plain[1:5]
    unseeded = state(sampling=SamplingConfig(temperature=1.0))
    assert unseeded.sampling.seed is not None  # one seed per request, drawn at its start


def test_draft_probabilities_of_another_vocabulary_size_are_aligned_to_the_target():
    logits = torch.tensor([[0.0, 5.0, 0.0, 0.0], [0.0, 0.0, 0.0, 5.0]])
    cfg = SamplingConfig(temperature=1.0, seed=1)
    for width in (3, 4, 6):
        q = torch.zeros(1, width)
        q[0, 1] = 1.0
        seq = state(ScriptedDrafter([1], probs=q), sampling=cfg)
        seq.accept(logits[:1])
        seq.propose(1)
        new, _ = seq.accept(logits)
        assert len(new) in (1, 2) and all(0 <= t < 4 for t in new)
    q = torch.rand(2, 5)  # two draft rows: the vocabulary is the last dimension, never the rows
    assert _match_vocab(q, 5) is q
    assert torch.equal(_match_vocab(q, 3), q[:, :3])  # a wider draft head: the target's tokens only
    wider = _match_vocab(q, 8)  # a narrower one: the target's extra tokens get probability 0, after the draft's own
    assert wider.shape == (2, 8) and torch.equal(wider[:, :5], q) and not wider[:, 5:].any()


# ------------------------------------------------------------------ SequenceKV and FlatBatch


def test_a_kv_slot_grows_in_place_keeps_its_rows_and_truncate_only_shortens():
    kv = SequenceKV(2)
    a = torch.randn(2, 5, 4)
    assert kv.capacity == 0 and kv.capacity_for(5) == 5 + SPARE
    keys, values = kv.write(0, 0, a, -a)
    assert torch.equal(keys, a) and torch.equal(values, -a) and kv.capacity == 5 + SPARE
    assert kv.capacity_for(5 + SPARE) == 5 + SPARE  # a write that fills the buffer exactly does not grow it
    keys, values = kv.write(0, 5, a[:, :1].expand(2, SPARE, 4), -a[:, :1].expand(2, SPARE, 4))
    assert kv.capacity == 5 + SPARE and torch.equal(values[:, :5], -a)
    b = torch.randn(2, 200, 4)  # past the spare capacity: the buffer grows, the first rows stay
    assert kv.capacity_for(205) == room_for(205) == 205 + 102  # half the length beyond SPARE
    keys, values = kv.write(0, 5, b, -b)
    assert keys.shape[1] == 205 and torch.equal(keys[:, :5], a) and torch.equal(keys[:, 5:], b)
    assert torch.equal(values[:, :5], -a) and torch.equal(values[:, 5:], -b) and kv.capacity == 205 + 102
    c = torch.randn(2, 3, 4)
    keys, _ = kv.write(0, 2, c, c)  # a rollback to 2 then new rows: written over, the view ends at them
    assert keys.shape[1] == 5 and torch.equal(keys[:, :2], a[:, :2]) and torch.equal(keys[:, 2:], c)
    kv.length = 10
    kv.truncate(12)
    assert kv.length == 10
    kv.truncate(4)
    assert kv.length == 4
    assert kv.nbytes == sum(t.numel() * 4 for t in kv.keys + kv.values if t is not None)


def test_a_kv_slot_loads_a_cached_prefix_and_copies_rows_out():
    kv = SequenceKV(2)
    keys = [torch.randn(2, 6, 4) for _ in range(2)]
    values = [torch.randn(2, 6, 4) for _ in range(2)]
    kv.load(keys, values)
    assert kv.length == 6
    k, v = kv.rows(2, 5)
    assert all(torch.equal(x, y[:, 2:5]) for x, y in zip(k, keys)) and all(
        torch.equal(x, y[:, 2:5]) for x, y in zip(v, values)
    )
    k[0].zero_()
    assert not torch.equal(kv.keys[0][:, 2:5], k[0])  # copies, not views


def test_kv_slots_list_their_valid_rows_per_layer_and_an_hf_cache_slot_crops_on_rollback():
    """SequenceKV.layers and CacheSlot (an HF cache behind the slot interface, for KV presses) give each layer's
    valid rows in HF's layout; rolling back forgets the last rows of every layer."""
    from transformers import DynamicCache

    rows = [torch.randn(2, 7, 4) for _ in range(2)]
    kv, hf = SequenceKV(2), CacheSlot(DynamicCache())
    for slot in (kv, hf):
        for layer, r in enumerate(rows):
            keys, values = slot.write(layer, 0, r[:, :5], -r[:, :5])
            assert torch.equal(keys, r[:, :5]) and torch.equal(values, -r[:, :5])
        for layer, r in enumerate(rows):
            keys, values = slot.write(layer, 5, r[:, 5:], -r[:, 5:])
            assert torch.equal(keys, r) and torch.equal(values, -r)
        assert slot.length == 7
        slot.truncate(9)
        slot.truncate(7)  # nothing to forget
        assert slot.length == 7
        slot.truncate(3)
        assert slot.length == 3
        listed = slot.layers()
        assert len(listed) == 2
        for (keys, values), r in zip(listed, rows):
            assert torch.equal(keys, r[None, :, :3]) and torch.equal(values, -r[None, :, :3])


def test_flat_batch_attention_keeps_sequences_apart_and_causal():
    """Two sequences in one flat batch: each row's output is that of its sequence alone, causally over its own past."""
    torch.manual_seed(0)
    heads, kv_heads, d = 4, 2, 8
    past = [torch.randn(kv_heads, 3, d), torch.randn(kv_heads, 5, d)]
    n = [2, 3]
    q = torch.randn(1, heads, 5, d)
    k = torch.randn(1, kv_heads, 5, d)
    v = torch.randn(1, kv_heads, 5, d)
    slots = []
    for p in past:
        slot = SequenceKV(1)
        slot.load([p], [p * 2])
        slots.append(slot)
    segments = [Segment(slots[0], 0, 2, 3), Segment(slots[1], 2, 3, 5)]
    out = FlatBatch(segments).attend(0, q, k, v, 0.5)
    first = 0
    for p, rows in zip(past, n):
        sl = slice(first, first + rows)
        keys = torch.cat([p, k[0, :, sl]], 1).repeat_interleave(heads // kv_heads, 0)
        values = torch.cat([p * 2, v[0, :, sl]], 1).repeat_interleave(heads // kv_heads, 0)
        scores = (q[0, :, sl] @ keys.transpose(1, 2)) * 0.5
        length = keys.shape[1]
        mask = torch.arange(length)[None, :] <= torch.arange(length - rows, length)[:, None]
        want = scores.masked_fill(~mask, float("-inf")).softmax(-1) @ values
        torch.testing.assert_close(out[0, :, sl], want, rtol=1e-5, atol=1e-5)
        first += rows


@pytest.mark.parametrize("n", [2, ROWS_ALONE_MAX, ROWS_ALONE_MAX + 1])
def test_rows_alone_attend_one_call_per_row_up_to_the_cap(n, monkeypatch):
    """With rows_alone (q4 models), each new row of a sequence with a past attends in a call of its own over exactly
    its past, at the layer's scaling, as a one-row decode step would; longer steps (prompt chunks) and sequences
    without a past attend in one call. The calls are recorded: which rows differ in their last bits between the two
    ways depends on the data and the CPU, the calls do not."""
    calls = []

    def recording(query, key, value, mask, scaling):
        calls.append((query.shape[2], key.shape[2], scaling))
        return grouped_sdpa(query, key, value, mask, scaling)

    monkeypatch.setattr("leapdecode.kv.slots.grouped_sdpa", recording)
    torch.manual_seed(0)
    heads, kv_heads, d, past, scaling = 4, 2, 16, 40, 0.3
    q = torch.randn(1, heads, n, d, dtype=torch.bfloat16)
    k, v = (torch.randn(1, kv_heads, n, d, dtype=torch.bfloat16) for _ in range(2))
    p = torch.randn(kv_heads, past, d, dtype=torch.bfloat16)
    slot = SequenceKV(1)
    slot.load([p], [-p])
    layout = FlatBatch([Segment(slot, 0, n, past)])
    layout.rows_alone = True
    out = layout.attend(0, q, k, v, scaling)
    alone = n <= ROWS_ALONE_MAX
    assert calls == ([(1, past + i + 1, scaling) for i in range(n)] if alone else [(n, past + n, scaling)])
    keys, values = torch.cat([p, k[0]], 1)[None], torch.cat([-p, v[0]], 1)[None]
    rows = [
        grouped_sdpa(q[:, :, i : i + 1], keys[:, :, : past + i + 1], values[:, :, : past + i + 1], None, scaling)
        for i in range(n)
    ]
    assert torch.equal(out, torch.cat(rows, dim=2) if alone else grouped_sdpa(q, keys, values, None, scaling))
    calls.clear()
    fresh = FlatBatch([Segment(SequenceKV(1), 0, n, 0)])
    fresh.rows_alone = True
    assert torch.equal(fresh.attend(0, q, k, v, scaling), grouped_sdpa(q, k, v, None, scaling))
    assert calls == [(n, n, scaling)]


# ------------------------------------------------------------------ the batch planner


def flat_then_linear(flat_rows: int, per_row: float = 0.05) -> StepCost:
    costs = StepCost()
    for rows in (1, 2, 4, 8, 16, 32, 64):
        costs.record(rows, per_row * max(1, rows / flat_rows))
    return costs


def test_planner_fills_free_rows_by_gain_and_respects_caps_and_the_row_budget():
    free = flat_then_linear(64)
    demands = [DraftDemand(0.9, 0.0, 3), DraftDemand(0.5, 0.0, 5)]
    assert plan_draft_lengths(demands, free, base_rows=2, base_tokens=2.0) == [3, 5]  # free rows: every cap
    assert plan_draft_lengths(demands, free, base_rows=2, base_tokens=2.0, row_budget=4) == [2, 0]  # .9, .81 first
    assert plan_draft_lengths(demands, free, base_rows=2, base_tokens=2.0, row_budget=2) == [0, 0]
    assert plan_draft_lengths([DraftDemand(0.9, 0.0, 0)], free, 1, 1.0) == [0]


def test_planner_stops_where_a_row_costs_more_than_it_brings():
    dear = flat_then_linear(1)  # every row costs as much as the first
    assert plan_draft_lengths([DraftDemand(0.9, 0.0, 8)], dear, 1, 1.0) == [0]
    some = flat_then_linear(4)  # three free rows, then each row as dear as a step: worth it only at high acceptance
    assert plan_draft_lengths([DraftDemand(0.95, 0.0, 8)], some, 1, 1.0) == [3]
    slow_drafter = [DraftDemand(0.9, 10.0, 8)]  # drafting time counts against the gain
    assert plan_draft_lengths(slow_drafter, flat_then_linear(64), 1, 1.0) == [0]


def test_planner_keeps_k_min_for_every_drafting_sequence():
    free = flat_then_linear(64)
    demands = [DraftDemand(0.9, 0.0, 4), DraftDemand(0.2, 0.0, 4)]
    plan = plan_draft_lengths(demands, free, base_rows=2, base_tokens=2.0, k_min=3, row_budget=7)
    assert all(k == 0 or k >= 3 for k in plan) and sum(plan) <= 5


def test_the_engine_plans_rows_at_most_twice_as_far_as_it_has_measured():
    """Step costs beyond the largest measured row count are guessed flat (optimistic), so the scheduler lets a step
    grow to at most twice that count (at least one draft row past its decodes): cost is then learnt step by step."""
    from types import SimpleNamespace

    from leapdecode.engine.scheduler import Scheduler, SchedulerConfig
    from leapdecode.params import DraftConfig

    def running(n):
        demand = DraftDemand(acceptance=0.95, draft_seconds=0.0, cap=16)
        return [
            SimpleNamespace(
                seq=SimpleNamespace(
                    room=64,
                    controller=SimpleNamespace(demand=lambda room: demand),
                    drafter=SimpleNamespace(estimates_acceptance=False, drafts=True),
                )
            )
            for _ in range(n)
        ]

    for decoding, measured, budget, rows in ((2, 4, 256, 8), (2, 4, 6, 6), (4, 1, 256, 5)):
        scheduler = Scheduler(SchedulerConfig(), DraftConfig(), lambda: None, {}, layers=1, kv_tokens=10_000)
        scheduler.gate.choose = lambda n: 1
        for r in range(1, measured + 1):
            scheduler.costs.record(r, 0.01)  # flat: every row is free as far as measured
        drafts = scheduler._draft_lengths(running(decoding), budget)
        assert decoding + sum(drafts) == rows, (decoding, measured, budget, drafts)
