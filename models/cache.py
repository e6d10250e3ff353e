"""The decode cache of every family: records of a fixed number of slots at a fixed capacity, laid out
as the family's `CacheLayout` says, with immutable, donated transitions.

A `DecodeCache` has a fixed number of slots and a fixed capacity, so every decode step runs the same
compiled program whatever the batch's composition: a row's tokens do not depend on which other
requests share the batch (this is what lets the runtime promise bit-identical tokens).

The cache is an immutable pytree. Its transitions (`insert`, `step`, `truncate`, `evict`) are pure: each
returns a new cache, and `insert` and `step` donate the old cache's buffer, so the old cache must not be
used afterwards (`cache = cache.step(...)[1]`). Slot lengths live on the host as a read-only array: the
host reads them every step (capacity, which block just filled) and must not wait on the device.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from models.buckets import DEFAULT_BUCKETS
from models.checks import InputError
from models.layers import embed, head
from models.padding import padded_kv
from models.params import Params
from models.sharding import constrain, logical_sharding


@dataclasses.dataclass(frozen=True)
class CacheLayout:
    """How a decode cache orders its dims: the sequence layout [L, B, C, *record] (B slots, C positions)
    transposed by `order` (cache dim i is sequence dim order[i]); layers stay outermost and the record's
    own dims keep their order. `axes` are the logical axes of the cache's dims (`models.sharding`)."""

    name: str
    order: tuple[int, ...]
    axes: tuple[str | None, ...]

    @property
    def slot_axis(self) -> int:
        return self.order.index(1)

    @property
    def seq_axis(self) -> int:
        return self.order.index(2)

    def shape(self, cfg, slots: int, capacity: int) -> tuple[int, ...]:
        seq = (cfg.n_layers, slots, capacity, *cfg.kv_record_shape)
        return tuple(seq[i] for i in self.order)

    def token_index(self, layer: int, positions):
        """Index of one record per slot in a cache: layer `layer`, slot b at position positions[b]; what
        it selects is [B, *record]."""
        index = [slice(None)] * len(self.order)
        index[0], index[self.slot_axis], index[self.seq_axis] = layer, jnp.arange(positions.shape[0]), positions
        return tuple(index)

    @property
    def row_order(self) -> tuple[int, ...]:
        """The transpose that takes a cache without its slot dim back to [L, S, *record]."""
        rest = [a for a in self.order if a != 1]
        return tuple(rest.index(a) for a in (0, *range(2, len(self.order))))


def decode_step(params: Params, cfg, tokens, cache, lengths, layout: CacheLayout | None = None):
    """One batched decode step of cfg's family. tokens [B]; cache: the records in `layout` (default
    the family's `cache_layout(cfg)`, as `DecodeCache.create` picks); lengths [B] valid entries per row,
    the new token goes at position lengths[b]. Returns (logits [B, V] float32, cache').

    Each layer is the family's `decode_layer`, built from the pieces of its `forward_layer`. The jitted
    form `decode_step_jit` donates `cache`: the caller's array is invalid afterwards.
    """
    layout = layout or cfg.family.cache_layout(cfg)
    x = embed(params, tokens[:, None])
    cache = constrain(cache, layout.axes)
    for layer, lp in enumerate(params["layers"]):
        x, cache = cfg.family.decode_layer(x, lp, layer, cache, lengths, cfg, layout)
    return head(params, cfg, x)[:, 0], constrain(cache, layout.axes)


decode_step_jit = jax.jit(decode_step, static_argnums=(1, 5), donate_argnums=3)


@functools.partial(jax.jit, static_argnums=3, donate_argnums=0)
def _insert_jit(cache, kv, slot, layout: CacheLayout):
    """cache with kv [L, S, *record] written at (slot, 0); donates `cache`."""
    start = [0] * cache.ndim
    start[layout.slot_axis] = slot
    return constrain(jax.lax.dynamic_update_slice(cache, kv[:, None].transpose(layout.order), start), layout.axes)


def _frozen(lengths) -> np.ndarray:
    """A private, read-only int32 copy: nobody can change a cache's lengths behind its back."""
    out = np.array(lengths, np.int32)
    out.setflags(write=False)
    return out


