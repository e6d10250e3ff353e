"""Model invariants: cached-prefix prefill, decode, layerwise and sharded runs match the reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import models
from models.cache import decode_step_jit
from models.dense.model import HEAD_MAJOR, SEQ_MAJOR, rope_inv_freq
from models.padding import HOST_ALIGN, host_padded

TOL = dict(rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("split", [0, 1, 37, 64, 128, 199])
def test_prefill_over_cached_prefix_matches_full_and_reference(tiny, rng, split):
    cfg, params = tiny
    tokens = rng.integers(0, cfg.vocab, (2, 200))
    ref = models.reference_logits(params, cfg, tokens)
    full_logits, full_kv = models.prefill(params, cfg, tokens)
    np.testing.assert_allclose(np.asarray(full_logits), ref, **TOL)
    _, kv1 = models.prefill(params, cfg, tokens[:, :split])
    logits2, kv2 = models.prefill(params, cfg, tokens[:, split:], kv1)
    np.testing.assert_allclose(np.asarray(logits2), ref[:, split:], **TOL)
    np.testing.assert_allclose(np.asarray(kv2), np.asarray(full_kv[:, :, split:]), **TOL)


def test_ragged_prefix_lengths_per_row(tiny, rng):
    cfg, params = tiny
    tokens = rng.integers(0, cfg.vocab, (2, 90))
    _, kv = models.prefill(params, cfg, tokens[:, :70])
    lengths = np.array([70, 50])
    new = np.stack([tokens[0, 70:90], tokens[1, 50:70]])
    logits, _ = models.prefill(params, cfg, new, kv, prefix_len=lengths)
    for b, n in enumerate(lengths):
        ref = models.reference_logits(params, cfg, tokens[b:b + 1, :n + 20])
        np.testing.assert_allclose(np.asarray(logits[b]), ref[0, n:], **TOL)


def test_decode_steps_reproduce_full_forward(tiny, rng):
    cfg, params = tiny
    tokens = rng.integers(0, cfg.vocab, (3, 40))
    ref = models.reference_logits(params, cfg, tokens)
    _, kv = models.prefill(params, cfg, tokens[:, :30])
    cache = models.DecodeCache.create(cfg, slots=3, capacity=64)
    for b in range(3):
        cache = cache.insert(b, kv[:, b])
    for t in range(30, 40):
        logits, cache = cache.step(params, tokens[:, t])
        np.testing.assert_allclose(np.asarray(logits), ref[:, t], **TOL)
    assert cache.lengths.tolist() == [40, 40, 40]


def test_decode_step_kernel_reproduces_full_forward(tiny, rng):
    """The array-level `decode_step` (what DecodeCache.step runs) over ragged rows."""
    cfg, params = tiny
    tokens = rng.integers(0, cfg.vocab, (2, 24))
    ref = models.reference_logits(params, cfg, tokens)
    _, kv = models.prefill(params, cfg, tokens[:, :20])
    cache = models.DecodeCache.create(cfg, slots=2, capacity=32).insert(0, kv[:, 0]).insert(1, kv[:, 1], length=17)
    lengths = np.array([20, 17], np.int32)
    logits, _ = decode_step_jit(params, cfg, jnp.asarray(tokens[[0, 1], [20, 17]]), cache.kv, jnp.asarray(lengths),
                                cache.layout)
    np.testing.assert_allclose(np.asarray(logits[0]), ref[0, 20], **TOL)
    np.testing.assert_allclose(np.asarray(logits[1]), ref[1, 17], **TOL)


def test_sequence_major_decode_cache_equals_head_major(tiny, rng):
    """The layout cuDNN's decode attention reads (sequence-major, chosen on GPUs) runs here under XLA: the
    same logits as the head-major cache and the reference, and the same rows back."""
    cfg, params = tiny
    tokens = rng.integers(0, cfg.vocab, (2, 28))
    ref = models.reference_logits(params, cfg, tokens)
    _, kv = models.prefill(params, cfg, tokens[:, :20])
    caches = [models.DecodeCache.create(cfg, slots=2, capacity=32, layout=lay) for lay in (HEAD_MAJOR, SEQ_MAJOR)]
    caches = [c.insert(0, kv[:, 0]).insert(1, kv[:, 1], length=17) for c in caches]
    assert caches[1].kv.shape == (cfg.n_layers, 2, 2, 32, cfg.n_kv_heads, cfg.head_dim) and caches[1].capacity == 32
    for t in range(8):
        out = []
        for i, cache in enumerate(caches):
            logits, caches[i] = cache.step(params, tokens[[0, 1], [20 + t, 17 + t]])
            out.append(np.asarray(logits))
        np.testing.assert_allclose(out[1], out[0], **TOL)
        np.testing.assert_allclose(out[1], ref[[0, 1], [20 + t, 17 + t]], **TOL)
    rows = [np.asarray(c.row(1, 0, 25)) for c in caches]
    np.testing.assert_array_equal(rows[1][:, :17], np.asarray(kv[:, 1, :17]))  # inserted: the same bytes back
    np.testing.assert_allclose(rows[1], rows[0], **TOL)  # decoded: the layouts' dots may round differently


def test_decode_cache_transitions_are_pure_and_donate(tiny, rng):
    cfg, params = tiny
    tokens = rng.integers(0, cfg.vocab, (1, 12))
    _, kv = models.prefill(params, cfg, tokens)
    empty = models.DecodeCache.create(cfg, slots=2, capacity=16)
    assert jax.tree.leaves(empty)[0] is empty.kv  # a pytree whose leaves are kv and lengths
    cache = empty.insert(1, kv[:, 0], length=10)
    assert empty.lengths.tolist() == [0, 0] and cache.lengths.tolist() == [0, 10]
    assert empty.kv.is_deleted()  # donated
    with pytest.raises(ValueError):
        cache.lengths[0] = 3  # read-only: only transitions change lengths
    _, after = cache.step(params, np.array([0, tokens[0, 10]]))
    assert after.lengths.tolist() == [0, 11]  # the free slot stays free
    np.testing.assert_array_equal(np.asarray(after.row(1, 0, 10)), np.asarray(kv[:, 0, :10]))
    assert after.evict(1).lengths.tolist() == [0, 0] and after.lengths.tolist() == [0, 11]
    assert after.truncate(4).lengths.tolist() == [0, 4] and after.truncate(20, slot=1).lengths.tolist() == [0, 11]
    with pytest.raises(models.InputError, match="does not fit"):
        after.insert(0, kv[:, 0], length=12).insert(0, jnp.zeros((2, 16, 2, 2, 16)))
    with pytest.raises(models.InputError, match="insert takes kv"):
        after.insert(0, kv[:, 0, :, :, :1])


def test_generate_is_greedy_continuation(tiny, rng):
    cfg, params = tiny
    prompt = rng.integers(0, cfg.vocab, (1, 12))
    out = models.generate(params, cfg, prompt, steps=6)
    seq = prompt
    for t in range(6):
        nxt = models.reference_logits(params, cfg, seq)[0, -1].argmax()
        assert out[0, t] == nxt
        seq = np.concatenate([seq, [[nxt]]], axis=1)


def test_a_config_under_another_name_runs_the_programs_compiled_for_it(tiny, rng):
    """The name labels an architecture: a checkpoint of a preset's shape (its config named after its
    directory) equals the preset's config and compiles nothing new."""
    cfg, params = tiny
    renamed = cfg.replace(name="a-checkpoint-of-tiny")
    assert renamed == cfg and hash(renamed) == hash(cfg) and renamed.name != cfg.name
    tokens = rng.integers(0, cfg.vocab, (1, 24))
    want = models.prefill(params, cfg, tokens)[0]
    before = models.compile_counts()
    np.testing.assert_array_equal(np.asarray(models.prefill(params, renamed, tokens)[0]), np.asarray(want))
    assert models.compile_counts() == before
    assert cfg.replace(name="x", n_layers=cfg.n_layers + 1) != cfg  # every other field still tells configs apart


