"""The decode cache of the DeepSeek family: `models.DecodeCache` over per-token records.

Same transitions and guarantees as the dense `DecodeCache` (fixed slots and capacity, immutable,
`insert` / `step` donate the old buffer, `truncate` / `evict` inherited); only the layout differs:
`kv [L, slots, capacity, *record]`, which is also the sequence layout (`insert` takes and `row` gives
`[L, S, *record]`), so nothing is transposed on the way in or out.
`models.DecodeCache.create` returns one of these for a `DeepSeekConfig`.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from models import deepseek
from models.buckets import DEFAULT_BUCKETS
from models.decode import DecodeCache, padded_kv
from models.deepseek_config import DeepSeekConfig
from models.params import Params
from models.prefill import InputError
from models.sharding import constrain, logical_sharding

CACHE_AXES = ("layers", "cache_batch", "cache_seq", None)


def _frozen(lengths) -> np.ndarray:
    out = np.array(lengths, np.int32)
    out.setflags(write=False)
    return out


@functools.partial(jax.jit, donate_argnums=0)
def _insert_jit(cache, kv, slot):
    """cache [L, B, C, *rec] with kv [L, S, *rec] written at (slot, 0); donates `cache`."""
    start = (0, slot, 0) + (0,) * (cache.ndim - 3)
    return constrain(jax.lax.dynamic_update_slice(cache, kv[:, None], start), CACHE_AXES)


@struct.dataclass
class DeepSeekDecodeCache(DecodeCache):
    """Records [L, slots, capacity, *record] of `slots` sequences and their lengths (host, read-only)."""

    @classmethod
    def create(cls, cfg: DeepSeekConfig, slots: int, capacity: int, sharding=None) -> "DeepSeekDecodeCache":
        """An empty cache; raises InputError like `DecodeCache.create`."""
        if capacity > cfg.max_seq_len:
            raise InputError(f"decode capacity {capacity} exceeds max_seq_len={cfg.max_seq_len} of {cfg.name!r}")
        if slots < 1 or capacity < 2:
            raise InputError(f"a decode cache needs slots >= 1 and capacity >= 2, got {slots} and {capacity}")
        shape = (cfg.n_layers, slots, capacity, *cfg.kv_record_shape)
        mesh = jax.sharding.get_mesh()
        if sharding is None and not mesh.empty:
            sharding = logical_sharding(shape, CACHE_AXES, mesh)
        kv = jnp.zeros(shape, deepseek.kv_np_dtype(cfg), device=sharding)
        return cls(kv, _frozen(np.zeros(slots)), cfg)

    @classmethod
    def filled(cls, cfg: DeepSeekConfig, slots: int, capacity: int, length: int) -> "DeepSeekDecodeCache":
        cache = cls.create(cfg, slots, capacity)
        zeros = np.zeros((cfg.n_layers, length, *cfg.kv_record_shape), deepseek.kv_np_dtype(cfg))
        for slot in range(slots):
            cache = cache.insert(slot, zeros)
        return cache

    @property
    def slots(self) -> int:
        return self.kv.shape[1]

    @property
    def capacity(self) -> int:
        return self.kv.shape[2]

    def insert(self, slot: int, kv, length: int | None = None) -> "DeepSeekDecodeCache":
        """A cache whose `slot` holds the first `length` (default all S) records of kv [L, S, *record].
        Donates this cache's buffer; raises InputError like `DecodeCache.insert`."""
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
        return self.replace(kv=_insert_jit(self.kv, kv, slot), lengths=_frozen(lengths))

    def row(self, slot: int, start: int, stop: int):
        """Records [L, stop-start, *record] of one slot's positions [start, stop)."""
        return self.kv[:, slot, start:stop]

    def step(self, params: Params, tokens) -> tuple[jax.Array, "DeepSeekDecodeCache"]:
        """Feed tokens [slots]: (logits [slots, V] float32, new cache); donates this cache's buffer."""
        if self.lengths.max() >= self.capacity:
            raise InputError(f"a decode slot reached capacity {self.capacity}")
        logits, kv = deepseek.decode_step_jit(params, self.cfg, jnp.array(tokens, jnp.int32), self.kv,
                                              jnp.array(self.lengths))
        return logits, self.replace(kv=kv, lengths=_frozen(np.where(self.lengths > 0, self.lengths + 1, 0)))
