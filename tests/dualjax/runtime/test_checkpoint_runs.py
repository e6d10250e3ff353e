"""Real weights through the runtime: `--model DIR` runs a checkpoint directory (Hugging Face or Orbax)
with the tokens its weights give, and the store's fingerprint identifies the weights, so KV written
under one checkpoint is never served to another of the same shape."""

import hashlib
import json
import os
import re
import shutil

import jax
import numpy as np
import pytest
from safetensors.numpy import save_file

import models
from dualjax.cli.main import main as cli
from dualjax.core.config import ClusterSpec, RunConfig
from dualjax.runtime.store import open_store
from dualjax.runtime.verify import tokens_of
from kvstore import FingerprintMismatch
from models.deepseek.hf import hf_config_dict, to_hf
from models.source import file_sha256
from tests.models.test_checkpoint import _write_hf

RUN = ["run", "--embedded", "--quiet", "--agents", "2", "--turns", "2"]


def _hf(path, params, cfg, **kw):
    path.mkdir()
    _write_hf(path, cfg, params, "LlamaForCausalLM", **kw)
    return str(path)


def _run(tmp_path, model, name, store=None) -> tuple[int, str]:
    out = tmp_path / name
    rc = cli([*RUN, "--model", model, "--out", str(out), "--store", str(store or out / "store")])
    return rc, str(out)


@pytest.fixture(scope="module")
def preset_tokens(tmp_path_factory):
    rc, out = _run(tmp_path_factory.mktemp("preset"), "tiny", "tiny")
    assert rc == 0
    return tokens_of(out)


@pytest.mark.parametrize("kind", ["orbax", "hf"])
def test_checkpoint_gives_preset_tokens(tiny, tmp_path, preset_tokens, kind):
    """A checkpoint of the preset weights gives the preset tokens."""
    cfg, params = tiny  # the tiny preset's random weights (seed 0), written as a checkpoint
    if kind == "orbax":
        models.save_checkpoint(str(tmp_path / "ckpt"), params, cfg)
        ckpt = str(tmp_path / "ckpt")
    else:
        ckpt = _hf(tmp_path / "ckpt", params, cfg)
    source = models.resolve_model(ckpt)
    assert (source.kind, source.weights[:7]) == (kind, "sha256:")
    rc, out = _run(tmp_path, ckpt, "run")  # its own store: the fingerprint differs from the preset's
    assert rc == 0
    assert tokens_of(out) == preset_tokens


def test_store_refuses_other_checkpoint(tiny, tmp_path, capsys):
    """A second checkpoint of the same shape is refused by the first one's store."""
    cfg, _ = tiny
    base = _hf(tmp_path / "base", models.init_params(cfg, 1), cfg)
    tuned = _hf(tmp_path / "tuned", models.init_params(cfg, 2), cfg)
    ids = [models.resolve_model(p).weights for p in (base, tuned)]
    assert ids[0] != ids[1]
    store = tmp_path / "store"
    assert _run(tmp_path, base, "base-run", store)[0] == 0
    capsys.readouterr()
    rc, out = _run(tmp_path, tuned, "tuned-run", store)
    err = capsys.readouterr().err
    assert rc == 2
    assert ids[0] in err and ids[1] in err and tuned in err  # both identities, and this run's path
    assert not os.path.exists(os.path.join(out, "requests.parquet"))  # nothing was served


def test_store_refuses_other_format(tmp_path):
    """A store of another cache format or seed is refused, naming both."""
    cfg = RunConfig(ClusterSpec(1, 1), model="tiny", out=str(tmp_path / "out"))
    open_store(cfg)
    with pytest.raises(FingerprintMismatch) as e:
        open_store(cfg.replace(model="deepseek-tiny"))
    ds = models.resolve_model("deepseek-tiny").config
    assert "gqa:2x2x16:float32 model=tiny" in str(e.value) and f"{ds.kv_format} model=deepseek-tiny" in str(e.value)
    with pytest.raises(FingerprintMismatch, match=r"weights=random-v2:0 .*weights=random-v2:7 .*tiny \(random-v2:7\)"):
        open_store(cfg.replace(param_seed=7))


