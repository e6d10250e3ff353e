"""Batched greedy decoding over a fixed-shape KV cache, and a one-call `generate`.

A `DecodeCache` has a fixed number of slots and a fixed capacity, so every decode step runs the
same compiled program whatever the batch's composition: a row's tokens do not depend on which
other requests share the batch (this is what lets the runtime promise bit-identical tokens).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from models.buckets import DEFAULT_BUCKETS
from models.config import ModelConfig
from models.model import decode_step_jit, greedy
from models.params import Params
from models.prefill import InputError, check_tokens, prefill


@functools.partial(jax.jit, donate_argnums=0)
def _insert_jit(cache, kv, slot):
    """cache [L, 2, B, K, C, H] with kv [L, S, 2, K, H] written at (slot, 0); donates `cache`."""
    kv = kv.transpose(0, 2, 3, 1, 4)[:, :, None]  # [L, 2, 1, K, S, H]
    return jax.lax.dynamic_update_slice(cache, kv, (0, 0, slot, 0, 0, 0))


class DecodeCache:
    """KV cache [L, 2, slots, K, capacity, H] (decode layout) plus per-slot lengths (host-side).

    `insert` takes and `row` gives the sequence layout [L, S, 2, K, H] (runs of Full Blocks)."""

    def __init__(self, cfg: ModelConfig, slots: int, capacity: int, sharding=None):
        if capacity > cfg.max_seq_len:
            raise InputError(f"decode capacity {capacity} exceeds max_seq_len={cfg.max_seq_len} of {cfg.name!r}")
        self.cfg, self.slots, self.capacity = cfg, slots, capacity
        shape = (cfg.n_layers, 2, slots, cfg.n_kv_heads, capacity, cfg.head_dim)
        self.kv = jnp.zeros(shape, cfg.jnp_dtype, device=sharding)
        self.lengths = np.zeros(slots, np.int32)

    def insert(self, slot: int, kv) -> None:
        """Place one sequence's KV [L, S, 2, K, H] into `slot` (replacing what was there).

        S is padded to a bucket (powers of two) so inserts compile a handful of programs; the
        padding lies past the slot's length and is never attended to.
        """
        S = kv.shape[1]
        if S >= self.capacity:
            raise InputError(f"sequence of {S} tokens does not fit decode capacity {self.capacity}")
        padded = min(self.capacity, DEFAULT_BUCKETS.prefix(S))
        kv = np.pad(np.asarray(kv), [(0, 0), (0, padded - S)] + [(0, 0)] * 3)
        self.kv = _insert_jit(self.kv, jnp.asarray(kv, self.kv.dtype), slot)
        self.lengths[slot] = S

    def row(self, slot: int, start: int, stop: int):
        """KV [L, stop-start, 2, K, H] of one slot's positions [start, stop)."""
        return self.kv[:, :, slot, :, start:stop].transpose(0, 3, 1, 2, 4)

    def step(self, params: Params, tokens) -> np.ndarray:
        """Feed tokens [slots] at each slot's current length; returns greedy next ids [slots].

        Rows whose slot is idle still compute (fixed shape) and their outputs are ignored.
        Raises InputError when any slot is full.
        """
        if self.lengths.max() >= self.capacity:
            raise InputError(f"a decode slot reached capacity {self.capacity}")
        # A private copy: on CPU, JAX may alias a NumPy buffer instead of copying it, and we bump
        # `self.lengths` while the step may still be running.
        logits, self.kv = decode_step_jit(params, self.cfg, jnp.array(tokens, jnp.int32), self.kv,
                                          jnp.array(self.lengths.copy()))
        self.lengths += 1
        return np.asarray(greedy(logits))


def generate(params: Params, cfg: ModelConfig, tokens, steps: int, capacity: int | None = None):
    """Greedy-generate `steps` tokens after each prompt row of tokens [B, T]; returns ids [B, steps]."""
    tokens = check_tokens(tokens, cfg)
    B, T = tokens.shape
    logits, kv = prefill(params, cfg, tokens)
    cache = DecodeCache(cfg, B, capacity or T + steps)
    for b in range(B):
        cache.insert(b, kv[:, b])
    out = [np.asarray(greedy(logits[:, -1]))]
    for _ in range(steps - 1):
        out.append(cache.step(params, out[-1]))
    return np.stack(out, axis=1)
