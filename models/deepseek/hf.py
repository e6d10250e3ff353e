"""Hugging Face import (and export) of DeepSeek-V3 / V3.2 checkpoints: `config.json` + safetensors.

Reads `deepseek_v3` and `deepseek_v32` checkpoints from a local directory (never the network):
one or several `*.safetensors` files; RoPE settings in either config layout (`rope_theta` +
`rope_scaling`, or one `rope_parameters` dict); query/key RoPE columns interleaved (DeepSeek's
published layout, `rope_interleave` true) or half-split (`rope_interleave` false, permuted here);
routed experts one tensor set per expert (`mlp.experts.{j}.gate_proj.weight`, ...) or fused as current
`transformers` writes them (`mlp.experts.gate_up_proj` [E, 2 Fe, D], `mlp.experts.down_proj` [E, D, Fe]).
The multi-token-prediction layer (`model.layers.{L}.*`) of published checkpoints is skipped.

A `deepseek_v3` checkpoint has no indexer: it runs as DSA with `index_topk = max_seq_len` (every
position selected: dense attention) and a zero indexer of one head of Dr dims.
Anything not implemented (FP8 weights, other activations, scoring functions or RoPE types) is
refused naming the config field; missing, extra or misshaped tensors are named.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np

from models.deepseek.config import DeepSeekConfig
from models.deepseek.model import declare
from models.hf import HFImportError, open_tensors, read_tensor, refuse_extra
from models.params import Params, is_decl

MODEL_TYPES = ("deepseek_v3", "deepseek_v32")


def _refuse(hf: dict, field: str, ok) -> None:
    if field in hf and hf[field] is not None and not ok(hf[field]):
        raise HFImportError(f"config.json: unsupported {field}={hf[field]!r}")


def _rope(hf: dict) -> dict:
    """DeepSeekConfig RoPE fields from either config layout."""
    params = dict(hf.get("rope_parameters") or {})
    scaling = params or dict(hf.get("rope_scaling") or {})
    theta = float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind not in ("default", "yarn"):
        raise HFImportError(f"config.json: unsupported rope type {kind!r} (rope_scaling/rope_parameters); "
                            "implemented: default, yarn")
    if kind == "default":
        return dict(rope_theta=theta)
    return dict(rope_theta=theta, rope_factor=float(scaling["factor"]),
                rope_original_max=int(scaling.get("original_max_position_embeddings", 4096)),
                beta_fast=float(scaling.get("beta_fast", 32)), beta_slow=float(scaling.get("beta_slow", 1)),
                mscale=float(scaling.get("mscale", 1.0)), mscale_all_dim=float(scaling.get("mscale_all_dim", 0.0)))


def hf_config(hf: dict, name: str = "hf") -> DeepSeekConfig:
    """Map a DeepSeek-V3/V3.2 `config.json` dict to a DeepSeekConfig; raises HFImportError naming the field."""
    kind = hf.get("model_type")
    if kind not in MODEL_TYPES:
        raise HFImportError(f"config.json: model_type {kind!r} is not one of {MODEL_TYPES}")
    if hf.get("quantization_config"):
        raise HFImportError("config.json: quantization_config (FP8 weights) is not supported; dequantise first")
    _refuse(hf, "hidden_act", lambda v: v == "silu")
    _refuse(hf, "scoring_func", lambda v: v == "sigmoid")
    _refuse(hf, "topk_method", lambda v: v == "noaux_tc")
    _refuse(hf, "attention_bias", lambda v: not v)
    _refuse(hf, "mlp_bias", lambda v: not v)
    _refuse(hf, "num_key_value_heads", lambda v: v == hf["num_attention_heads"])
    dense = int(hf.get("first_k_dense_replace", 0))
    _refuse(hf, "mlp_layer_types", lambda v: list(v) == ["dense"] * dense + ["sparse"] * (len(v) - dense))
    dtype = str(hf.get("dtype") or hf.get("torch_dtype") or "bfloat16")
    v32 = kind == "deepseek_v32"
    max_len = int(hf.get("max_position_embeddings", 4096))
    return DeepSeekConfig(
        name=name, vocab=hf["vocab_size"], d_model=hf["hidden_size"], n_layers=hf["num_hidden_layers"],
        n_heads=hf["num_attention_heads"], q_lora_rank=int(hf.get("q_lora_rank") or 0),
        kv_lora_rank=hf["kv_lora_rank"], qk_nope_head_dim=hf["qk_nope_head_dim"],
        qk_rope_head_dim=hf["qk_rope_head_dim"], v_head_dim=hf["v_head_dim"], ffw=hf["intermediate_size"],
        moe_ffw=hf["moe_intermediate_size"], n_routed_experts=hf["n_routed_experts"],
        n_shared_experts=int(hf.get("n_shared_experts") or 0), n_experts_per_tok=hf["num_experts_per_tok"],
        n_group=int(hf.get("n_group") or 1), topk_group=int(hf.get("topk_group") or 1), first_k_dense_replace=dense,
        index_n_heads=hf["index_n_heads"] if v32 else 1,
        index_head_dim=hf["index_head_dim"] if v32 else hf["qk_rope_head_dim"],
        index_topk=hf["index_topk"] if v32 else max_len, max_seq_len=max_len,
        norm_topk_prob=bool(hf.get("norm_topk_prob", True)),
        routed_scaling_factor=float(hf.get("routed_scaling_factor", 1.0)), norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        dtype=dtype if dtype in ("float32", "bfloat16", "float16") else "bfloat16", **_rope(hf))


def _rope_perm(n: int) -> np.ndarray:
    """Column order that turns a half-split RoPE layout into the interleaved one: [0, n/2, 1, n/2 + 1, ...]."""
    return np.stack([np.arange(n // 2), np.arange(n // 2) + n // 2], -1).reshape(-1)


def _layer_rows(cfg: DeepSeekConfig, i: int, half_split: bool, fused: bool, indexer: bool):
    """(HF name, HF shape, fn(HF array) -> {our leaf: array}) for layer i."""
    D, N, R, Rq, Dn, Dr, Dv = (cfg.d_model, cfg.n_heads, cfg.kv_lora_rank, cfg.q_lora_rank, cfg.qk_nope_head_dim,
                               cfg.qk_rope_head_dim, cfg.v_head_dim)
    perm = _rope_perm(Dr) if half_split else np.arange(Dr)
    q_cols = np.concatenate([np.arange(Dn), Dn + perm])
    kv_cols = np.concatenate([np.arange(R), R + perm])
    a, m = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
    one = lambda key, f=lambda w: w: lambda w: {key: f(w)}  # noqa: E731
    rows = [(f"model.layers.{i}.input_layernorm.weight", (D,), one("attn_norm")),
            (f"model.layers.{i}.post_attention_layernorm.weight", (D,), one("mlp_norm")),
            (a + "kv_a_proj_with_mqa.weight", (R + Dr, D), one("wkv_a", lambda w: w.T[:, kv_cols])),
            (a + "kv_a_layernorm.weight", (R,), one("kv_norm")),
            (a + "kv_b_proj.weight", (N * (Dn + Dv), R), lambda w: {"w_uk": w.T.reshape(R, N, Dn + Dv)[..., :Dn],
                                                                      "w_uv": w.T.reshape(R, N, Dn + Dv)[..., Dn:]}),
            (a + "o_proj.weight", (D, N * Dv), one("wo", lambda w: w.T.reshape(N, Dv, D)))]
    q = lambda rows_in: lambda w: w.T.reshape(rows_in, N, Dn + Dr)[..., q_cols]  # noqa: E731
    if Rq:
        rows += [(a + "q_a_proj.weight", (Rq, D), one("wq_a", lambda w: w.T)),
                 (a + "q_a_layernorm.weight", (Rq,), one("q_norm")),
                 (a + "q_b_proj.weight", (N * (Dn + Dr), Rq), one("wq_b", q(Rq)))]
    else:
        rows.append((a + "q_proj.weight", (N * (Dn + Dr), D), one("wq", q(D))))
    if indexer:
        Ni, Hi, x = cfg.index_n_heads, cfg.index_head_dim, a + "indexer."
        rows += [(x + "wq_b.weight", (Ni * Hi, Rq or D), one("idx_wq", lambda w: w.T.reshape(-1, Ni, Hi))),
                 (x + "wk.weight", (Hi, D), one("idx_wk", lambda w: w.T)),
                 (x + "k_norm.weight", (Hi,), one("idx_k_norm")), (x + "k_norm.bias", (Hi,), one("idx_k_bias")),
                 (x + "weights_proj.weight", (Ni, D), one("idx_w", lambda w: w.T))]
    if not cfg.is_moe_layer(i):
        F = cfg.ffw
        return rows + [(m + "gate_proj.weight", (F, D), one("w_gate", lambda w: w.T)),
                       (m + "up_proj.weight", (F, D), one("w_up", lambda w: w.T)),
                       (m + "down_proj.weight", (D, F), one("w_down", lambda w: w.T))]
    E, Fe, Fs = cfg.n_routed_experts, cfg.moe_ffw, cfg.moe_ffw * cfg.n_shared_experts
    rows += [(m + "gate.weight", (E, D), one("router", lambda w: w.T)),
             (m + "gate.e_score_correction_bias", (E,), one("router_bias"))]
    if fused:
        rows += [(m + "experts.gate_up_proj", (E, 2 * Fe, D),
                  lambda w: {"e_gate": w[:, :Fe].transpose(0, 2, 1), "e_up": w[:, Fe:].transpose(0, 2, 1)}),
                 (m + "experts.down_proj", (E, D, Fe), one("e_down", lambda w: w.transpose(0, 2, 1)))]
    else:
        for j in range(E):
            for part, shape in (("gate", (Fe, D)), ("up", (Fe, D)), ("down", (D, Fe))):
                rows.append((f"{m}experts.{j}.{part}_proj.weight", shape, one((f"e_{part}", j), lambda w: w.T)))
    if cfg.n_shared_experts:
        rows += [(m + "shared_experts.gate_proj.weight", (Fs, D), one("s_gate", lambda w: w.T)),
                 (m + "shared_experts.up_proj.weight", (Fs, D), one("s_up", lambda w: w.T)),
                 (m + "shared_experts.down_proj.weight", (D, Fs), one("s_down", lambda w: w.T))]
    return rows


def _top_rows(cfg: DeepSeekConfig):
    D, V = cfg.d_model, cfg.vocab
    rows = [("model.embed_tokens.weight", (V, D), lambda w: {"embed": w}),
            ("model.norm.weight", (D,), lambda w: {"final_norm": w})]
    if not cfg.tie_embeddings:
        rows.append(("lm_head.weight", (V, D), lambda w: {"lm_head": w.T}))
    return rows


def _zero_indexer(cfg: DeepSeekConfig) -> dict:
    """A V3 checkpoint's stand-in indexer (never consulted: index_topk = max_seq_len selects everything)."""
    decls = declare(cfg)["layers"][0]
    return {k: np.zeros(decls[k].shape, np.float32) for k in ("idx_wq", "idx_wk", "idx_k_norm", "idx_k_bias", "idx_w")}


