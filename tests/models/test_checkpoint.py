"""Checkpoints: Orbax round trip and Hugging Face import from files the test writes itself."""

import dataclasses
import json
import os
import shutil

import jax
import numpy as np
import pytest
from safetensors.numpy import save_file

import models
from models.dense.hf import export_hf
from models.hf import hf_config


def _hf_tensors(cfg, params):
    """The params of `cfg` in Hugging Face names and layouts."""
    g = lambda x: np.asarray(x, np.float32)  # noqa: E731
    out = {"model.embed_tokens.weight": g(params["embed"]), "model.norm.weight": g(params["final_norm"])}
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = g(params["lm_head"]).T.copy()
    for i, lp in enumerate(params["layers"]):
        p, a, m = f"model.layers.{i}.", f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
        out[p + "input_layernorm.weight"] = g(lp["attn_norm"])
        out[p + "post_attention_layernorm.weight"] = g(lp["mlp_norm"])
        for x in "qkv":
            w = g(lp["w" + x])
            out[a + f"{x}_proj.weight"] = w.reshape(w.shape[0], -1).T.copy()
            if cfg.qkv_bias:
                out[a + f"{x}_proj.bias"] = g(lp["b" + x]).reshape(-1)
        out[a + "o_proj.weight"] = g(lp["wo"]).reshape(-1, cfg.d_model).T.copy()
        out[m + "gate_proj.weight"] = g(lp["w_gate"]).T.copy()
        out[m + "up_proj.weight"] = g(lp["w_up"]).T.copy()
        out[m + "down_proj.weight"] = g(lp["w_down"]).T.copy()
    return out


