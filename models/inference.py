"""The entry points every family shares: the fused forward over a cached prefix, `prefill` (checked,
padded to buckets, jitted), greedy `generate`, and the per-family pieces reached through `cfg.family`
(`forward_layer`, `reference_logits`).

`forward` is a plain loop over the family's `forward_layer`, the very function the layerwise driver
(`models.layerwise`) calls a layer at a time, so fused and layerwise agree by construction.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from models.buckets import DEFAULT_BUCKETS, Buckets
from models.cache import DecodeCache
from models.checks import check_prefix, check_tokens
from models.layers import embed, head
from models.padding import pad_to
from models.params import Params
from models.sharding import constrain


def forward_layer(x, lp, positions, cfg, prefix_kv, prefix_len):
    """One layer of cfg's family over new tokens x [B, T, D] at positions [B, T], attending to its
    cached prefix records [B, S, *record] (the first prefix_len[b] valid) and causally to themselves;
    returns (x [B, T, D], the new tokens' records [B, T, *record])."""
    return cfg.family.forward_layer(x, lp, positions, cfg, prefix_kv, prefix_len)


def forward(params: Params, cfg, tokens, prefix_kv, prefix_len):
    """Fused prefill: tokens [B, T], prefix_kv [L, B, S, *record], prefix_len [B]
    -> (logits [B, T, V] float32, records [L, B, T, *record])."""
    positions = prefix_len[:, None] + jnp.arange(tokens.shape[1])[None, :]
    x = embed(params, tokens)
    kvs = []
    for layer, lp in enumerate(params["layers"]):
        x, kv = forward_layer(x, lp, positions, cfg, prefix_kv[layer], prefix_len)
        kvs.append(kv)
    return head(params, cfg, x), constrain(jnp.stack(kvs), ("layers", *cfg.family.kv_axes))


forward_jit = jax.jit(forward, static_argnums=1)


def prefill(params: Params, cfg, tokens, prefix_kv=None, prefix_len=None, buckets: Buckets = DEFAULT_BUCKETS):
    """Prefill new tokens [B, T] over a cached prefix [L, B, S, *record] (None or S = 0: no prefix).

    Returns (logits [B, T, V] float32, records [L, B, T, *record]) for the new tokens only. Lengths are
    padded to `buckets`. Raises InputError for ids outside the vocabulary, a misshaped prefix, or a
    sequence past `cfg.max_seq_len`.
    """
    tokens = check_tokens(tokens, cfg)
    B, T = tokens.shape
    prefix_kv, lengths = check_prefix(prefix_kv, prefix_len, cfg, B, T, cfg.n_layers)
    Tb, Sb = buckets.new(T), buckets.prefix(int(lengths.max(initial=0)))
    logits, kv = forward_jit(params, cfg, pad_to(jnp.asarray(tokens), 1, Tb),
                             pad_to(jnp.asarray(prefix_kv)[:, :, :Sb], 2, Sb), jnp.asarray(lengths))
    return logits[:, :T], kv[:, :, :T]


def greedy(logits):
    """Greedy sampling: argmax over the vocabulary (ties go to the lowest id)."""
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)


def generate(params: Params, cfg, tokens, steps: int, capacity: int | None = None) -> np.ndarray:
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


def reference_logits(params: Params, cfg, tokens) -> np.ndarray:
    """float32 logits [B, T, V] of tokens [B, T] by cfg's family's plain, cache-free forward, written
    apart from the model code: the tests' reference."""
    return np.asarray(cfg.family.reference_logits(params, cfg, check_tokens(tokens, cfg)), np.float32)
