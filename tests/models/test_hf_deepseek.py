"""Hugging Face DeepSeek-V3/V3.2 import: checkpoints written here (per-expert or fused experts, sharded,
both RoPE config layouts, both RoPE column layouts, V3 without indexer) load to the same logits; bad
checkpoints are refused by name; with `transformers` installed its own model gives the same logits."""

import json

import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import save_file

import models
from models.deepseek.config import PRESETS
from models.deepseek.hf import _rope_perm, hf_config_dict, to_hf
from models.hf import HFImportError

TOL = dict(rtol=2e-5, atol=2e-5)


@pytest.fixture(scope="module")
def model():
    cfg = PRESETS["deepseek-tiny"]
    params = models.init_params(cfg, seed=3)
    # Positive correction bias: transformers masks unchosen groups with 0, DeepSeek's reference with -inf;
    # they agree when every biased score is positive (as in the published checkpoints).
    layers = [{k: (jnp.abs(v) if k == "router_bias" else v) for k, v in lp.items()} for lp in params["layers"]]
    params = {**params, "layers": layers}
    tokens = np.random.default_rng(0).integers(0, cfg.vocab, (2, 60))  # > index_topk: sparse
    return cfg, params, tokens, np.asarray(models.prefill(params, cfg, tokens)[0])


def write(path, hf: dict, tensors: dict, shards: int = 1):
    path.mkdir(exist_ok=True)
    (path / "config.json").write_text(json.dumps(hf))
    names = sorted(tensors)
    for s in range(shards):
        name = "model.safetensors" if shards == 1 else f"model-{s:05d}-of-{shards:05d}.safetensors"
        save_file({k: tensors[k] for k in names[s::shards]}, str(path / name))
    return str(path)


@pytest.mark.parametrize("fused,rope_parameters,shards", [(False, False, 1), (True, True, 3)])
def test_round_trip_gives_the_same_logits(tmp_path, model, fused, rope_parameters, shards):
    cfg, params, tokens, logits = model
    path = write(tmp_path / "ckpt", hf_config_dict(cfg, rope_parameters), to_hf(params, cfg, fused), shards)
    loaded_cfg, loaded = models.load_hf(path)
    assert loaded_cfg.replace(name=cfg.name) == cfg
    np.testing.assert_allclose(np.asarray(models.prefill(loaded, loaded_cfg, tokens)[0]), logits, **TOL)


def test_half_split_rope_columns_are_permuted(tmp_path, model):
    cfg, params, tokens, logits = model
    tensors = to_hf(params, cfg)
    Dn, Dr, R = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.kv_lora_rank
    inv = np.argsort(_rope_perm(Dr))
    for i in range(cfg.n_layers):
        a = f"model.layers.{i}.self_attn."
        q = tensors[a + "q_b_proj.weight"].reshape(cfg.n_heads, Dn + Dr, -1)
        tensors[a + "q_b_proj.weight"] = np.concatenate([q[:, :Dn], q[:, Dn:][:, inv]], 1).reshape(-1, q.shape[-1])
        kv = tensors[a + "kv_a_proj_with_mqa.weight"]
        tensors[a + "kv_a_proj_with_mqa.weight"] = np.concatenate([kv[:R], kv[R:][inv]])
    path = write(tmp_path / "ckpt", hf_config_dict(cfg) | {"rope_interleave": False}, tensors)
    loaded_cfg, loaded = models.load_hf(path)
    np.testing.assert_allclose(np.asarray(models.prefill(loaded, loaded_cfg, tokens)[0]), logits, **TOL)


def test_v3_checkpoint_without_indexer_is_dense_attention(tmp_path, model):
    cfg, params, tokens, _ = model
    tensors = {k: v for k, v in to_hf(params, cfg).items() if ".indexer." not in k}
    tensors["model.layers.3.mtp_head.weight"] = np.zeros(4, np.float32)  # the MTP layer: skipped
    hf = hf_config_dict(cfg) | {"model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"]}
    loaded_cfg, loaded = models.load_hf(write(tmp_path / "ckpt", hf, tensors))
    assert loaded_cfg.index_topk == cfg.max_seq_len
    dense = np.asarray(models.prefill(params, cfg.replace(index_topk=cfg.max_seq_len), tokens)[0])
    np.testing.assert_allclose(np.asarray(models.prefill(loaded, loaded_cfg, tokens)[0]), dense, **TOL)


@pytest.mark.parametrize("change,message", [
    ("missing", "missing tensor model.layers.1.mlp.gate.e_score_correction_bias"),
    ("extra", r"unexpected tensors \['model.layers.0.self_attn.extra.weight'\]"),
    ("shape", "tensor model.norm.weight has shape"),
    ("act", "unsupported hidden_act='gelu'"),
    ("rope", "unsupported rope type 'linear'"),
    ("fp8", "quantization_config"),
])
def test_bad_checkpoints_are_refused_by_name(tmp_path, model, change, message):
    cfg, params, _, _ = model
    hf, tensors = hf_config_dict(cfg), to_hf(params, cfg)
    if change == "missing":
        del tensors["model.layers.1.mlp.gate.e_score_correction_bias"]
    elif change == "extra":
        tensors["model.layers.0.self_attn.extra.weight"] = np.zeros(3, np.float32)
    elif change == "shape":
        tensors["model.norm.weight"] = np.zeros(cfg.d_model + 1, np.float32)
    elif change == "act":
        hf["hidden_act"] = "gelu"
    elif change == "rope":
        hf["rope_scaling"] = {"rope_type": "linear", "factor": 2.0}
    else:
        hf["quantization_config"] = {"quant_method": "fp8"}
    with pytest.raises(HFImportError, match=message):
        models.load_hf(write(tmp_path / "ckpt", hf, tensors))


@pytest.mark.parametrize("fused", [False, True])
def test_logits_match_transformers(tmp_path, fused):
    """Sparse selection included. Indexer scores are sums of ReLUs, so a random model has exact ties at 0
    that torch.topk and lax.top_k break differently; 16 indexer heads with positive head weights make
    every score positive and the ranking unambiguous."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = PRESETS["deepseek-tiny"].replace(index_n_heads=16)
    params = models.init_params(cfg, seed=4)
    fix = {"router_bias": jnp.abs, "idx_w": jnp.abs}
    params = {**params, "layers": [{k: fix.get(k, lambda v: v)(v) for k, v in lp.items()} for lp in params["layers"]]}
    tokens = np.random.default_rng(1).integers(0, cfg.vocab, (2, 60))
    path = write(tmp_path / "ckpt", hf_config_dict(cfg, rope_parameters=True), to_hf(params, cfg, fused))
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
    with torch.no_grad():
        want = hf(torch.as_tensor(tokens)).logits.numpy()
    got = np.asarray(models.prefill(params, cfg, tokens)[0])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
