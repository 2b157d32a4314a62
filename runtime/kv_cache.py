"""The KV cache manager: the per-slot KV buffers of one run, and the books of who owns which slot.

Per layer, one K and one V buffer `[num_slots, kv_heads, capacity, kv_row]`; a slot is one row
(kv_row: head_dim, or an int8 cache's head_dim values and their float32 scale's 4 bytes).
A token at position p of the request in slot s lives at [s, :, p, :]:

    slot 0  [S S S S p p g g . . . . ]   S restored saved system-prompt KV, p computed prompt,
    slot 1  [p p p g g g g g g . . . ]   g generated, . free (masked by the graph, overwritten later)
    slot 2  [                  free  ]   released by a finished request, taken by the next one
            0                    capacity-1

The most memory a run can take is known before anything runs: `bytes_for(model, num_slots,
limit)`, at most max_batch_size x max_kv_cache_capacity tokens from the manifest. The buffers
start smaller and `grow` (copying what they hold) as generation needs positions, up to `limit`.
Slots of a contiguous range are a contiguous `[n, kv_heads, capacity, kv_row]` view, which is
what the engine binds for a step. A model whose layers keep KV of different shapes, or not every
layer its own (model.kv_layers: Gemma 4), has a buffer pair per KV layer, each of its own shape; a
copy of a slot's KV (`read`, what saved prefixes hold) is then its layers' rows cut into pieces of one
width (`piece`), [pieces, 1, n, piece], where a model of one shape has [2 * layers, kv_heads, n, kv_row].

A model with recurrent layers (model.state_shapes: Mamba-2's) has a state buffer [num_slots, *shape] per
state too, after the KV in a view: a sequence's state so far, not one per position. Moving a slot or a
beam takes it whole; `read` and `write` (saved prefixes, context reuse: left aside for such models by the
scheduler) refuse, a copy by position being no such state.
"""
from __future__ import annotations

import math

import numpy as np

from trtllm.runtime.manifest import KV_STORAGE, ModelShape


def kv_storage(kv_dtype: str) -> np.dtype:
    """The numpy type that holds a KV cache of `kv_dtype` (float32, float16, bfloat16 (its bits) or
    int8: manifest.KV_STORAGE)."""
    return np.dtype(KV_STORAGE[kv_dtype])

def bytes_per_token(model: ModelShape) -> int:
    return 2 * sum(heads * row for heads, row in model.kv_shapes()) * kv_storage(model.kv_dtype).itemsize


def piece(model: ModelShape) -> int | None:
    """The width a saved copy cuts every KV row into where the layers' shapes differ (their rows'
    greatest common divisor), or None where they share one and a copy keeps it."""
    shapes = model.kv_shapes()
    return None if len(set(shapes)) == 1 else math.gcd(*(row for _, row in shapes))


def bytes_for(model: ModelShape, num_slots: int, capacity: int) -> int:
    return num_slots * (capacity * bytes_per_token(model) + state_bytes(model))


def state_bytes(model: ModelShape) -> int:
    """One slot's recurrent state (float32), 0 without recurrent layers."""
    return 4 * sum(math.prod(shape) for shape in model.state_shapes or ())


