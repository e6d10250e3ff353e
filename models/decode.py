"""Batched greedy decoding over a fixed-shape KV cache, and a one-call `generate`.

A `DecodeCache` has a fixed number of slots and a fixed capacity, so every decode step runs the
same compiled program whatever the batch's composition: a row's tokens do not depend on which
other requests share the batch (this is what lets the runtime promise bit-identical tokens).

The cache is an immutable pytree. Its transitions (`insert`, `step`, `truncate`, `evict`) are pure: each returns
a new cache, and `insert` and `step` donate the old cache's KV buffer, so the old cache must not be
used afterwards (`cache = cache.step(...)[1]`). Slot lengths live on the host as a read-only array:
the host reads them every step (capacity, which block just filled) and must not wait on the device.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from models.buckets import DEFAULT_BUCKETS
from models.config import ModelConfig
from models.model import DECODE_CACHE_AXES, DECODE_CACHE_AXES_SEQ, decode_seq_major, decode_step_jit, greedy
from models.params import Params
from models.prefill import InputError, check_tokens, host_padded, prefill
from models.sharding import constrain, logical_sharding


@functools.partial(jax.jit, static_argnums=3, donate_argnums=0)
def _insert_jit(cache, kv, slot, seq_major: bool):
    """cache [L, 2, B, K, C, H] (or [L, 2, B, C, K, H] when `seq_major`) with kv [L, S, 2, K, H] written
    at (slot, 0); donates `cache`."""
    kv = kv.transpose((0, 2, 1, 3, 4) if seq_major else (0, 2, 3, 1, 4))[:, :, None]  # [L, 2, 1, S, K, H] / K, S
    axes = DECODE_CACHE_AXES_SEQ if seq_major else DECODE_CACHE_AXES
    return constrain(jax.lax.dynamic_update_slice(cache, kv, (0, 0, slot, 0, 0, 0)), axes)


def padded_kv(kv, length: int, padded: int, dtype) -> jax.Array:
    """kv [L, S, ...]'s first `length` positions as a new array of `dtype` zero-padded to `padded`
    positions: a copy, since JAX may alias a NumPy buffer that the caller reuses (a DE buffer). Host
    KV is padded on the host, which compiles nothing; an eager pad would compile a program for
    every new length (~0.2 s each on CPU for `small`: every agent turn has one). That copy is the
    only one: `jax.device_put` aliases it on the CPU."""
    if isinstance(kv, np.ndarray):
        return jax.device_put(host_padded(kv[:, :length], 1, padded, dtype))
    kv = jnp.array(kv[:, :length], dtype)
    return jnp.pad(kv, [(0, 0), (0, padded - length)] + [(0, 0)] * (kv.ndim - 2))


def _frozen(lengths) -> np.ndarray:
    """A private, read-only int32 copy: nobody can change a cache's lengths behind its back."""
    out = np.array(lengths, np.int32)
    out.setflags(write=False)
    return out