def test_layerwise_equals_fused(tiny, rng):
    cfg, params = tiny
    tokens = rng.integers(0, cfg.vocab, (1, 150))
    _, prefix = models.prefill(params, cfg, tokens[:, :100])
    fused_logits, fused_kv = models.prefill(params, cfg, tokens[:, 100:], prefix)
    lw = models.Layerwise(params, cfg, tokens[:, 100:], prefix_len=[100])
    kvs = [lw.layer(layer, prefix[layer]) for layer in range(cfg.n_layers)]
    np.testing.assert_allclose(np.asarray(lw.logits()), np.asarray(fused_logits), **TOL)
    np.testing.assert_allclose(np.asarray(jnp.stack(kvs)), np.asarray(fused_kv), **TOL)


def test_layerwise_copies_each_prefix_so_the_caller_may_reuse_its_buffer(tiny, rng):
    """A layer's prefix KV is copied once, aligned, before it goes to the device: the caller (a PE
    buffer) may overwrite its buffer as soon as the call returns, even where the device would
    alias an aligned host array (the CPU), and even when the prefix needs no padding."""
    cfg, params = tiny
    S = models.buckets.DEFAULT_BUCKETS.prefix(1)  # a prefix of exactly one bucket: nothing to pad
    tokens = rng.integers(0, cfg.vocab, (1, S + 20))
    _, prefix = models.prefill(params, cfg, tokens[:, :S])
    want_logits, want_kv = models.prefill(params, cfg, tokens[:, S:], prefix)
    buf = host_padded(np.asarray(prefix[0]), 1, S)  # aligned, as a PE buffer is: the CPU would alias it
    assert buf.ctypes.data % HOST_ALIGN == 0
    lw, kvs = models.Layerwise(params, cfg, tokens[:, S:], prefix_len=[S]), []
    for layer in range(cfg.n_layers):
        buf[...] = prefix[layer]
        kvs.append(lw.layer(layer, buf))
        buf[...] = np.nan  # the caller's next use of its buffer
        assert not np.isnan(np.asarray(lw.held[-1])).any(), "the device array aliases the caller's buffer"
    np.testing.assert_allclose(np.asarray(lw.logits()), np.asarray(want_logits), **TOL)
    np.testing.assert_allclose(np.asarray(jnp.stack(kvs)), np.asarray(want_kv), **TOL)