class KVCacheManager:
    def __init__(self, model: ModelShape, num_slots: int, capacity: int):
        self.model, self.num_slots, self.capacity = model, num_slots, capacity
        self.limit = capacity  # what `grow` may reach (the scheduler raises it) and `acquire` admits
        self.owners: list[object | None] = [None] * num_slots
        self.views: dict[tuple[int, int], tuple] = {}
        self.buffers = self.allocate(num_slots, capacity)
        # recurrent layers' state, one per slot whatever the capacity (model.state_shapes: Mamba-2's),
        # bound after the KV (the views' tail); float32, zeroed (the graph takes zeros where a row starts)
        self.states = [np.zeros((num_slots, *shape), np.float32) for shape in model.state_shapes or ()]

    def allocate(self, num_slots: int, capacity: int) -> list:
        """Per layer K and V storage [num_slots, kv_heads, capacity, kv_row] (host numpy here; device
        memory in the TensorRT backend)."""
        # Zeroed: unwritten slots are masked, but must not hold NaN (0 * NaN = NaN in attention).
        # One allocation for all layers: numpy backs an allocation this large with 2 MiB pages on
        # Linux, and attention streams the whole cache every step (at batch 8, as much as a fifth
        # of the weights' bytes).
        shapes = [(num_slots, heads, capacity, row) for heads, row in self.model.kv_shapes() for _ in "kv"]
        sizes = [math.prod(shape) for shape in shapes]
        whole = np.zeros(sum(sizes), kv_storage(self.model.kv_dtype))
        starts = np.cumsum([0, *sizes])
        return [whole[start:start + size].reshape(shape) for shape, size, start in zip(shapes, sizes, starts)]

    def grow(self, capacity: int) -> None:
        """Positions 0..capacity-1 per slot (at most `limit`), the KV so far copied over. A new
        buffer: the engine binds it at the next step (the views are new)."""
        capacity = min(capacity, self.limit)
        if capacity <= self.capacity:
            return
        old = self.buffers
        self.buffers = self.allocate(self.num_slots, capacity)
        for new, b in zip(self.buffers, old):
            new[:, :, : self.capacity] = b
        self.capacity, self.views = capacity, {}

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.buffers) + sum(b.nbytes for b in self.states)

    def acquire(self, owner: object, num_tokens: int) -> int | None:
        """The lowest free slot for `owner`, or None when every slot is taken or it cannot fit."""
        if num_tokens > self.limit:
            return None
        for slot, current in enumerate(self.owners):
            if current is None:
                self.owners[slot] = owner
                return slot
        return None

    def release(self, slot: int) -> None:
        assert self.owners[slot] is not None, f"slot {slot} is already free"
        self.owners[slot] = None

    def clear(self, start: int, stop: int) -> None:
        """Slots start..stop-1 zeroed, every position: a failed request's KV may be NaN (its model
        overflowed), and a graph whose attention reads the masked positions too (the legacy graph's
        standard-op attention) would pass that on to the next request in its slots."""
        for b in (*self.buffers, *self.states):
            b[start:stop] = 0

    def move(self, src: int, dst: int, length: int) -> None:
        """Slot `src`'s first `length` positions, and its owner, into the free slot `dst`."""
        assert self.owners[src] is not None and self.owners[dst] is None, f"cannot move slot {src} to {dst}"
        self.copy_slot(src, dst, length)
        self.owners[dst], self.owners[src] = self.owners[src], None

    def copy_slot(self, src: int, dst: int, length: int) -> None:
        """Slot src's first `length` positions into slot dst, every layer, with no array in between
        (through `read` and `write`: 4.4x the time, 44 MiB of the demo model's 1,000 positions twice)."""
        for b in self.buffers:
            b[dst, :, :length] = b[src, :, :length]
        for b in self.states:  # (a slot's state is its sequence's so far: a move takes it whole)
            b[dst] = b[src]

    def move_position(self, slot: int, src: int, dst: int) -> None:
        """Position src's K and V into position dst of the same slot, every layer: a verified token
        tree's accepted branch, computed at a slot of its own, joins its path."""
        for b in self.buffers:
            b[slot, :, dst] = b[slot, :, src]

    def copy_positions(self, dst: np.ndarray, src: np.ndarray, start: int, stop: int) -> None:
        """Slot dst[i]'s positions start..stop-1 from slot src[i]'s, every layer; every source is
        read before a destination is written (beam search: slots trade places)."""
        for b in self.buffers:
            b[dst, :, start:stop] = b[src, :, start:stop]  # (the right side is a copy: fancy indexing)
        for b in self.states:  # (each beam's state is the one it extends)
            b[dst] = b[src]

    def active(self) -> list[int]:
        return [s for s, o in enumerate(self.owners) if o is not None]

    def view(self, start: int, stop: int) -> tuple[np.ndarray, ...]:
        """Per-layer (K0, V0, K1, V1, ...) views of slots start..stop-1 (no copy); the same tuple
        for the same range, so a backend can tell at a glance that nothing needs binding again."""
        views = self.views.get((start, stop))
        if views is None:
            views = self.views[(start, stop)] = tuple(b[start:stop] for b in (*self.buffers, *self.states))
        return views

    def read(self, slot: int, length: int) -> np.ndarray:
        """A copy of positions 0..length-1 of a slot: [2 * num_layers, kv_heads, length, kv_row], or
        with layers of different shapes [pieces, 1, length, piece] (the module's docstring)."""
        self.by_position_only()
        return saved_form(self.model, [b[slot, :, :length] for b in self.buffers])

    def by_position_only(self) -> None:
        if self.states:
            raise RuntimeError("a model with recurrent layers keeps a state per sequence: a slot's KV by position "
                               "is not all it holds (docs/kv_cache.md)")

    def layout(self, length: int) -> tuple[tuple[int, ...], np.dtype]:
        """The (shape, dtype) that `read(slot, length)` gives: what a saved prefix must be to restore."""
        return saved_layout(self.model, length)

    def write(self, slot: int, kv: np.ndarray) -> None:
        """Restore `kv` (as returned by `read`) into positions 0..n-1 of a slot."""
        self.by_position_only()
        n = kv.shape[2]
        for b, layer_kv in zip(self.buffers, layer_rows(self.model, kv)):
            b[slot, :, :n] = layer_kv


def saved_layout(model: ModelShape, length: int) -> tuple[tuple[int, ...], np.dtype]:
    """The (shape, dtype) of a copy of `length` positions of one slot's KV (KVCacheManager.read)."""
    width, dtype = piece(model), kv_storage(model.kv_dtype)
    if width is None:
        heads, row = model.kv_shapes()[0]
        return (2 * model.num_kv_layers, heads, length, row), dtype
    return (2 * sum(heads * row // width for heads, row in model.kv_shapes()), 1, length, width), dtype


def saved_form(model: ModelShape, rows: list[np.ndarray]) -> np.ndarray:
    """Each KV buffer's [kv_heads, n, kv_row] of one slot (K0, V0, K1, ...) as one array (saved_layout)."""
    width = piece(model)
    if width is None:
        return np.stack(rows)
    n = rows[0].shape[1]  # [heads, n, row] -> [heads, row / width, n, width]: each row's pieces, position-major
    return np.concatenate([r.reshape(r.shape[0], n, -1, width).transpose(0, 2, 1, 3).reshape(-1, n, width)
                           for r in rows])[:, None]


def layer_rows(model: ModelShape, kv: np.ndarray) -> list[np.ndarray]:
    """saved_form's inverse: each KV buffer's [kv_heads, n, kv_row], in the buffers' order."""
    width = piece(model)
    if width is None:
        return list(kv)
    n, out, at = kv.shape[2], [], 0
    for heads, row in model.kv_shapes():
        count = heads * row // width
        for _ in "kv":
            part = kv[at:at + count, 0].reshape(heads, row // width, n, width)
            out.append(part.transpose(0, 2, 1, 3).reshape(heads, n, row))
            at += count
    return out


def for_engine(engine, num_slots: int, capacity: int) -> KVCacheManager:
    """A KV cache for the engine's model: the engine's own storage where it has one (make_kv_cache:
    TensorRT's device memory, at its plan's static capacity), else host arrays."""
    return getattr(engine, "make_kv_cache", KVCacheManager)(engine.manifest.model, num_slots, capacity)
