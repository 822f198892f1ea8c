"""The native segment attention kernel (kernels.segment_attention) behind FlatBatch: every sequence's decode and
verification rows in one call per layer. It must give each row the attention of its own sequence alone (within fp32
rounding of torch's), store the new keys/values where torch's path would, give a row the same bits whatever other rows
share the call, and fall back to torch with a notice where it cannot be built."""

from __future__ import annotations

import logging

import pytest
import torch
from transformers import DynamicCache

from leapdecode.kernels import configured, segment_attention
from leapdecode.kernels import native as build
from leapdecode.kv.slots import CacheSlot, FlatBatch, Segment, SequenceKV

HEADS, KV_HEADS = 6, 2


def reference(past_k, past_v, q, k, v, scaling):
    """One sequence's rows by the definition: softmax(q k^T * scaling, causal over past then new rows) v."""
    n = q.shape[1]
    keys = torch.cat([past_k, k], 1).double().repeat_interleave(HEADS // KV_HEADS, 0)
    values = torch.cat([past_v, v], 1).double().repeat_interleave(HEADS // KV_HEADS, 0)
    scores = (q.double() @ keys.transpose(1, 2)) * scaling
    length = keys.shape[1]
    mask = torch.arange(length)[None, :] <= torch.arange(length - n, length)[:, None]
    return (scores.masked_fill(~mask, float("-inf")).softmax(-1) @ values).float()


def batch(specs, d, seed=0, kind=SequenceKV, dtype=torch.float32):
    """A flat batch of sequences (past, new rows) with random past keys/values; query/key/value laid out as the fused
    decoder hands them over (rows outermost, heads inside)."""
    gen = torch.Generator().manual_seed(seed)
    rows = sum(n for _, n in specs)
    qkv = torch.randn(1, rows, (HEADS + 2 * KV_HEADS) * d, generator=gen).to(dtype)
    q, k, v = qkv.split([HEADS * d, KV_HEADS * d, KV_HEADS * d], dim=-1)
    q, k, v = (t.view(1, rows, -1, d).transpose(1, 2) for t in (q, k, v))
    pasts, segments, first = [], [], 0
    for past, n in specs:
        pk, pv = (torch.randn(KV_HEADS, past, d, generator=gen).to(dtype) for _ in range(2))
        slot = SequenceKV(1) if kind is SequenceKV else CacheSlot(DynamicCache())
        if past:
            slot.write(0, 0, pk, pv)
        pasts.append((pk, pv))
        segments.append(Segment(slot, first, n, past))
        first += n
    return q, k, v, pasts, segments


def check(out, q, k, v, pasts, segments, scaling):
    for (pk, pv), s in zip(pasts, segments):
        rows = slice(s.first_row, s.first_row + s.n)
        want = reference(pk, pv, q[0, :, rows], k[0, :, rows], v[0, :, rows], scaling)
        torch.testing.assert_close(out[0, :, rows], want, rtol=2e-5, atol=2e-6)
        (keys, values), *_ = s.kv.layers()
        assert keys.shape[2] == s.past + s.n  # the new rows are stored after the past, as torch's path stores them
        assert torch.equal(keys[0, :, s.past :], k[0, :, rows]) and torch.equal(values[0, :, s.past :], v[0, :, rows])
        assert torch.equal(keys[0, :, : s.past], pk) and torch.equal(values[0, :, : s.past], pv)


@pytest.fixture
def native():
    lib = segment_attention.library()
    if lib is None:
        pytest.skip(f"native kernel unavailable here: {segment_attention.why_not()}")
    return lib


@pytest.mark.parametrize("d", [16, 64, 128, 48])
def test_every_row_attends_its_own_sequence_alone(native, d, monkeypatch):
    """Sequences of many shapes in one call (a past that fills the buffer's spare rows, a long one, drafts up to the
    cap, prompts without a past) against the definition, beside a prompt chunk past the cap, which torch attends."""
    monkeypatch.setattr(segment_attention, "MAX_ROWS", 32)
    specs = [(0, 1), (7, 1), (0, 5), (63, 2), (300, 1), (45, segment_attention.MAX_ROWS), (20, 40), (129, 4)]
    q, k, v, pasts, segments = batch(specs, d)
    calls = []
    segment_attention_sdpa(monkeypatch, calls)
    out = FlatBatch(segments).attend(0, q, k, v, d**-0.5)
    check(out, q, k, v, pasts, segments, d**-0.5)
    assert calls == [40]  # the chunk past the cap


def segment_attention_sdpa(monkeypatch, calls):
    """Record the row counts of the calls FlatBatch makes to torch's SDPA."""
    from leapdecode.kv import slots

    original = slots.grouped_sdpa

    def recording(query, *args):
        calls.append(query.shape[2])
        return original(query, *args)

    monkeypatch.setattr(slots, "grouped_sdpa", recording)
    return recording


@pytest.fixture(params=[1, 2])
def threads(request):
    """The kernel's threads: with one, a row alone is shared out like the rows beside others (a task per key/value
    head, its rows and heads in groups of pairs); with two, a lone row goes a query head a task (one pair), so the
    one-pair and the grouped routes meet."""
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


@pytest.mark.parametrize("d", [64, 128, 32, 48])
def test_a_row_gets_the_same_bits_alone_as_beside_other_rows(native, d, threads):
    """A drafted row verified in a call of several rows, beside other sequences, gets exactly the bits of the one-row
    step that would have computed it: the kernel's sums for a row run over its own keys only, in a fixed order. With
    this many sequences the call shares its work out by key/value head (a task per group of query heads, whose rows
    and heads go through the keys in groups of pairs), the one-row calls by query head. Head sizes: the two the kernel
    unrolls (groups of several pairs) and two it does not."""
    past, n = 77, 6
    q, k, v, pasts, segments = batch([(30, 1), (past, n), (5, 3)] + [(9 + i, 1) for i in range(6)], d, seed=1)
    together = FlatBatch(segments).attend(0, q, k, v, 0.125)
    pk, pv = pasts[1]
    first = segments[1].first_row
    for i in range(n):
        slot = SequenceKV(1)
        slot.write(0, 0, torch.cat([pk, k[0, :, first : first + i]], 1), torch.cat([pv, v[0, :, first : first + i]], 1))
        row = slice(first + i, first + i + 1)
        alone = FlatBatch([Segment(slot, 0, 1, past + i)]).attend(0, q[:, :, row], k[:, :, row], v[:, :, row], 0.125)
        assert torch.equal(alone[0, :, 0], together[0, :, first + i])


@pytest.mark.parametrize("d", [64, 128, 32])
def test_a_lone_sequences_rows_get_the_same_bits_however_they_are_cut(native, d, threads):
    """A lone sequence's rows (a prompt chunk, a verification) are shared out in runs of rows: each row gets the bits
    of the one-row step that would compute it, for a run count that does not divide the rows."""
    past, n = 40, 11
    q, k, v, pasts, segments = batch([(past, n)], d, seed=2)
    together = FlatBatch(segments).attend(0, q, k, v, 0.125)
    pk, pv = pasts[0]
    for i in range(n):
        slot = SequenceKV(1)
        slot.write(0, 0, torch.cat([pk, k[0, :, :i]], 1), torch.cat([pv, v[0, :, :i]], 1))
        row = slice(i, i + 1)
        alone = FlatBatch([Segment(slot, 0, 1, past + i)]).attend(0, q[:, :, row], k[:, :, row], v[:, :, row], 0.125)
        assert torch.equal(alone[0, :, 0], together[0, :, i])


def test_keys_kept_by_an_hf_cache_are_stored_by_it_and_attended_by_the_kernel(native, monkeypatch):
    """A KV press's slot (an HF cache) stores its own rows; the kernel attends them all the same, so a request with a
    press at budget 1 computes what it computes without one."""
    specs = [(12, 1), (3, 3), (40, 2)]
    q, k, v, pasts, segments = batch(specs, 32, seed=2, kind=CacheSlot)
    calls = []
    segment_attention_sdpa(monkeypatch, calls)
    out = FlatBatch(segments).attend(0, q, k, v, 0.2)
    check(out, q, k, v, pasts, segments, 0.2)
    assert calls == []
    q2, k2, v2, _, plain = batch(specs, 32, seed=2)
    assert torch.equal(FlatBatch(plain).attend(0, q2, k2, v2, 0.2), out)


def test_bf16_rows_rows_alone_and_odd_head_sizes_stay_in_torch(native, monkeypatch):
    calls = []
    segment_attention_sdpa(monkeypatch, calls)
    q, k, v, _, segments = batch([(10, 1), (3, 2)], 24)  # 24: not a multiple of the kernel's 16 lanes
    FlatBatch(segments).attend(0, q, k, v, 0.2)
    assert calls == [1, 2]
    calls.clear()
    q, k, v, _, segments = batch([(10, 1), (3, 2)], 32, dtype=torch.bfloat16)
    FlatBatch(segments).attend(0, q, k, v, 0.2)
    assert calls == [1, 2]
    calls.clear()
    q, k, v, _, segments = batch([(10, 1), (3, 2)], 32)
    layout = FlatBatch(segments)
    layout.rows_alone = True
    layout.attend(0, q, k, v, 0.2)
    assert calls == [1, 1, 1]  # the 2-row segment one call per row (q4 models)


def test_torch_attends_where_the_kernel_cannot_be_built(monkeypatch, caplog):
    from leapdecode.kernels.ops import forget_checks

    monkeypatch.setattr(build, "compiler", lambda: None)
    segment_attention.forget()
    forget_checks()  # notices are once per process: this one may have been given before in this process
    try:
        with caplog.at_level(logging.WARNING, logger="leapdecode"):
            assert segment_attention.library() is None
            q, k, v, pasts, segments = batch([(9, 1), (0, 2)], 64)
            check(FlatBatch(segments).attend(0, q, k, v, 0.3), q, k, v, pasts, segments, 0.3)
        assert "no C compiler" in segment_attention.why_not()
        assert "torch SDPA" in segment_attention.describe()
        notices = [r.getMessage() for r in caplog.records if "segment attention" in r.getMessage()]
        assert len(notices) == 1 and "\n" not in notices[0]
    finally:
        build.forget_all()


def test_the_setting_keeps_attention_in_torch():
    with configured(attention="sdpa"):
        assert segment_attention.library() is None
        assert segment_attention.describe().startswith("torch SDPA")
    with pytest.raises(ValueError, match="attention must be one of"):
        with configured(attention="flash"):
            pass


def test_the_library_is_built_for_the_instruction_set_torch_dispatches_to(monkeypatch, tmp_path):
    """An ATEN_CPU_CAPABILITY cap builds for that ISA (and is cached apart); the library is built once and reused."""
    import platform

    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("ISA flags are chosen on x86 only")
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    assert build.march_flags() == ["-mavx2", "-mfma", "-mf16c"]
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "DEFAULT")
    assert build.march_flags() == []
    compiler = build.compiler()
    if compiler is None:
        pytest.skip("no C compiler")
    with configured(cache_dir=str(tmp_path)):
        path = build.library_path(segment_attention._library.source, compiler, [])
        assert path != build.library_path(segment_attention._library.source, compiler, ["-mavx2", "-mfma", "-mf16c"])
        built = []
        real = build.build
        monkeypatch.setattr(build, "build", lambda *a: built.append(a) or real(*a))
        segment_attention.forget()
        try:
            assert segment_attention.library() is not None and len(built) == 1 and path.exists()
            segment_attention.forget()
            assert segment_attention.library() is not None and len(built) == 1  # read from the cache
        finally:
            segment_attention.forget()


def test_a_compiler_without_openmp_builds_the_kernel_single_threaded(monkeypatch, tmp_path):
    import subprocess

    compiler = build.compiler()
    if compiler is None:
        pytest.skip("no C compiler")
    commands, run = [], subprocess.run

    def no_openmp(command, **kwargs):
        commands.append(command)
        if "-fopenmp" in command:
            return subprocess.CompletedProcess(command, 1, "", "error: unsupported option '-fopenmp'")
        return run(command, **kwargs)

    monkeypatch.setattr(subprocess, "run", no_openmp)
    with configured(cache_dir=str(tmp_path)):
        segment_attention.forget()
        try:
            assert segment_attention.library() is not None
            assert ["-fopenmp" in c for c in commands if c[0] == compiler and "-shared" in c] == [True, False]
            q, k, v, pasts, segments = batch([(9, 1), (30, 4)], 64)
            check(FlatBatch(segments).attend(0, q, k, v, 0.3), q, k, v, pasts, segments, 0.3)
        finally:
            segment_attention.forget()


class OtherLayoutSlot:
    """A slot whose owner keeps values inside a larger buffer (heads further apart than the keys') and, with
    `rows_first`, keys as [length, kv_heads, d] (rows not d apart): not as the kernel reads them (rows d apart, heads
    the same distance apart in keys and values), so FlatBatch must hand it packed copies."""

    def __init__(self, keys, values, rows_first):
        self.rows_first = rows_first
        self.k = keys.transpose(0, 1).clone()  # [length, kv_heads, d]
        self.v = torch.zeros(keys.shape[0], keys.shape[1] + 50, keys.shape[2])
        self.v[:, : values.shape[1]] = values
        self.length = keys.shape[1]

    def write(self, layer, start, keys, values):
        self.k = torch.cat([self.k[:start], keys.transpose(0, 1)])
        self.v[:, start : start + values.shape[1]] = values
        self.length = start + keys.shape[1]
        keys = self.k.transpose(0, 1)
        return keys if self.rows_first else keys.contiguous(), self.v[:, : self.length]

    def layers(self):
        from leapdecode.kv.slots import LayerKV

        return [LayerKV(self.k.transpose(0, 1)[None], self.v[None, :, : self.length])]


@pytest.mark.parametrize("rows_first", [True, False])
def test_keys_kept_in_other_layouts_are_handed_over_packed(native, rows_first):
    q, k, v, pasts, segments = batch([(14, 1), (6, 3)], 32, seed=3)
    for s, (pk, pv) in zip(segments, pasts):
        s.kv = OtherLayoutSlot(pk, pv, rows_first)
    check(FlatBatch(segments).attend(0, q, k, v, 0.25), q, k, v, pasts, segments, 0.25)


def test_queries_keys_and_values_of_any_strides_are_read_right(native):
    """The kernel reads a contiguous last dimension: other layouts are copied first (none of leapdecode's forwards
    hands one over today; another architecture's attention could)."""
    q, k, v, pasts, segments = batch([(14, 1), (6, 3)], 32, seed=4)
    odd = [t.transpose(-1, -2).contiguous().transpose(-1, -2) for t in (q, k, v)]  # same values, last dim strided
    assert all(t.stride(-1) != 1 for t in odd)
    check(FlatBatch(segments).attend(0, *odd, 0.25), q, k, v, pasts, segments, 0.25)