def test_layerwise_takes_a_prefix_assembled_in_its_own_buffer_uncopied(tiny, rng):
    """A prefix the caller assembles in the pass's own buffer (`prefix_buffer`: several rows, earlier
    chunks) goes to the device as it is (on the CPU: aliased, no second host copy) and gives what
    a prefix handed over as any other array gives."""
    cfg, params = tiny
    tokens = rng.integers(0, cfg.vocab, (2, 40))
    prefix = rng.standard_normal((cfg.n_layers, 2, 70, 2, cfg.n_kv_heads, cfg.head_dim)).astype(np.float32)
    copied = models.Layerwise(params, cfg, tokens, prefix_len=[50, 70])
    want = [copied.layer_padded(layer, prefix[layer]) for layer in range(cfg.n_layers)]
    lw, got = models.Layerwise(params, cfg, tokens, prefix_len=[50, 70]), []
    for layer in range(cfg.n_layers):
        buf = lw.prefix_buffer()
        assert buf.shape == (2, lw.Sb, 2, cfg.n_kv_heads, cfg.head_dim) and not buf.any()
        buf[:, :70] = prefix[layer]
        got.append(lw.layer_padded(layer, buf))
        if jax.default_backend() == "cpu":
            assert lw.held[-1].unsafe_buffer_pointer() == buf.ctypes.data, "the pass copied its own buffer"
    np.testing.assert_array_equal(np.asarray(jnp.stack(got)), np.asarray(jnp.stack(want)))


def test_layerwise_compile_rest_leaves_the_pass_nothing_to_compile(tiny, rng, compile_log):
    """A warm-up compiles a pass's layers without running them; the pass then compiles nothing,
    and its results are those of a pass that compiled as it went."""
    cfg, params = tiny
    tokens = rng.integers(0, cfg.vocab, (2, 40))
    prefix = rng.standard_normal((cfg.n_layers, 2, 70, 2, cfg.n_kv_heads, cfg.head_dim)).astype(np.float32)
    jax.clear_caches()  # as a fresh process: earlier tests' programs would hide a compile
    warm = models.Layerwise(params, cfg, tokens, prefix_len=[50, 70])
    warm.compile_rest()
    before = len(compile_log)
    kvs = [warm.layer_padded(layer, prefix[layer]) for layer in range(cfg.n_layers)]
    logits = warm.logits_at(np.array([39, 20], np.int32))
    assert compile_log[:before] and compile_log[before:] == []
    cold = models.Layerwise(params, cfg, tokens, prefix_len=[50, 70])
    want = [cold.layer_padded(layer, prefix[layer]) for layer in range(cfg.n_layers)]
    np.testing.assert_array_equal(np.asarray(jnp.stack(kvs)), np.asarray(jnp.stack(want)))
    np.testing.assert_array_equal(np.asarray(logits), np.asarray(cold.logits_at(np.array([39, 20], np.int32))))


