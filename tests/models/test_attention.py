"""The fused attention the prefill uses equals the einsum attention (decode's) on the same inputs,
with a padded prefix and causal new tokens; on CPU it is XLA's."""

import jax
import jax.numpy as jnp
import numpy as np

from models.model import attend, attend_fused, attention_implementation


def test_fused_attention_equals_the_einsum_reference(tiny, rng):
    cfg, _ = tiny
    B, T, S, K, H = 2, 5, 7, cfg.n_kv_heads, cfg.head_dim
    q = jnp.asarray(rng.standard_normal((B, T, cfg.n_heads, H)), cfg.jnp_dtype)
    keys = jnp.asarray(rng.standard_normal((B, S + T, K, H)), cfg.jnp_dtype)
    vals = jnp.asarray(rng.standard_normal((B, S + T, K, H)), cfg.jnp_dtype)
    prefix_len = np.array([3, 7])
    in_prefix = np.arange(S)[None, None, :] < prefix_len[:, None, None]
    causal = np.tril(np.ones((T, T), bool))[None]
    mask = jnp.asarray(np.concatenate([np.broadcast_to(in_prefix, (B, T, S)), np.broadcast_to(causal, (B, T, T))], -1))
    fused = attend_fused(q, keys, vals, mask, cfg)
    reference = attend(q, keys.transpose(0, 2, 1, 3), vals.transpose(0, 2, 1, 3), mask, cfg)
    np.testing.assert_allclose(np.asarray(fused), np.asarray(reference), rtol=1e-5, atol=1e-5)
    if jax.default_backend() == "cpu":
        assert attention_implementation(cfg) == "xla"
