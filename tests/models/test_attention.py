"""The fused attention prefill and decode use (`jax.nn.dot_product_attention`) equals a plain einsum
attention on the same inputs: with a padded prefix and causal new tokens (prefill's mask), and with
per-row KV lengths (decode's); on CPU it is XLA's."""

import jax
import jax.numpy as jnp
import numpy as np

from models.dense.model import HEAD_MAJOR, attention_implementation, cache_layout
from models.layers import attend


def einsum_attention(q, keys, vals, mask, cfg):
    """GQA attention spelt out: q [B, T, N, H] over keys/vals [B, S, K, H] where mask [B, T, S]."""
    B, T, _, H = q.shape
    q = q.reshape(B, T, cfg.n_kv_heads, cfg.q_per_kv, H)
    scores = jnp.einsum("btkgh,bskh->bkgts", q, keys, preferred_element_type=jnp.float32) / np.sqrt(H)
    probs = jax.nn.softmax(jnp.where(mask[:, None, None], scores, -jnp.inf), axis=-1).astype(vals.dtype)
    return jnp.einsum("bkgts,bskh->btkgh", probs, vals).reshape(B, T, cfg.n_heads, H)


def _qkv(cfg, rng, B, T, S):
    q = jnp.asarray(rng.standard_normal((B, T, cfg.n_heads, cfg.head_dim)), cfg.jnp_dtype)
    keys, vals = (jnp.asarray(rng.standard_normal((B, S, cfg.n_kv_heads, cfg.head_dim)), cfg.jnp_dtype)
                  for _ in range(2))
    return q, keys, vals


def test_fused_attention_equals_the_einsum_reference(tiny, rng):
    cfg, _ = tiny
    B, T, S = 2, 5, 7
    q, keys, vals = _qkv(cfg, rng, B, T, S + T)
    prefix_len = np.array([3, 7])
    in_prefix = np.arange(S)[None, None, :] < prefix_len[:, None, None]
    causal = np.tril(np.ones((T, T), bool))[None]
    mask = jnp.asarray(np.concatenate([np.broadcast_to(in_prefix, (B, T, S)), np.broadcast_to(causal, (B, T, T))], -1))
    fused = attend(q, keys, vals, attention_implementation(cfg), mask)
    np.testing.assert_allclose(np.asarray(fused), np.asarray(einsum_attention(q, keys, vals, mask, cfg)),
                               rtol=1e-5, atol=1e-5)
    if jax.default_backend() == "cpu":
        assert attention_implementation(cfg) == "xla"


def test_decode_form_reads_each_row_up_to_its_length(tiny, rng):
    """One query per row over a padded cache: key_value_seq_lengths hides the positions past a row's
    length (their values here are huge, so any leak shows), as decode's mask did."""
    cfg, _ = tiny
    B, C = 3, 16
    q, keys, vals = _qkv(cfg, rng, B, 1, C)
    kv_lengths = np.array([1, 9, 16], np.int32)
    past = np.arange(C)[None, :, None, None] >= kv_lengths[:, None, None, None]
    vals = jnp.where(past, 1e6, vals)
    mask = jnp.asarray(np.arange(C)[None, None, :] < kv_lengths[:, None, None])  # [B, 1, C]
    fused = attend(q, keys, vals, attention_implementation(cfg, decode=True), kv_lengths=jnp.asarray(kv_lengths))
    np.testing.assert_allclose(np.asarray(fused), np.asarray(einsum_attention(q, keys, vals, mask, cfg)),
                               rtol=1e-5, atol=1e-5)
    if jax.default_backend() == "cpu":
        assert attention_implementation(cfg, decode=True) == "xla" and cache_layout(cfg) == HEAD_MAJOR