def test_layerwise_rejects_out_of_order_layers(tiny, rng):
    cfg, params = tiny
    lw = models.Layerwise(params, cfg, rng.integers(0, cfg.vocab, (1, 8)))
    with pytest.raises(models.InputError, match="expects layer 0"):
        lw.layer(1, np.zeros((1, 0, 2, cfg.n_kv_heads, cfg.head_dim), np.float32))
    with pytest.raises(models.InputError, match="after 0 of 2 layers"):
        lw.logits()


@pytest.mark.parametrize("kv_heads", [2, 4])  # on 4 devices: 2 kv heads are replicated, 4 are split
def test_sharded_four_devices_equals_single(tiny, rng, kv_heads):
    """Prefill over a cached prefix, then decode steps: params, activations and the decode cache
    sharded by their logical axes on a 4-device mesh give the single-device outputs."""
    if len(jax.devices()) < 4:  # CPU: conftest provides 4; one GPU does not
        pytest.skip(f"needs 4 devices, {jax.default_backend()} has {len(jax.devices())}")
    cfg = tiny[0].replace(n_kv_heads=kv_heads)
    params = tiny[1] if kv_heads == tiny[0].n_kv_heads else models.init_params(cfg, seed=0)
    tokens = rng.integers(0, cfg.vocab, (2, 48))
    _, prefix = models.prefill(params, cfg, tokens[:, :30])

    def run(params):
        logits, kv = models.prefill(params, cfg, tokens[:, 30:40], prefix)
        full = jnp.concatenate([prefix, kv], axis=2)
        cache = models.DecodeCache.create(cfg, slots=2, capacity=64)
        for b in range(2):
            cache = cache.insert(b, full[:, b])
        steps = []
        for t in range(40, 48):
            step_logits, cache = cache.step(params, tokens[:, t])
            steps.append(np.asarray(step_logits))
        return (np.asarray(logits), np.asarray(kv), np.stack(steps, axis=1)), cache, kv

    single, _, _ = run(params)
    mesh = models.make_mesh(jax.devices()[:4])
    with jax.set_mesh(mesh):
        sharded_params = models.shard_params(params, cfg, mesh)
        multi, cache, kv = run(sharded_params)
    assert sharded_params["layers"][0]["wq"].sharding.spec[1] == "tp"  # heads really split
    split = "tp" if kv_heads == 4 else None
    on_kv_heads = lambda x, dim: (tuple(x.sharding.spec) + (None,) * x.ndim)[dim]  # noqa: E731
    assert len(cache.kv.sharding.device_set) == 4 and on_kv_heads(cache.kv, 3) == split  # [L, 2, B, K, C, H]
    assert len(kv.sharding.device_set) == 4 and on_kv_heads(kv, 4) == split  # the new KV [L, B, T, 2, K, H]
    for a, b in zip(single, multi):
        np.testing.assert_allclose(a, b, **TOL)
    np.testing.assert_allclose(single[2], models.reference_logits(params, cfg, tokens)[:, 40:48], **TOL)


@pytest.mark.parametrize("name,count", [("llama3.2-1b", 1_235_814_400), ("qwen2.5-0.5b", 494_032_768),
                                        ("qwen2.5-7b", 7_615_616_512), ("qwen2.5-32b", 32_763_876_352)])
def test_real_presets_parameter_counts_by_eval_shape(name, count):
    cfg = models.get_config(name)
    shapes = jax.eval_shape(lambda: models.init_params(cfg))
    assert sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes)) == count == models.param_count(cfg)
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(shapes))


def _llama3_inv_freq(theta, H, factor, low, high, orig):
    """Llama 3 scaling written out frequency by frequency, as Hugging Face's `_compute_llama3_parameters`."""
    out = []
    for i in range(0, H, 2):
        f = 1.0 / theta ** (i / H)
        wavelen = 2 * np.pi / f
        if wavelen < orig / high:
            out.append(f)
        elif wavelen > orig / low:
            out.append(f / factor)
        else:
            smooth = (orig / wavelen - low) / (high - low)
            out.append((1 - smooth) * f / factor + smooth * f)
    return np.array(out, np.float32)