@struct.dataclass
class DecodeCache:
    """Records of `slots` sequences in the decode layout, and how many entries of each are valid.

    `insert` takes and `row` gives the sequence layout [L, S, *record] (runs of Full Blocks). A slot of
    length 0 is free: it computes in `step` (fixed shapes), its output is meaningless and its length
    stays 0. Build one with `DecodeCache.create`.
    """

    kv: jax.Array  # the records on the device, in `layout`
    lengths: np.ndarray  # [B] int32 on the host (read-only): valid entries per slot; the next token's position
    cfg: object = struct.field(pytree_node=False)
    layout: CacheLayout = struct.field(pytree_node=False)

    @classmethod
    def create(cls, cfg, slots: int, capacity: int, sharding=None, layout: CacheLayout | None = None) -> "DecodeCache":
        """An empty cache (every slot free) of `capacity` tokens per slot in `layout` (default the family's
        `cache_layout(cfg)`), placed on `sharding` if given, else sharded by its logical axes over the
        active mesh (`jax.set_mesh`) if any.

        Raises InputError when `capacity` exceeds `cfg.max_seq_len` or `slots` < 1.
        """
        if capacity > cfg.max_seq_len:
            raise InputError(f"decode capacity {capacity} exceeds max_seq_len={cfg.max_seq_len} of {cfg.name!r}")
        if slots < 1 or capacity < 2:
            raise InputError(f"a decode cache needs slots >= 1 and capacity >= 2, got {slots} and {capacity}")
        layout = layout or cfg.family.cache_layout(cfg)
        shape = layout.shape(cfg, slots, capacity)
        mesh = jax.sharding.get_mesh()
        if sharding is None and not mesh.empty:
            sharding = logical_sharding(shape, layout.axes, mesh)
        return cls(jnp.zeros(shape, cfg.kv_np_dtype, device=sharding), _frozen(np.zeros(slots)), cfg, layout)

    @classmethod
    def filled(cls, cfg, slots: int, capacity: int, length: int) -> "DecodeCache":
        """A cache whose every slot holds `length` zero entries: for timing steps (their cost depends
        on the shapes, not on the values)."""
        cache = cls.create(cfg, slots, capacity)
        zeros = np.zeros((cfg.n_layers, length, *cfg.kv_record_shape), cfg.kv_np_dtype)
        for slot in range(slots):
            cache = cache.insert(slot, zeros)
        return cache

    @property
    def slots(self) -> int:
        return self.kv.shape[self.layout.slot_axis]

    @property
    def capacity(self) -> int:
        return self.kv.shape[self.layout.seq_axis]

    def insert(self, slot: int, kv, length: int | None = None) -> "DecodeCache":
        """A cache whose `slot` holds the first `length` (default all S) tokens of kv [L, S, *record].

        Donates this cache's buffer. S is padded to a bucket (powers of two) so inserts compile a
        handful of programs; the padding lies past the slot's length and is never attended to.
        Raises InputError for a misshaped kv, a bad slot, or a sequence that leaves no room to decode.
        """
        cfg = self.cfg
        if kv.ndim != 2 + len(cfg.kv_record_shape) or kv.shape[0] != cfg.n_layers \
                or tuple(kv.shape[2:]) != cfg.kv_record_shape:
            raise InputError(f"insert takes kv [L={cfg.n_layers}, S, *{cfg.kv_record_shape}], got {tuple(kv.shape)}")
        length = kv.shape[1] if length is None else int(length)
        if not 0 <= slot < self.slots or not 1 <= length <= kv.shape[1]:
            raise InputError(f"insert needs slot in [0, {self.slots}) and length in [1, {kv.shape[1]}], "
                             f"got slot {slot}, length {length}")
        if length >= self.capacity:
            raise InputError(f"sequence of {length} tokens does not fit decode capacity {self.capacity}")
        kv = padded_kv(kv, length, min(self.capacity, DEFAULT_BUCKETS.prefix(length)), self.kv.dtype)
        lengths = self.lengths.copy()
        lengths[slot] = length
        return self.replace(kv=_insert_jit(self.kv, kv, slot, self.layout), lengths=_frozen(lengths))

    def truncate(self, length: int, slot: int | None = None) -> "DecodeCache":
        """A cache whose `slot` (every slot if None) keeps only its first `length` entries: a rollback,
        lengths never grow this way. Shares this cache's buffer (no device work)."""
        lengths = self.lengths.copy()
        where = slice(None) if slot is None else slot
        lengths[where] = np.minimum(lengths[where], length)
        return self.replace(lengths=_frozen(lengths))

    def evict(self, slot: int) -> "DecodeCache":
        """A cache whose `slot` is free (length 0). Shares this cache's buffer (no device work)."""
        return self.truncate(0, slot)

    def row(self, slot: int, start: int, stop: int):
        """Records [L, stop-start, *record] of one slot's positions [start, stop)."""
        index = [slice(None)] * self.kv.ndim
        index[self.layout.slot_axis], index[self.layout.seq_axis] = slot, slice(start, stop)
        return self.kv[tuple(index)].transpose(self.layout.row_order)

    def step(self, params: Params, tokens) -> tuple[jax.Array, "DecodeCache"]:
        """Feed tokens [slots] at each slot's current length: (logits [slots, V] float32, new cache).

        Donates this cache's buffer. Every row computes (fixed shape); a free slot's logits are
        meaningless. Raises InputError when a slot is full.
        """
        if self.lengths.max() >= self.capacity:
            raise InputError(f"a decode slot reached capacity {self.capacity}")
        # Private copies: on CPU, JAX may alias a NumPy buffer instead of copying it, and the caller
        # may reuse `tokens` while the step still runs.
        logits, kv = decode_step_jit(params, self.cfg, jnp.array(tokens, jnp.int32), self.kv,
                                     jnp.array(self.lengths), self.layout)
        return logits, self.replace(kv=kv, lengths=_frozen(np.where(self.lengths > 0, self.lengths + 1, 0)))