def _ignored(name: str, cfg: DeepSeekConfig) -> bool:
    """Tensors a published checkpoint holds that the model does not use: the MTP layer, RoPE buffers."""
    if name.endswith("rotary_emb.inv_freq"):
        return True
    parts = name.split(".")
    return len(parts) > 2 and parts[:2] == ["model", "layers"] and parts[2].isdigit() and int(parts[2]) >= cfg.n_layers


def _assemble(rows, tensors: dict, path: str, cfg: DeepSeekConfig, tree: dict) -> dict:
    """Read every row's tensor (checking its shape) into `tree`; per-expert tensors stack along E."""
    experts: dict = {}
    for hf_name, shape, convert in rows:
        for key, value in convert(np.asarray(read_tensor(tensors, hf_name, shape, path), np.float32)).items():
            if isinstance(key, tuple):
                experts.setdefault(key[0], {})[key[1]] = value
            else:
                tree[key] = value
    for key, by_index in experts.items():
        tree[key] = np.stack([by_index[j] for j in range(cfg.n_routed_experts)])
    return tree


def load_hf(path: str, hf: dict, dtype: str | None = None) -> tuple[DeepSeekConfig, Params]:
    """Import a local HF DeepSeek-V3 / V3.2 checkpoint directory whose config.json is `hf`
    -> (DeepSeekConfig, params).

    Raises HFImportError naming the config field or the tensor that is unsupported, missing,
    unexpected or misshaped.
    """
    cfg = hf_config(hf, name=os.path.basename(os.path.normpath(path)))
    if dtype:
        cfg = cfg.replace(dtype=dtype)
    tensors = open_tensors(path)
    half_split = hf.get("rope_interleave", True) is False
    fused = "model.layers.{}.mlp.experts.down_proj".format(cfg.first_k_dense_replace) in tensors
    indexer = hf["model_type"] == "deepseek_v32"
    used: set[str] = set()
    params: dict = _assemble(_top_rows(cfg), tensors, path, cfg, {})
    used |= {r[0] for r in _top_rows(cfg)}
    params["layers"] = []
    for i in range(cfg.n_layers):
        rows = _layer_rows(cfg, i, half_split, fused, indexer)
        used |= {r[0] for r in rows}
        layer = _assemble(rows, tensors, path, cfg, {} if indexer else _zero_indexer(cfg))
        params["layers"].append(layer)
    refuse_extra(tensors, used, lambda name: _ignored(name, cfg), path)
    return cfg, _cast(params, cfg)