def test_identity_is_contents(tiny, tmp_path):
    """A checkpoint's identity is its contents, not its place."""
    cfg, params = tiny
    a = _hf(tmp_path / "a", params, cfg)
    copy = shutil.copytree(a, tmp_path / "elsewhere" / "a")
    assert models.resolve_model(str(copy)).weights == models.resolve_model(a).weights
    changed = {"model.norm.weight": np.asarray(params["final_norm"], np.float32) + 1}
    b = _hf(tmp_path / "b", params, cfg, shards=1, extra=changed)
    b2 = _hf(tmp_path / "b2", params, cfg, shards=1)
    assert models.resolve_model(b).weights != models.resolve_model(b2).weights


def test_hub_cache_named_by_blob(tmp_path):
    """A file linked into a hub cache is named by its blob."""
    data = tmp_path / "data"
    data.write_bytes(b"weights")
    digest = file_sha256(str(data))
    blob = tmp_path / "blobs" / digest
    blob.parent.mkdir()
    shutil.move(data, blob)
    os.symlink(blob, tmp_path / "model.safetensors")
    assert file_sha256(str(tmp_path / "model.safetensors")) == digest


def test_local_dir_named_by_etag(tmp_path):
    """A `--local-dir` download is named by its recorded ETag until the file changes."""
    data = tmp_path / "model.safetensors"
    data.write_bytes(b"weights")
    meta = tmp_path / ".cache" / "huggingface" / "download" / "model.safetensors.metadata"
    meta.parent.mkdir(parents=True)
    meta.write_text(f"{'c' * 40}\n{'e' * 64}\n{os.stat(data).st_mtime + 0.5}\n")
    assert file_sha256(str(data)) == "e" * 64
    os.utime(data, (os.stat(data).st_atime, os.stat(data).st_mtime + 10))  # edited after the download
    assert file_sha256(str(data)) == hashlib.sha256(b"weights").hexdigest()


@pytest.mark.parametrize("kind", ["orbax", "hf", "preset"])
def test_host_weights_sharded(tiny, tmp_path, kind):
    """Each host loads its weights sharded over its mesh."""
    cfg, params = tiny
    ref = {"preset": "tiny", "hf": None, "orbax": str(tmp_path / "o")}[kind]
    if kind == "orbax":
        models.save_checkpoint(ref, params, cfg)
    elif kind == "hf":
        ref = _hf(tmp_path / "h", params, cfg)
    mesh = models.make_mesh()
    sharded = models.resolve_model(ref).load_params(mesh)
    assert {d for x in jax.tree.leaves(sharded) for d in x.devices()} == set(mesh.devices.flat)
    for got, want in zip(jax.tree.leaves(sharded), jax.tree.leaves(params), strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


@pytest.mark.parametrize("change,message", [
    ("missing", r"missing tensor model\.layers\.1\.mlp\.up_proj\.weight"),
    ("shape", r"tensor model\.layers\.0\.self_attn\.k_proj\.weight has shape"),
    ("extra", r"unexpected tensors \['model\.layers\.0\.extra\.weight'\]"),
    ("rope", r"rope_scaling\.rope_type 'linear'"),
    ("field", r"lacks the field 'vocab_size'"),
    ("act", r"hidden_act='gelu' is not implemented"),
    ("window", r"use_sliding_window=True is not implemented"),
    ("layers", r"layer_types=\['full_attention', 'sliding_attention'\] is not implemented"),
])
def test_bad_checkpoint_named(tiny, tmp_path, capsys, change, message):
    """A bad checkpoint ends the run, naming the tensor or field."""
    cfg, params = tiny
    kw = {"missing": dict(drop="model.layers.1.mlp.up_proj.weight"),
          "shape": dict(reshape="model.layers.0.self_attn.k_proj.weight"),
          "extra": dict(extra={"model.layers.0.extra.weight": np.zeros(3, np.float32)}),
          "rope": dict(config={"rope_scaling": {"rope_type": "linear", "factor": 2.0}}),
          "field": dict(config={"vocab_size": None}), "act": dict(config={"hidden_act": "gelu"}),
          "window": dict(config={"use_sliding_window": True, "sliding_window": 8}),
          "layers": dict(config={"layer_types": ["full_attention", "sliding_attention"]})}[change]
    ckpt = _hf(tmp_path / "ckpt", params, cfg, **kw)
    rc, _ = _run(tmp_path, ckpt, "run")
    assert rc == 2
    assert re.search(message, capsys.readouterr().err)


def test_unimplemented_deepseek_field(tmp_path, capsys):
    """A DeepSeek config field it does not implement is named."""
    cfg = models.resolve_model("deepseek-tiny").config
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "config.json").write_text(json.dumps(hf_config_dict(cfg) | {"hidden_act": "gelu"}))
    assert cli([*RUN, "--model", str(tmp_path / "ds"), "--out", str(tmp_path / "run")]) == 2
    assert "unsupported hidden_act='gelu'" in capsys.readouterr().err