@struct.dataclass
class DecodeCache:
    """KV of `slots` sequences in the decode layout, and how many entries of each are valid.

    `insert` takes and `row` gives the sequence layout [L, S, 2, K, H] (runs of Full Blocks). A slot
    of length 0 is free: it computes in `step` (fixed shapes), its output is meaningless and its
    length stays 0. Build one with `DecodeCache.create`.
    """

    kv: jax.Array  # [L, 2, B, K, C, H] on the device (seq_major: [L, 2, B, C, K, H]): each layer's K and V contiguous
    lengths: np.ndarray  # [B] int32 on the host (read-only): valid entries per slot; the next token's position
    cfg: ModelConfig = struct.field(pytree_node=False)
    seq_major: bool = struct.field(pytree_node=False, default=False)  # the layout decode's attention reads in place

    @classmethod
    def create(cls, cfg: ModelConfig, slots: int, capacity: int, sharding=None,
               seq_major: bool | None = None) -> "DecodeCache":
        """An empty cache (every slot free) of `capacity` tokens per slot, placed on `sharding` if
        given, else sharded by its logical axes over the active mesh (`jax.set_mesh`) if any; head-major
        unless `seq_major` (default `models.model.decode_seq_major(cfg)`: when decode runs cuDNN's attention).

        Raises InputError when `capacity` exceeds `cfg.max_seq_len` or `slots` < 1.
        """
        if capacity > cfg.max_seq_len:
            raise InputError(f"decode capacity {capacity} exceeds max_seq_len={cfg.max_seq_len} of {cfg.name!r}")
        if slots < 1 or capacity < 2:
            raise InputError(f"a decode cache needs slots >= 1 and capacity >= 2, got {slots} and {capacity}")
        seq_major = decode_seq_major(cfg) if seq_major is None else seq_major
        inner = (capacity, cfg.n_kv_heads) if seq_major else (cfg.n_kv_heads, capacity)
        shape = (cfg.n_layers, 2, slots, *inner, cfg.head_dim)
        mesh = jax.sharding.get_mesh()
        if sharding is None and not mesh.empty:
            sharding = logical_sharding(shape, DECODE_CACHE_AXES_SEQ if seq_major else DECODE_CACHE_AXES, mesh)
        return cls(jnp.zeros(shape, cfg.jnp_dtype, device=sharding), _frozen(np.zeros(slots)), cfg, seq_major)

    @classmethod
    def filled(cls, cfg: ModelConfig, slots: int, capacity: int, length: int) -> "DecodeCache":
        """A cache whose every slot holds `length` zero entries: for timing steps (their cost depends
        on the shapes, not on the KV's values)."""
        cache = cls.create(cfg, slots, capacity)
        zeros = np.zeros((cfg.n_layers, length, 2, cfg.n_kv_heads, cfg.head_dim), cfg.jnp_dtype)
        for slot in range(slots):
            cache = cache.insert(slot, zeros)
        return cache

    @property
    def slots(self) -> int:
        return self.kv.shape[2]

    @property
    def capacity(self) -> int:
        return self.kv.shape[3 if self.seq_major else 4]

    def insert(self, slot: int, kv, length: int | None = None) -> "DecodeCache":
        """A cache whose `slot` holds the first `length` (default all S) tokens of kv [L, S, 2, K, H].

        Donates this cache's KV buffer. S is padded to a bucket (powers of two) so inserts compile a
        handful of programs; the padding lies past the slot's length and is never attended to.
        Raises InputError for a misshaped kv, a bad slot, or a sequence that leaves no room to decode.
        """
        cfg = self.cfg
        if kv.ndim != 5 or kv.shape[0] != cfg.n_layers or tuple(kv.shape[2:]) != (2, cfg.n_kv_heads, cfg.head_dim):
            raise InputError(f"insert takes kv [L={cfg.n_layers}, S, 2, K={cfg.n_kv_heads}, H={cfg.head_dim}], "
                             f"got {tuple(kv.shape)}")
        length = kv.shape[1] if length is None else int(length)
        if not 0 <= slot < self.slots or not 1 <= length <= kv.shape[1]:
            raise InputError(f"insert needs slot in [0, {self.slots}) and length in [1, {kv.shape[1]}], "
                             f"got slot {slot}, length {length}")
        if length >= self.capacity:
            raise InputError(f"sequence of {length} tokens does not fit decode capacity {self.capacity}")
        kv = padded_kv(kv, length, min(self.capacity, DEFAULT_BUCKETS.prefix(length)), self.kv.dtype)
        lengths = self.lengths.copy()
        lengths[slot] = length
        return self.replace(kv=_insert_jit(self.kv, kv, slot, self.seq_major), lengths=_frozen(lengths))

    def truncate(self, length: int, slot: int | None = None) -> "DecodeCache":
        """A cache whose `slot` (every slot if None) keeps only its first `length` entries: a rollback,
        lengths never grow this way. Shares this cache's KV buffer (no device work)."""
        lengths = self.lengths.copy()
        where = slice(None) if slot is None else slot
        lengths[where] = np.minimum(lengths[where], length)
        return self.replace(lengths=_frozen(lengths))

    def evict(self, slot: int) -> "DecodeCache":
        """A cache whose `slot` is free (length 0). Shares this cache's KV buffer (no device work)."""
        return self.truncate(0, slot)

    def row(self, slot: int, start: int, stop: int):
        """KV [L, stop-start, 2, K, H] of one slot's positions [start, stop)."""
        if self.seq_major:
            return self.kv[:, :, slot, start:stop].transpose(0, 2, 1, 3, 4)
        return self.kv[:, :, slot, :, start:stop].transpose(0, 3, 1, 2, 4)

    def step(self, params: Params, tokens) -> tuple[jax.Array, "DecodeCache"]:
        """Feed tokens [slots] at each slot's current length: (logits [slots, V] float32, new cache).

        Donates this cache's KV buffer. Every row computes (fixed shape); a free slot's logits are
        meaningless. Raises InputError when a slot is full.
        """
        if self.lengths.max() >= self.capacity:
            raise InputError(f"a decode slot reached capacity {self.capacity}")
        # Private copies: on CPU, JAX may alias a NumPy buffer instead of copying it, and the caller
        # may reuse `tokens` while the step still runs.
        logits, kv = decode_step_jit(params, self.cfg, jnp.array(tokens, jnp.int32), self.kv,
                                     jnp.array(self.lengths), seq_major=self.seq_major)
        return logits, self.replace(kv=kv, lengths=_frozen(np.where(self.lengths > 0, self.lengths + 1, 0)))


def generate(params: Params, cfg: ModelConfig, tokens, steps: int, capacity: int | None = None):
    """Greedy-generate `steps` tokens after each prompt row of tokens [B, T]; returns ids [B, steps]."""
    tokens = check_tokens(tokens, cfg)
    B, T = tokens.shape
    logits, kv = prefill(params, cfg, tokens)
    cache = DecodeCache.create(cfg, B, capacity or T + steps)
    for b in range(B):
        cache = cache.insert(b, kv[:, b])
    out = [np.asarray(greedy(logits[:, -1]))]
    for _ in range(steps - 1):
        logits, cache = cache.step(params, out[-1])
        out.append(np.asarray(greedy(logits)))
    return np.stack(out, axis=1)