def test_rope_scaling_is_llama3_and_none_is_plain_rope():
    cfg = models.get_config("llama3.2-1b")
    s = cfg.rope_scaling
    want = _llama3_inv_freq(cfg.rope_theta, cfg.head_dim, s.factor, s.low_freq_factor, s.high_freq_factor,
                            s.original_max_position)
    np.testing.assert_allclose(rope_inv_freq(cfg), want, rtol=1e-6)
    plain = rope_inv_freq(cfg.replace(rope_scaling=None))
    np.testing.assert_allclose(plain, 1.0 / cfg.rope_theta ** (np.arange(0, 64, 2) / 64), rtol=1e-6)
    assert (rope_inv_freq(cfg) <= plain).all() and (rope_inv_freq(cfg) < plain).any()
    with pytest.raises(models.config.ModelConfigError, match="rope_scaling must be a RopeScaling"):
        cfg.replace(rope_scaling=(32.0, 1.0, 4.0, 8192))
    with pytest.raises(models.config.ModelConfigError, match="low_freq_factor < high_freq_factor"):
        models.RopeScaling(8.0, 4.0, 1.0, 8192)


def test_unknown_preset_lists_presets():
    with pytest.raises(KeyError, match="tiny"):
        models.get_config("gpt-5")


def test_bad_inputs_get_clear_errors(tiny):
    cfg, params = tiny
    with pytest.raises(models.InputError, match="outside the vocabulary"):
        models.prefill(params, cfg, np.array([[1, cfg.vocab]]))
    with pytest.raises(models.InputError, match="prefix_kv has shape"):
        models.prefill(params, cfg, np.array([[1, 2]]), np.zeros((2, 1, 4, 2, 3, 16), np.float32))
    with pytest.raises(models.InputError, match="dtype"):
        models.prefill(params, cfg, np.array([[1, 2]]), np.zeros((2, 1, 4, 2, 2, 16), np.int32))
    with pytest.raises(models.InputError, match="exceeds max_seq_len"):
        models.prefill(params, cfg, np.zeros((1, cfg.max_seq_len + 1), np.int32))
    with pytest.raises(models.InputError, match="integer array"):
        models.prefill(params, cfg, np.zeros((3,), np.float32))


def test_costs_are_consistent():
    cfg = models.get_config("qwen2.5-32b")
    assert models.kv_bytes_per_token(cfg) == 64 * 2 * 8 * 128 * 2
    # Linear FLOPs are 2 x the non-embedding params per token (norms and biases aside: < 1e-4).
    linear = models.prefill_flops(cfg, 1, 0) - 4 * cfg.n_layers * cfg.n_heads * cfg.head_dim
    assert abs(linear / (2 * (models.param_count(cfg) - cfg.vocab * cfg.d_model)) - 1) < 1e-4
    assert models.prefill_flops(cfg, 100, 1000) > models.prefill_flops(cfg, 100, 0)
    assert models.decode_flops(cfg, 1000) == models.prefill_flops(cfg, 1, 1000)


def test_random_weights_compile_nothing_and_depend_on_the_seed_alone(compile_log):
    """A preset's small tensors are drawn on the host (op by op, `jax.random` compiled a program per
    shape: most of a host's start-up), the same for the same seed and distributed as declared."""
    cfg = models.get_config("tiny").replace(d_model=48)  # shapes no other test has made
    a = models.init_params(cfg, seed=3)
    assert not [c for _, c in compile_log]
    b, c = models.init_params(cfg, seed=3), models.init_params(cfg, seed=4)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        assert x.dtype == cfg.jnp_dtype and np.array_equal(x, y)
    wq, wq4 = np.asarray(a["layers"][0]["wq"]), np.asarray(c["layers"][0]["wq"])
    assert not np.array_equal(wq, wq4)
    assert abs(wq.std() * np.sqrt(48) - 1) < 0.1  # N(0, 1/fan_in)
    assert np.all(np.asarray(a["layers"][0]["attn_norm"]) == 1)
    half = models.init_params(cfg.replace(dtype="bfloat16"), seed=3)["layers"][0]["wq"]  # cast on the host
    assert half.dtype == jnp.bfloat16 and np.array_equal(np.asarray(half), wq.astype(jnp.bfloat16))
    ds = models.resolve_model("deepseek-tiny").config
    layers = models.init_params(ds, 0)["layers"]
    up = np.asarray(next(lp["e_up"] for lp in layers if "e_up" in lp))  # "expert": fan-in is the middle dim
    assert up.dtype == ds.jnp_dtype and abs(up.std() * np.sqrt(up.shape[1]) - 1) < 0.1
