"""Per-sequence KV slots and the flat-batch attention over them.

Every sequence owns its keys and values, per layer, in buffers that grow in place (a step writes only its new rows).
A step's rows from all sequences go through the model as one flat batch; `FlatBatch.attend` (called from
leapdecode's registered attention, see leapdecode.attention) writes each sequence's new keys/values into its slot at
that sequence's own offset and attends its query rows to that slot only, causally. Rollback of rejected drafts is
`truncate`: the sequence's length shrinks, nothing else moves. So a sequence's rows see exactly its own past, whatever
else shares the step: the per-sequence losslessness argument of the single-request loop carries over unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from ..attention import grouped_sdpa
from ..kernels import segment_attention

SPARE = 64  # rows of room added beyond the need at each reallocation (at least; half the length for long sequences)


def room_for(need: int, spare: int = SPARE) -> int:
    """The capacity a growing KV buffer is reallocated to when `need` rows no longer fit: room to spare, so that a
    step writes only its new rows and reallocation is rare (shared by kv.buffered's HF cache layers)."""
    return need + max(spare, need // 2)


class LayerKV(NamedTuple):
    """One layer's valid keys and values, [1, kv_heads, length, head_dim] each (HF's cache layout)."""

    keys: torch.Tensor
    values: torch.Tensor


class SequenceKV:
    """One sequence's keys/values: per layer [kv_heads, capacity, head_dim] buffers, the first `length` rows valid.
    Writing rows makes them valid; `truncate` forgets rows (rollback of rejected drafts)."""

    def __init__(self, layers: int):
        self.keys: list[torch.Tensor | None] = [None] * layers
        self.values: list[torch.Tensor | None] = [None] * layers
        self.length = 0
        self._addresses: list[int] | None = None  # per layer: key buffer, value buffer, head distance

    def write(self, layer: int, start: int, keys: torch.Tensor, values: torch.Tensor):
        """Store rows start.. of this layer ([kv_heads, n, head_dim]); return views of rows 0 .. start + n."""
        need = start + keys.shape[1]
        self.reserve(layer, start, need, keys)
        self.keys[layer][:, start:need] = keys
        self.values[layer][:, start:need] = values
        return self.keys[layer][:, :need], self.values[layer][:, :need]

    def reserve(self, layer: int, start: int, need: int, like: torch.Tensor) -> None:
        """Make rows 0 .. need of this layer valid-to-be (buffers shaped and typed like `like` [kv_heads, n,
        head_dim], grown if too small, rows before `start` kept): the caller writes rows start .. need."""
        buffer = self.keys[layer]
        if buffer is None or need > buffer.shape[1]:
            capacity = room_for(need)
            self.keys[layer] = _grown(buffer, like, start, capacity)
            self.values[layer] = _grown(self.values[layer], like, start, capacity)
            self._addresses = None
        self.length = need

    def reserve_all(self, start: int, need: int, like: torch.Tensor) -> list[int]:
        """`reserve` rows start .. need in every layer (all written already up to start; buffers typed like `like`);
        return per layer the addresses of the key and value buffers and the distance between their heads in floats,
        for a native step that writes the rows itself."""
        if need > self.capacity:
            for layer in range(len(self.keys)):
                self.reserve(layer, start, need, like)
        self.length = need
        if self._addresses is None:
            self._addresses = [
                a for k, v in zip(self.keys, self.values) for a in (k.data_ptr(), v.data_ptr(), k.stride(0))
            ]
        return self._addresses

    def load(self, keys: list[torch.Tensor], values: list[torch.Tensor]) -> None:
        """Start from a cached prefix: per layer [kv_heads, n, head_dim]."""
        for layer, (k, v) in enumerate(zip(keys, values)):
            self.write(layer, 0, k, v)
        self.length = keys[0].shape[1]

    def rows(self, start: int, end: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Copies of rows start..end of every layer (for the prefix cache)."""
        return ([k[:, start:end].clone() for k in self.keys], [v[:, start:end].clone() for v in self.values])

    def truncate(self, length: int) -> None:
        self.length = min(self.length, length)

    @property
    def capacity(self) -> int:
        """Rows its buffers hold (valid or not): what it costs in memory."""
        return 0 if self.keys[0] is None else self.keys[0].shape[1]

    def capacity_for(self, need: int) -> int:
        """Its capacity once `need` rows are written (the growth policy of `write`)."""
        return self.capacity if need <= self.capacity else room_for(need)

    def layers(self) -> list[LayerKV]:
        return [LayerKV(k[None, :, : self.length], v[None, :, : self.length]) for k, v in zip(self.keys, self.values)]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.keys + self.values if t is not None)


class CacheSlot:
    """An HF cache (a KV press's, possibly compressed or quantized) behind SequenceKV's interface, so the one forward
    decodes over it the same way. Rows are only ever appended at its end; rollback crops decoded rows."""

    def __init__(self, cache):
        self.cache = cache

    @property
    def length(self) -> int:
        return self.cache.get_seq_length()

    def write(self, layer: int, start: int, keys: torch.Tensor, values: torch.Tensor):
        keys, values = self.cache.update(keys[None], values[None], layer)
        return keys[0], values[0]

    def truncate(self, length: int) -> None:
        if length < self.length:
            self.cache.crop(length - self.length)  # a negative crop removes from the end (what every layer type takes)

    def layers(self) -> list[LayerKV]:
        return [LayerKV(layer.keys, layer.values) for layer in self.cache.layers]


def _rows_packed(keys: torch.Tensor, values: torch.Tensor) -> bool:
    """Whether [kv_heads, length, d] keys and values lie as the native kernel reads them: rows d apart, heads the
    same distance apart in both."""
    d = keys.shape[-1]
    return keys.stride()[1:] == (d, 1) and values.stride()[1:] == (d, 1) and keys.stride(0) == values.stride(0)


def _grown(old: torch.Tensor | None, new: torch.Tensor, keep: int, capacity: int) -> torch.Tensor:
    buffer = new.new_empty((new.shape[0], capacity, new.shape[2]))
    if old is not None:
        buffer[:, :keep] = old[:, :keep]
    return buffer


@dataclass
class Segment:
    """A sequence's rows in the flat batch: rows first_row .. first_row + n, at positions past .. past + n."""

    kv: SequenceKV
    first_row: int
    n: int
    past: int


ROWS_ALONE_MAX = 32  # with rows_alone, steps of more new rows than this (prompt chunks) still attend in one call


class FlatBatch:
    """The layout of one step, handed to leapdecode's attention: which rows belong to which sequence.

    `rows_alone`: each new row of a sequence that has a past attends in a call of its own, as it would in a one-row
    decode step, so a verified draft row gets the very bits of that step. ModelForward sets it for models whose other
    operations already give a row the same bits whatever the row count (q4 weights: models.weight_only); there,
    rounding in bf16 turns the last-bit differences of a many-row attention call into different tokens often enough
    to matter."""

    rows_alone = False  # ModelForward sets it per model
    native_attention = True  # ModelForward sets it: leapdecode's kernels (packed_weights) or HF's operations

    def __init__(self, segments: list[Segment]):
        self.segments = segments
        self._native = None  # how the rows attend, decided at the first layer

    def attend(self, layer: int, query, key, value, scaling) -> torch.Tensor:
        """query [1, H, R, d], key/value [1, KVH, R, d] for the step's R rows -> [1, H, R, d]."""
        if self._native is None:
            self._native = self._native_plan(query)
        if not self._native:
            outs = [self._attend_one(layer, s, query, key, value, scaling) for s in self.segments]
            return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)
        lib, meta, stored, owned, rest = self._native
        out = query.new_empty(1, query.shape[2], query.shape[1], query.shape[3])  # [1, R, H, d]: what o_proj reads
        query, key, value = (t if t.stride(-1) == 1 else t.contiguous() for t in (query, key, value))
        for at, s in stored:  # the kernel writes their new rows into their buffers
            s.kv.reserve(layer, s.past, s.past + s.n, key[0, :, :1])
            keys = s.kv.keys[layer]
            meta[at], meta[at + 1], meta[at + 2] = keys.data_ptr(), s.kv.values[layer].data_ptr(), keys.stride(0)
        held = []  # what the kernel reads must stay alive until it returns
        for at, s in owned:  # their owner (an HF cache) stores them
            rows = slice(s.first_row, s.first_row + s.n)
            keys, values = s.kv.write(layer, s.past, key[0, :, rows], value[0, :, rows])
            if not _rows_packed(keys, values):
                keys, values = keys.contiguous(), values.contiguous()
            held += (keys, values)
            meta[at], meta[at + 1], meta[at + 2] = keys.data_ptr(), values.data_ptr(), keys.stride(0)
        if stored or owned:
            segment_attention.attend_segments(lib, len(stored) + len(owned), meta, query, key, value, scaling, out)
        for s in rest:
            out[0, s.first_row : s.first_row + s.n] = self._attend_one(layer, s, query, key, value, scaling)[
                0
            ].transpose(0, 1)
        return out.transpose(1, 2)

    def native_step_buffers(self, like: torch.Tensor) -> tuple[list[int], list[int]] | None:
        """For a native decoder step (kernels.decoder_step), where every sequence's rows would attend through the
        native kernel into its own SequenceKV: (per sequence its first row, rows and past; per sequence and layer its
        buffers, SequenceKV.reserve_all with `like` [kv_heads, 0, head_dim]), the rows reserved in every layer. None,
        with nothing changed, otherwise."""
        if not self.native_attention or self.rows_alone:
            return None
        if not all(type(s.kv) is SequenceKV and s.n <= segment_attention.MAX_ROWS for s in self.segments):
            return None
        rows, buffers = [], []
        for s in self.segments:
            rows += (s.first_row, s.n, s.past)
            buffers += s.kv.reserve_all(s.past, s.past + s.n, like)
        return rows, buffers

    def _native_plan(self, query):
        """How this step's rows attend: False (all in torch) or (the native kernel, its per-segment fields, the
        segments whose new rows it stores, those whose owner stores them, the rest, in torch). The kernel takes the
        fp32 rows of sequences with at most segment_attention.MAX_ROWS new rows (decode, verification and prompt
        chunks), of the head sizes it handles, unless rows attend alone; longer runs take torch's causal SDPA."""
        if not self.native_attention or self.rows_alone or query.dtype != torch.float32:
            return False
        if not segment_attention.takes_head_dim(query.shape[3]):
            return False
        few, rest = [], []
        for s in self.segments:
            (few if s.n <= segment_attention.MAX_ROWS else rest).append(s)
        lib = segment_attention.library() if few else None
        if lib is None:
            return False
        meta = segment_attention.fields([(s.first_row, s.n, s.past, type(s.kv) is SequenceKV) for s in few])
        at = [segment_attention.FIELDS * i for i in range(len(few))]
        stored = [(a, s) for a, s in zip(at, few) if type(s.kv) is SequenceKV]
        owned = [(a, s) for a, s in zip(at, few) if type(s.kv) is not SequenceKV]
        return lib, meta, stored, owned, rest

    def _attend_one(self, layer: int, s: Segment, query, key, value, scaling) -> torch.Tensor:
        """One segment's rows in torch: write its keys/values, SDPA over its slot -> [1, H, n, d]."""
        rows = slice(s.first_row, s.first_row + s.n)
        keys, values = s.kv.write(layer, s.past, key[0, :, rows], value[0, :, rows])
        if self.rows_alone and s.past and 1 < s.n <= ROWS_ALONE_MAX:
            outs = []
            for i in range(s.n):
                end = s.past + i + 1
                row = query[:, :, s.first_row + i : s.first_row + i + 1]
                outs.append(grouped_sdpa(row, keys[None, :, :end], values[None, :, :end], None, scaling))
            return torch.cat(outs, dim=2)
        return grouped_sdpa(query[:, :, rows], keys[None], values[None], None, scaling)