def _cast(params: dict, cfg: DeepSeekConfig) -> Params:
    """The params in cfg.dtype, in the declaration's tree order."""
    decls = declare(cfg)
    return jax.tree.map(lambda d, x: jnp.asarray(x, cfg.jnp_dtype), decls, params, is_leaf=is_decl)


def to_hf(params: Params, cfg: DeepSeekConfig, fused: bool = False) -> dict[str, np.ndarray]:
    """The HF tensors of params (the inverse of the import; interleaved RoPE layout): for exporting
    checkpoints and for tests."""
    N, R, Dn, Dv = cfg.n_heads, cfg.kv_lora_rank, cfg.qk_nope_head_dim, cfg.v_head_dim
    f = lambda x: np.asarray(x, np.float32)  # noqa: E731
    out = {"model.embed_tokens.weight": f(params["embed"]), "model.norm.weight": f(params["final_norm"])}
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = f(params["lm_head"]).T
    for i, lp in enumerate(params["layers"]):
        a, m = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
        lp = {k: f(v) for k, v in lp.items()}
        out |= {f"model.layers.{i}.input_layernorm.weight": lp["attn_norm"],
                f"model.layers.{i}.post_attention_layernorm.weight": lp["mlp_norm"],
                a + "kv_a_proj_with_mqa.weight": lp["wkv_a"].T, a + "kv_a_layernorm.weight": lp["kv_norm"],
                a + "kv_b_proj.weight": np.concatenate([lp["w_uk"], lp["w_uv"]], -1).reshape(R, N * (Dn + Dv)).T,
                a + "o_proj.weight": lp["wo"].reshape(N * Dv, -1).T,
                a + "indexer.wq_b.weight": lp["idx_wq"].reshape(lp["idx_wq"].shape[0], -1).T,
                a + "indexer.wk.weight": lp["idx_wk"].T, a + "indexer.k_norm.weight": lp["idx_k_norm"],
                a + "indexer.k_norm.bias": lp["idx_k_bias"], a + "indexer.weights_proj.weight": lp["idx_w"].T}
        if cfg.q_lora_rank:
            out |= {a + "q_a_proj.weight": lp["wq_a"].T, a + "q_a_layernorm.weight": lp["q_norm"],
                    a + "q_b_proj.weight": lp["wq_b"].reshape(cfg.q_lora_rank, -1).T}
        else:
            out[a + "q_proj.weight"] = lp["wq"].reshape(cfg.d_model, -1).T
        if "router" not in lp:
            out |= {m + f"{p}_proj.weight": lp[f"w_{p}"].T for p in ("gate", "up", "down")}
            continue
        out |= {m + "gate.weight": lp["router"].T, m + "gate.e_score_correction_bias": lp["router_bias"]}
        if fused:
            out[m + "experts.gate_up_proj"] = np.concatenate([lp["e_gate"], lp["e_up"]], -1).transpose(0, 2, 1)
            out[m + "experts.down_proj"] = lp["e_down"].transpose(0, 2, 1)
        else:
            for j in range(cfg.n_routed_experts):
                out |= {f"{m}experts.{j}.{p}_proj.weight": lp[f"e_{p}"][j].T for p in ("gate", "up", "down")}
        if cfg.n_shared_experts:
            out |= {m + f"shared_experts.{p}_proj.weight": lp[f"s_{p}"].T for p in ("gate", "up", "down")}
    return {k: np.ascontiguousarray(v) for k, v in out.items()}