def _write_hf(path, cfg, params, arch, shards=2, drop=None, reshape=None, config=None, extra=None):
    """A Hugging Face checkpoint directory of `params`; `config` entries replace config.json's (None: drop)."""
    tensors = {**_hf_tensors(cfg, params), **(extra or {})}
    if drop:
        del tensors[drop]
    if reshape:
        tensors[reshape] = tensors[reshape][:-1]
    names = sorted(tensors)
    if shards == 1:
        save_file(tensors, str(path / "model.safetensors"))
    else:  # as Hugging Face shards: numbered files and an index of which holds what
        weight_map = {}
        for s in range(shards):
            file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
            save_file({k: tensors[k] for k in names[s::shards]}, str(path / file))
            weight_map.update({k: file for k in names[s::shards]})
        (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    model_type = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2"}.get(arch, "unknown")
    hf = {"architectures": [arch], "model_type": model_type, "vocab_size": cfg.vocab, "hidden_size": cfg.d_model,
          "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
          "num_key_value_heads": cfg.n_kv_heads, "intermediate_size": cfg.ffw,
          "max_position_embeddings": cfg.max_seq_len, "rope_theta": cfg.rope_theta, "rms_norm_eps": cfg.norm_eps,
          "tie_word_embeddings": cfg.tie_embeddings, "torch_dtype": "float32"}
    hf = {k: v for k, v in {**hf, **(config or {})}.items() if v is not None}
    (path / "config.json").write_text(json.dumps(hf))


def test_orbax_round_trip_is_exact(tiny, tmp_path):
    cfg, params = tiny
    models.save_checkpoint(str(tmp_path / "ckpt"), params, cfg)
    cfg2, restored = models.restore_checkpoint(str(tmp_path / "ckpt"))
    assert cfg2 == cfg
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(restored)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_orbax_round_trip_keeps_rope_scaling(tmp_path):
    cfg = models.get_config("tiny", rope_theta=5e5, rope_scaling=models.RopeScaling(8.0, 1.0, 4.0, 64))
    models.save_checkpoint(str(tmp_path / "ckpt"), models.init_params(cfg), cfg)
    stored = json.loads((tmp_path / "ckpt" / "model_config.json").read_text())
    assert stored["rope_scaling"] == {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                      "original_max_position": 64}
    assert models.restore_checkpoint(str(tmp_path / "ckpt"))[0] == cfg
    # A checkpoint written before RopeScaling held a 4-list with factor 0 for "off".
    for old, want in (([0.0, 0.0, 0.0, 0], None), ([8.0, 1.0, 4.0, 64], cfg.rope_scaling)):
        (tmp_path / "ckpt" / "model_config.json").write_text(json.dumps({**stored, "rope_scaling": old}))
        assert models.restore_checkpoint(str(tmp_path / "ckpt"))[0].rope_scaling == want


@pytest.mark.parametrize("change,message", [
    ({"ffw": 256}, r"tensor \['layers'\]\[0\]\['w_down'\] has shape \(128, 64\), expected \(256, 64\)"),
    ({"n_layers": 3}, r"missing tensor \['layers'\]\[2\]\['attn_norm'\]"),
    ({"n_layers": 1}, r"unexpected tensors \[\"\['layers'\]\[1\]"),
])
def test_orbax_restore_names_missing_extra_and_misshaped_tensors(tiny, tmp_path, change, message):
    cfg, params = tiny
    models.save_checkpoint(str(tmp_path / "ckpt"), params, cfg)
    config = tmp_path / "ckpt" / "model_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), **change}))
    with pytest.raises(models.CheckpointError, match=message):
        models.restore_checkpoint(str(tmp_path / "ckpt"))


@pytest.fixture(scope="module")
def saved(tiny, tmp_path_factory):
    path = tmp_path_factory.mktemp("saved") / "ckpt"
    models.save_checkpoint(str(path), tiny[1], tiny[0])
    return path


def test_model_config_records_the_family_and_loading_follows_it(tiny, saved, tmp_path):
    """The recorded family picks the config type; a file without one (written before families were recorded)
    falls back to the type whose fields it shares most."""
    ckpt = shutil.copytree(saved, tmp_path / "ckpt")
    config = ckpt / "model_config.json"
    stored = json.loads(config.read_text())
    assert stored["family"] == "dense" and {k: v for k, v in stored.items() if k != "family"} == json.loads(
        json.dumps(dataclasses.asdict(tiny[0])))
    config.write_text(json.dumps({k: v for k, v in stored.items() if k != "family"}))
    assert models.read_config(str(ckpt)) == tiny[0]  # the fallback: the fields are the dense ones
    config.write_text(json.dumps({**stored, "family": "deepseek"}))  # the record wins over the fields' overlap
    with pytest.raises(models.CheckpointError, match=r"model_config\.json: .*DeepSeekConfig.*unexpected keyword"):
        models.read_config(str(ckpt))
    config.write_text(json.dumps({**stored, "family": "gpt"}))
    with pytest.raises(models.CheckpointError, match=r"unknown model family 'gpt'; families: dense, deepseek"):
        models.read_config(str(ckpt))


@pytest.mark.parametrize("removed,named", [
    ("params/d", "missing or empty params/d/"),
    ("params/ocdbt.process_0/d", "missing or empty params/ocdbt.process_0/d/"),
    ("params/ocdbt.process_0/manifest.ocdbt", "missing or empty params/ocdbt.process_0/manifest.ocdbt"),
    ("params/_METADATA", "missing or empty params/_METADATA"), ("params", "no params/ directory"),
])
def test_a_missing_file_is_named_when_the_checkpoint_is_opened(saved, tmp_path, removed, named):
    """What was deleted from the params is named in one line when the checkpoint is opened, before Orbax reads."""
    ckpt = shutil.copytree(saved, tmp_path / "ckpt")
    (shutil.rmtree if (ckpt / removed).is_dir() else os.remove)(ckpt / removed)
    for opened in (models.read_config, models.restore_checkpoint, models.resolve_model):
        with pytest.raises(models.CheckpointError) as e:
            opened(str(ckpt))
        assert str(e.value).startswith(f"damaged checkpoint {ckpt}: {named}") and "\n" not in str(e.value)


@pytest.mark.parametrize("damage", ["delete", "truncate"])
def test_an_unreadable_array_file_is_named_when_restored(tiny, saved, tmp_path, damage):
    """A data file deleted or cut short: the restore names the checkpoint and the array it could not read."""
    ckpt = shutil.copytree(saved, tmp_path / "ckpt")
    data = ckpt / "params" / "ocdbt.process_0" / "d"
    largest = max(data.iterdir(), key=lambda f: f.stat().st_size)
    os.remove(largest) if damage == "delete" else os.truncate(largest, 100)
    assert models.read_config(str(ckpt)) == tiny[0]  # every file the listing check asks for is there
    with pytest.raises(models.CheckpointError) as e:
        models.restore_checkpoint(str(ckpt))
    message = str(e.value)
    assert message.startswith(f"damaged checkpoint {ckpt}: its params cannot be read: ") and "\n" not in message
    assert "Error reading" in message and str(ckpt / "params") in message


@pytest.mark.parametrize("bias,tied,rope", [(False, False, None), (True, True, models.RopeScaling(8.0, 1.0, 4.0, 64))])
def test_dense_export_writes_what_the_tests_own_writer_does(tmp_path, bias, tied, rope):
    """`models.dense.hf.export_hf` gives the tensors of this file's own Hugging Face writer, bit for bit, and a
    config.json that maps back to the config."""
    cfg = models.get_config("tiny", qkv_bias=bias, tie_embeddings=tied, rope_theta=5e5, rope_scaling=rope)
    params = models.init_params(cfg, seed=4)
    hf, tensors = export_hf(params, cfg)
    want = _hf_tensors(cfg, params)
    assert sorted(tensors) == sorted(want)
    for name in want:
        np.testing.assert_array_equal(tensors[name], want[name])
    assert hf["architectures"] == ["Qwen2ForCausalLM" if bias else "LlamaForCausalLM"]
    assert hf_config(hf, cfg.name) == cfg


@pytest.mark.parametrize("arch,bias,tied", [("LlamaForCausalLM", False, False), ("Qwen2ForCausalLM", True, True)])
def test_load_hf_gives_the_same_logits(tmp_path, rng, arch, bias, tied):
    cfg = models.get_config("tiny", qkv_bias=bias, tie_embeddings=tied, rope_theta=1e6)
    params = models.init_params(cfg, seed=3)
    if bias:  # non-zero biases so the mapping is really exercised
        for lp in params["layers"]:
            for x in "qkv":
                lp["b" + x] = lp["b" + x] + 0.1 * rng.standard_normal(lp["b" + x].shape).astype(np.float32)
    _write_hf(tmp_path, cfg, params, arch)
    cfg2, loaded = models.load_hf(str(tmp_path))
    assert (cfg2.qkv_bias, cfg2.tie_embeddings, cfg2.n_kv_heads) == (bias, tied, cfg.n_kv_heads)
    tokens = rng.integers(0, cfg.vocab, (1, 20))
    np.testing.assert_array_equal(models.reference_logits(loaded, cfg2, tokens),
                                  models.reference_logits(params, cfg, tokens))


def test_load_hf_names_missing_misshaped_and_extra_tensors(tiny, tmp_path):
    cfg, params = tiny
    (tmp_path / "a").mkdir()
    _write_hf(tmp_path / "a", cfg, params, "LlamaForCausalLM", drop="model.layers.1.mlp.up_proj.weight")
    with pytest.raises(models.CheckpointError, match=r"missing tensor model\.layers\.1\.mlp\.up_proj\.weight"):
        models.load_hf(str(tmp_path / "a"))
    (tmp_path / "b").mkdir()
    _write_hf(tmp_path / "b", cfg, params, "LlamaForCausalLM", reshape="model.layers.0.self_attn.k_proj.weight")
    with pytest.raises(models.CheckpointError, match=r"model\.layers\.0\.self_attn\.k_proj\.weight has shape"):
        models.load_hf(str(tmp_path / "b"))
    with pytest.raises(models.CheckpointError, match="no config.json"):
        models.load_hf(str(tmp_path / "nowhere"))
    (tmp_path / "c").mkdir()  # a tensor of a third layer in a two-layer checkpoint
    _write_hf(tmp_path / "c", cfg, params, "LlamaForCausalLM", extra={"model.layers.2.mlp.up_proj.weight": np.ones(3)})
    with pytest.raises(models.CheckpointError, match=r"unexpected tensors \['model\.layers\.2\.mlp\.up_proj\."):
        models.load_hf(str(tmp_path / "c"))
    (tmp_path / "d").mkdir()  # RoPE buffers older transformers saved are not an error
    rope_buffer = {"model.layers.0.self_attn.rotary_emb.inv_freq": np.ones(cfg.head_dim // 2, np.float32)}
    _write_hf(tmp_path / "d", cfg, params, "LlamaForCausalLM", extra=rope_buffer)
    assert models.load_hf(str(tmp_path / "d"))[0].n_layers == cfg.n_layers


def test_load_hf_matches_transformers_when_installed(tmp_path, rng):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = models.get_config("tiny", qkv_bias=True, rope_theta=1e6)
    params = models.init_params(cfg, seed=5)
    _write_hf(tmp_path, cfg, params, "Qwen2ForCausalLM", shards=1)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), torch_dtype=torch.float32)
    tokens = rng.integers(0, cfg.vocab, (1, 16))
    want = hf(torch.tensor(tokens)).logits.detach().numpy()
    cfg2, loaded = models.load_hf(str(tmp_path))
    np.testing.assert_allclose(models.reference_logits(loaded, cfg2, tokens), want, rtol=1e-4, atol=1e-4)


def _transformers_logits(path, tokens):
    """Logits of `transformers`' own model of the checkpoint at `path`, or None when it is not installed."""
    try:
        import torch
        import transformers
    except ImportError:
        return None
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    with torch.no_grad():
        return hf(torch.tensor(tokens)).logits.numpy()


LLAMA3 = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}


