"""Every public function of `models` works for every family: each is called here with the tiny preset of
each registered family (`models.families()`, `Family.tiny_preset`) and checked against the family's
reference forward or against another public function."""

import inspect
import json
import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import models
from models.layers import embed, head

TOL = dict(rtol=1e-4, atol=1e-4)
T = 40  # > deepseek-tiny's index_topk (24): its sparse selection is in play


@pytest.fixture(scope="module", params=[f.tiny_preset for f in models.families()])
def model(request):
    cfg = models.get_config(request.param)
    params = models.init_params(cfg, seed=2)
    tokens = np.random.default_rng(5).integers(0, cfg.vocab, (2, T))
    return cfg, params, tokens, models.reference_logits(params, cfg, tokens)


def test_forward_layer_forward_and_prefill_equal_the_reference(model):
    cfg, params, tokens, ref = model
    logits, kv = models.prefill(params, cfg, tokens)
    np.testing.assert_allclose(np.asarray(logits), ref, **TOL)
    empty, zero = jnp.asarray(np.zeros((cfg.n_layers, 2, 0, *cfg.kv_record_shape), cfg.kv_np_dtype)), jnp.zeros(2, int)
    fused_logits, fused_kv = jax.jit(models.forward, static_argnums=1)(params, cfg, jnp.asarray(tokens), empty, zero)
    layer = jax.jit(models.forward_layer, static_argnums=3)
    x, positions = embed(params, jnp.asarray(tokens)), jnp.broadcast_to(jnp.arange(T), (2, T))
    for i, lp in enumerate(params["layers"]):
        x, kv_i = layer(x, lp, positions, cfg, empty[i], zero)
        np.testing.assert_allclose(np.asarray(kv_i), np.asarray(kv[i]), **TOL)
    np.testing.assert_allclose(np.asarray(fused_logits), ref, **TOL)
    np.testing.assert_allclose(np.asarray(fused_kv), np.asarray(kv), **TOL)
    np.testing.assert_allclose(np.asarray(head(params, cfg, x)), ref, **TOL)
    assert models.kv_bytes_per_token(cfg) == np.asarray(kv[:, 0, 0]).nbytes  # one token's records, all layers


def test_layerwise_equals_prefill(model):
    cfg, params, tokens, ref = model
    _, prefix = models.prefill(params, cfg, tokens[:, :30])
    lw = models.Layerwise(params, cfg, tokens[:, 30:], prefix_len=[30, 30])
    for i in range(cfg.n_layers):
        lw.layer(i, np.asarray(prefix[i]))
    np.testing.assert_allclose(np.asarray(lw.logits()), ref[:, 30:], **TOL)
    assert models.compile_counts()["layer"] >= 1


def test_decode_cache_decode_step_and_generate_continue_the_reference(model):
    cfg, params, tokens, ref = model
    _, kv = models.prefill(params, cfg, tokens[:, :30])
    cache = models.DecodeCache.create(cfg, slots=3, capacity=64).insert(0, kv[:, 0]).insert(2, kv[:, 1], length=25)
    np.testing.assert_array_equal(np.asarray(cache.row(2, 0, 25)), np.asarray(kv[:, 1, :25]))
    step = jax.jit(models.decode_step, static_argnums=(1, 5))
    want, _ = step(params, cfg, jnp.asarray(tokens[[0, 0, 1], [30, 0, 25]]), jnp.array(cache.kv),
                   jnp.asarray(cache.lengths), cache.layout)
    logits, cache = cache.step(params, tokens[[0, 0, 1], [30, 0, 25]])
    np.testing.assert_array_equal(np.asarray(logits), np.asarray(want))
    np.testing.assert_allclose(np.asarray(logits)[[0, 2]], ref[[0, 1], [30, 25]], **TOL)
    assert cache.lengths.tolist() == [31, 0, 26] and cache.evict(0).truncate(20).lengths.tolist() == [0, 0, 20]
    filled = models.DecodeCache.filled(cfg, 2, 16, 8)
    assert filled.lengths.tolist() == [8, 8] and filled.capacity == 16 and filled.slots == 2
    out = models.generate(params, cfg, tokens[:, :30], steps=2)  # greedy: each token the argmax of the last
    first = models.prefill(params, cfg, tokens[:, :30])[0][:, -1]
    np.testing.assert_array_equal(out[:, 0], np.asarray(models.greedy(first)))
    second = models.reference_logits(params, cfg, np.concatenate([tokens[:, :30], out[:, :1]], axis=1))[:, -1]
    np.testing.assert_array_equal(out[:, 1], second.argmax(-1))


