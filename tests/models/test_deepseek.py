"""DeepSeek-V3.2 family invariants: prefill over a cached prefix, decode, absorbed MLA, layerwise,
DSA sparsity and sharding all match the full forward and an independent NumPy reference."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import models
from models.cache import decode_step_jit
from models.deepseek import mla
from models.deepseek import model as ds
from models.deepseek.config import PRESETS
from models.layers import embed, head

TOL = dict(rtol=2e-5, atol=2e-5)
T_FULL = 100  # > index_topk (24) of deepseek-tiny: DSA selects


@pytest.fixture(scope="module")
def tiny_ds():
    cfg = PRESETS["deepseek-tiny"]
    return cfg, models.init_params(cfg, seed=0)


@pytest.fixture(scope="module")
def full(tiny_ds):
    cfg, params = tiny_ds
    tokens = np.random.default_rng(7).integers(0, cfg.vocab, (2, T_FULL))
    logits, kv = models.prefill(params, cfg, tokens)
    return tokens, np.asarray(logits), np.asarray(kv)


def test_presets_count_the_public_shapes():
    v32, small = PRESETS["deepseek-v3.2"], PRESETS["ds-27b"]
    abstract = jax.eval_shape(functools.partial(models.init_params, v32))
    total = sum(x.size for x in jax.tree.leaves(abstract))
    assert total == models.param_count(v32)
    assert 671e9 <= total <= 672.5e9  # 671B public (V3 without MTP) plus the indexer's 0.9B
    assert 26.5e9 <= models.param_count(small) <= 27.5e9
    assert v32.kv_record_shape == (512 + 64 + 128,) and v32.kv_record_bytes == 1408
    fp8 = v32.replace(kv_cache_dtype="fp8")
    assert fp8.kv_record_bytes == 656 + 132 and fp8.kv_dtype == "uint8"


def test_full_prefill_matches_numpy_reference(tiny_ds, full):
    cfg, params = tiny_ds
    tokens, logits, _ = full
    np.testing.assert_allclose(logits, models.reference_logits(params, cfg, tokens), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("split", [0, 1, 20, 37, 64, 99])
def test_prefill_over_cached_prefix_matches_full(tiny_ds, full, split):
    cfg, params = tiny_ds
    tokens, logits, kv = full
    _, kv1 = models.prefill(params, cfg, tokens[:, :split])
    logits2, kv2 = models.prefill(params, cfg, tokens[:, split:], kv1)
    np.testing.assert_allclose(np.asarray(logits2), logits[:, split:], **TOL)
    np.testing.assert_allclose(np.asarray(kv2), kv[:, :, split:], **TOL)


def test_ragged_prefix_lengths_per_row(tiny_ds, full):
    cfg, params = tiny_ds
    tokens, logits, kv = full
    lengths = np.array([70, 45])
    new = np.stack([tokens[0, 70:90], tokens[1, 45:65]])
    got, _ = models.prefill(params, cfg, new, kv[:, :, :70], prefix_len=lengths)
    for b, n in enumerate(lengths):
        np.testing.assert_allclose(np.asarray(got[b]), logits[b, n:n + 20], **TOL)


def test_decode_steps_reproduce_full_forward(tiny_ds, full):
    cfg, params = tiny_ds
    tokens, logits, kv = full
    start, capacity = 80, 128
    cache = np.zeros((cfg.n_layers, 2, capacity, *cfg.kv_record_shape), np.float32)
    cache[:, :, :start] = kv[:, :, :start]
    cache, lengths = jnp.asarray(cache), jnp.full((2,), start, jnp.int32)
    for t in range(start, T_FULL):
        step_logits, cache = decode_step_jit(params, cfg, jnp.asarray(tokens[:, t]), cache, lengths, ds.RECORDS)
        lengths = lengths + 1
        np.testing.assert_allclose(np.asarray(step_logits), logits[:, t], **TOL)
    np.testing.assert_allclose(np.asarray(cache[:, :, start:T_FULL]), kv[:, :, start:], **TOL)


def test_absorbed_attention_equals_expanded(tiny_ds):
    cfg, params = tiny_ds
    lp, rng = params["layers"][1], np.random.default_rng(3)
    B, T, S, N = 2, 3, 40, cfg.n_heads
    arr = lambda *shape: jnp.asarray(rng.standard_normal(shape), jnp.float32)  # noqa: E731
    q_nope, q_pe = arr(B, T, N, cfg.qk_nope_head_dim), arr(B, T, N, cfg.qk_rope_head_dim)
    c_kv, k_pe = arr(B, S, cfg.kv_lora_rank), arr(B, S, cfg.qk_rope_head_dim)
    mask = jnp.asarray(rng.random((B, T, S)) < 0.6)
    np.testing.assert_allclose(np.asarray(mla.attend_absorbed(q_nope, q_pe, c_kv, k_pe, mask, lp, cfg)),
                               np.asarray(mla.attend_expanded(q_nope, q_pe, c_kv, k_pe, mask, lp, cfg)), **TOL)


def test_layer_by_layer_equals_fused(tiny_ds, full):
    cfg, params = tiny_ds
    tokens, logits, kv = full
    layer = jax.jit(ds.forward_layer, static_argnums=3)
    lengths = jnp.full((2,), 60, jnp.int32)
    positions = lengths[:, None] + jnp.arange(40)[None]
    x = embed(params, jnp.asarray(tokens[:, 60:]))
    for i, lp in enumerate(params["layers"]):
        x, kv_i = layer(x, lp, positions, cfg, jnp.asarray(kv[i, :, :60]), lengths)
        np.testing.assert_allclose(np.asarray(kv_i), kv[i, :, 60:], **TOL)
    np.testing.assert_allclose(np.asarray(head(params, cfg, x)), logits[:, 60:], **TOL)


def _perturb_indexer(params, seed):
    rng = np.random.default_rng(seed)
    layers = [{k: (v + jnp.asarray(rng.standard_normal(v.shape), v.dtype) if k in ("idx_wq", "idx_wk") else v)
               for k, v in lp.items()} for lp in params["layers"]]
    return {**params, "layers": layers}


def test_fewer_tokens_than_topk_is_dense_attention(tiny_ds, full):
    """Up to index_topk tokens the indexer selects everything: its weights cannot change the logits;
    past index_topk they do (the selection is sparse)."""
    cfg, params = tiny_ds
    tokens, logits, _ = full
    other = _perturb_indexer(params, 5)
    short = cfg.index_topk
    np.testing.assert_allclose(np.asarray(models.prefill(other, cfg, tokens[:, :short])[0]), logits[:, :short], **TOL)
    assert np.abs(np.asarray(models.prefill(other, cfg, tokens)[0]) - logits).max() > 1e-3


def test_sharded_experts_equal_single_device(tiny_ds, full):
    cfg, params = tiny_ds
    tokens, logits, kv = full
    mesh = models.make_mesh(jax.devices()[:4])
    sharded = models.shard_params(params, cfg, mesh)
    assert sharded["layers"][1]["e_gate"].sharding.spec[0] == "tp"  # experts over the mesh
    got_logits, got_kv = models.prefill(sharded, cfg, tokens)
    np.testing.assert_allclose(np.asarray(got_logits), logits, **TOL)
    np.testing.assert_allclose(np.asarray(got_kv), kv, **TOL)


def test_decode_cache_steps_reproduce_full_forward(tiny_ds, full):
    cfg, params = tiny_ds
    tokens, logits, kv = full
    cache = models.DecodeCache.create(cfg, slots=3, capacity=128)
    assert cache.kv.shape == (cfg.n_layers, 3, 128, *cfg.kv_record_shape)  # the sequence layout itself
    cache = cache.insert(0, kv[:, 0, :80]).insert(2, kv[:, 1, :70])  # slot 1 stays free
    np.testing.assert_array_equal(np.asarray(cache.row(2, 0, 70)), kv[:, 1, :70])
    for i in range(10):
        step_logits, cache = cache.step(params, np.array([tokens[0, 80 + i], 0, tokens[1, 70 + i]]))
        np.testing.assert_allclose(np.asarray(step_logits)[[0, 2]], logits[[0, 1], [80 + i, 70 + i]], **TOL)
    assert cache.lengths.tolist() == [90, 0, 80]


def test_layerwise_driver_equals_fused(tiny_ds, full):
    cfg, params = tiny_ds
    tokens, logits, kv = full
    lw = models.Layerwise(params, cfg, tokens[:, 50:], prefix_len=[50, 50])
    kvs = [np.asarray(lw.layer(i, kv[i, :, :50])) for i in range(cfg.n_layers)]
    np.testing.assert_allclose(np.asarray(lw.logits()), logits[:, 50:], **TOL)
    np.testing.assert_allclose(np.stack(kvs), kv[:, :, 50:], **TOL)
    with pytest.raises(models.InputError, match="expects layer 0"):
        models.Layerwise(params, cfg, tokens[:, :8]).layer(1, np.zeros((2, 0, *cfg.kv_record_shape), np.float32))