def test_unknown_model_lists_presets(tmp_path, capsys):
    """A model that is neither a preset nor a checkpoint: the error lists the presets."""
    assert cli([*RUN, "--model", str(tmp_path / "nowhere"), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "nowhere" in err and "tiny" in err and "deepseek-tiny" in err
    (tmp_path / "empty").mkdir()
    assert cli([*RUN, "--model", str(tmp_path / "empty"), "--out", str(tmp_path / "run")]) == 2
    assert "without config.json" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["orbax", "hf"])
def test_deepseek_checkpoint_resolves(tmp_path, kind):
    """A DeepSeek checkpoint resolves to the config and weights it holds."""
    cfg = models.resolve_model("deepseek-tiny").config
    params = models.resolve_model("deepseek-tiny", seed=3).load_params()
    ckpt = tmp_path / "ckpt"
    if kind == "orbax":
        models.save_checkpoint(str(ckpt), params, cfg)
    else:
        ckpt.mkdir()
        save_file(to_hf(params, cfg), str(ckpt / "model.safetensors"))
        (ckpt / "config.json").write_text(json.dumps(hf_config_dict(cfg)))
    source = models.resolve_model(str(ckpt))
    assert source.config == cfg and source.config.name == (cfg.name if kind == "orbax" else "ckpt")
    for got, want in zip(jax.tree.leaves(source.load_params()), jax.tree.leaves(params), strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


@pytest.mark.slow
def test_mpiexec_checkpoint_tokens(tiny, tmp_path, preset_tokens):
    """Every mpiexec rank runs the checkpoint with the preset tokens."""
    cfg, params = tiny
    ckpt = _hf(tmp_path / "ckpt", params, cfg)
    rc = cli(["run", "--quiet", "--agents", "2", "--turns", "2", "--model", ckpt, "--out", str(tmp_path / "mpi")])
    assert rc == 0
    assert tokens_of(str(tmp_path / "mpi")) == preset_tokens


@pytest.mark.slow
def test_deepseek_checkpoint_tokens(tmp_path):
    """A DeepSeek checkpoint runs with the tokens of its preset."""
    source = models.resolve_model("deepseek-tiny")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    save_file(to_hf(source.load_params(), source.config), str(ckpt / "model.safetensors"))
    (ckpt / "config.json").write_text(json.dumps(hf_config_dict(source.config)))
    assert _run(tmp_path, "deepseek-tiny", "preset")[0] == 0
    assert _run(tmp_path, str(ckpt), "ckpt")[0] == 0
    assert tokens_of(str(tmp_path / "ckpt")) == tokens_of(str(tmp_path / "preset"))