def test_params_are_derived_from_the_declarations(model):
    cfg, params, _, _ = model
    shapes = jax.tree.map(lambda a: (a.shape, a.dtype), models.abstract_params(cfg))
    assert shapes == jax.tree.map(lambda a: (a.shape, a.dtype), params)
    count = sum(x.size for x in jax.tree.leaves(params))
    assert models.param_count(cfg) == count and models.param_bytes(cfg) == count * cfg.jnp_dtype.itemsize
    models.check_params(params, cfg)
    with pytest.raises(ValueError, match="missing tensor"):
        models.check_params({**params, "layers": params["layers"][:-1]}, cfg)
    assert models.prefill_flops(cfg, 10, 100) > models.prefill_flops(cfg, 10) > 0
    assert models.decode_flops(cfg, 100) == models.prefill_flops(cfg, 1, 100)


def test_sharded_params_give_the_single_device_logits(model):
    cfg, params, tokens, ref = model
    mesh = models.make_mesh(jax.devices()[:4])
    shardings = models.param_shardings(cfg, mesh)
    sharded = models.shard_params(params, cfg, mesh)
    assert jax.tree.leaves(sharded)[0].sharding == jax.tree.leaves(shardings)[0]
    np.testing.assert_allclose(np.asarray(models.prefill(sharded, cfg, tokens)[0]), ref, **TOL)


def test_checkpoints_round_trip(model, tmp_path):
    cfg, params, _, _ = model
    models.save_checkpoint(str(tmp_path / "orbax"), params, cfg)
    stored = json.loads((tmp_path / "orbax" / "model_config.json").read_text())
    assert stored["family"] == cfg.family.name == type(cfg).family_name()
    assert models.read_config(str(tmp_path / "orbax")) == cfg
    restored_cfg, restored = models.restore_checkpoint(str(tmp_path / "orbax"))
    source = models.resolve_model(str(tmp_path / "orbax"))
    assert restored_cfg == source.config == cfg and source.kind == "orbax"
    for tree in (restored, source.load_params()):
        for a, b in zip(jax.tree.leaves(tree), jax.tree.leaves(params), strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_hugging_face_directories_round_trip(model, tmp_path):
    cfg, params, _, _ = model
    models.save_hf(str(tmp_path / "hf"), params, cfg)  # the family's published layout (`Family.export_hf`)
    hf_cfg, hf_params = models.load_hf(str(tmp_path / "hf"))
    source = models.resolve_model(str(tmp_path / "hf"))
    assert hf_cfg == source.config == cfg and source.kind == "hf"
    for tree in (hf_params, source.load_params()):
        for a, b in zip(jax.tree.leaves(tree), jax.tree.leaves(params), strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_every_family_names_its_tiny_preset_and_reaches_it_through_the_config():
    families = models.families()
    assert len({f.name for f in families}) == len(families) >= 2
    for family in families:
        cfg = models.get_config(family.tiny_preset)
        assert cfg.family is family and type(cfg).family_name() == family.name
    names = models.preset_names()
    assert set(names) == set(models.PRESETS)
    for name in names:  # every preset belongs to a registered family, and `--model` resolves it to itself
        cfg = models.get_config(name)
        assert cfg.family in families and models.resolve_model(name).config == cfg
    with pytest.raises(models.UnknownPreset, match=families[-1].tiny_preset):
        models.get_config("no-such-model")


def test_every_public_function_is_called_here():
    public = {n for n in models.__all__ if inspect.isfunction(getattr(models, n))} | {"DecodeCache", "Layerwise"}
    called = set(re.findall(r"models\.(\w+)", pathlib.Path(__file__).read_text()))
    assert public <= called, sorted(public - called)