@pytest.mark.parametrize("scaling", [None, LLAMA3], ids=["default", "llama3"])
def test_load_hf_reads_theta_from_rope_parameters(tmp_path, rng, scaling):
    """transformers 5.x layout: theta (and Llama 3 scaling) only in `rope_parameters`."""
    rope = models.RopeScaling(8.0, 1.0, 4.0, 64) if scaling else None
    cfg = models.get_config("tiny", rope_theta=500000.0, rope_scaling=rope)
    params = models.init_params(cfg, seed=7)
    parameters = {"rope_theta": 500000.0, "rope_type": "llama3" if scaling else "default", **(scaling or {})}
    _write_hf(tmp_path, cfg, params, "LlamaForCausalLM", shards=1,
              config={"rope_theta": None, "rope_parameters": parameters})
    cfg2, loaded = models.load_hf(str(tmp_path))
    assert (cfg2.rope_theta, cfg2.rope_scaling) == (500000.0, rope)
    tokens = rng.integers(0, cfg.vocab, (1, 100))
    got = models.reference_logits(loaded, cfg2, tokens)
    np.testing.assert_array_equal(got, models.reference_logits(params, cfg, tokens))
    default_theta = models.reference_logits(params, cfg.replace(rope_theta=10000.0, rope_scaling=None), tokens)
    assert np.abs(got - default_theta).max() > 1e-3  # theta really changes the logits: the check has teeth
    want = _transformers_logits(tmp_path, tokens)
    if want is not None:
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("config,field", [
    ({"rope_parameters": {"rope_theta": 1e4, "rope_type": "yarn", "factor": 4.0}},
     r"rope_parameters\.rope_type 'yarn'"),
    ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, r"rope_scaling\.rope_type 'dynamic'"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 2.0}}, "lacks 'low_freq_factor'"),
    ({"torch_dtype": "float8_e4m3fn"}, "dtype 'float8_e4m3fn'"),
])
def test_load_hf_refuses_what_it_does_not_implement_naming_it(tiny, tmp_path, config, field):
    cfg, params = tiny
    _write_hf(tmp_path, cfg, params, "LlamaForCausalLM", shards=1, config=config)
    with pytest.raises(models.CheckpointError, match=field):
        models.load_hf(str(tmp_path))