def hf_config_dict(cfg: DeepSeekConfig, rope_parameters: bool = False) -> dict:
    """A `deepseek_v32` config.json dict for cfg (RoPE in either layout)."""
    rope = {"rope_type": "yarn", "factor": cfg.rope_factor, "original_max_position_embeddings": cfg.rope_original_max,
            "beta_fast": cfg.beta_fast, "beta_slow": cfg.beta_slow, "mscale": cfg.mscale,
            "mscale_all_dim": cfg.mscale_all_dim} if cfg.rope_factor > 1 else {"rope_type": "default"}
    hf = {"architectures": ["DeepseekV32ForCausalLM"], "model_type": "deepseek_v32", "vocab_size": cfg.vocab,
          "hidden_size": cfg.d_model, "intermediate_size": cfg.ffw, "moe_intermediate_size": cfg.moe_ffw,
          "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
          "num_key_value_heads": cfg.n_heads, "q_lora_rank": cfg.q_lora_rank or None,
          "kv_lora_rank": cfg.kv_lora_rank, "qk_nope_head_dim": cfg.qk_nope_head_dim,
          "qk_rope_head_dim": cfg.qk_rope_head_dim, "v_head_dim": cfg.v_head_dim,
          "n_routed_experts": cfg.n_routed_experts, "n_shared_experts": cfg.n_shared_experts,
          "num_experts_per_tok": cfg.n_experts_per_tok, "n_group": cfg.n_group, "topk_group": cfg.topk_group,
          "first_k_dense_replace": cfg.first_k_dense_replace, "norm_topk_prob": cfg.norm_topk_prob,
          "routed_scaling_factor": cfg.routed_scaling_factor, "rms_norm_eps": cfg.norm_eps,
          "max_position_embeddings": cfg.max_seq_len, "tie_word_embeddings": cfg.tie_embeddings,
          "index_n_heads": cfg.index_n_heads, "index_head_dim": cfg.index_head_dim, "index_topk": cfg.index_topk,
          "hidden_act": "silu", "attention_bias": False, "dtype": cfg.dtype}
    if rope_parameters:
        return hf | {"rope_parameters": {**rope, "rope_theta": cfg.rope_theta}}
    return hf | {"rope_theta": cfg.rope_theta, "rope_scaling": None if rope["rope_type"] == "default" else rope}


def export_hf(params: Params, cfg: DeepSeekConfig) -> tuple[dict, dict[str, np.ndarray]]:
    """(config.json dict, HF tensors in float32) of params: what `load_hf` reads back as (cfg, params)."""
    return hf_config_dict(cfg), to_hf(params, cfg)
