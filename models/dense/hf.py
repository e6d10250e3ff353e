"""Hugging Face import of the dense family: Llama and Qwen2 checkpoints (`LlamaForCausalLM`,
`Qwen2ForCausalLM`), one safetensors file or several, RoPE settings in either `config.json` layout.
A config field whose other values the family does not implement is refused, naming it. `export_hf` is
the inverse (Qwen2 when the config has a QKV bias, else Llama)."""

from __future__ import annotations

import os

import jax
import numpy as np

from models.config import DTYPES
from models.dense.config import ModelConfig, RopeScaling
from models.hf import HFImportError, open_tensors, read_tensor, refuse_extra
from models.params import Params, check_params

ARCHITECTURES = {"LlamaForCausalLM": False, "Qwen2ForCausalLM": True}  # architecture -> default qkv bias
ROPE_TYPES = ("default", "llama3")  # the Hugging Face rope types the dense family implements


def hf_rope(hf: dict) -> tuple[float, dict, str]:
    """(theta, scaling, field) of a `config.json` in either layout: top-level `rope_theta` and
    `rope_scaling` (transformers 4.x), or one `rope_parameters` dict holding `rope_theta`, `rope_type`
    and the type's own fields (5.x; it wins when both are present). `scaling` always names its
    `rope_type` ("default": plain RoPE); `field` is where it came from, for error messages.
    Raises HFImportError for per-layer-type rope_parameters (a dict of dicts)."""
    params = hf.get("rope_parameters")
    if params:
        if any(isinstance(v, dict) for v in params.values()):
            raise HFImportError(f"config.json: rope_parameters per layer type ({sorted(params)}) are not "
                                  "implemented; one rope_parameters dict is")
        scaling, field = dict(params), "rope_parameters"
    else:
        scaling, field = dict(hf.get("rope_scaling") or {}), "rope_scaling"
    theta = float(scaling.pop("rope_theta", hf.get("rope_theta", 10000.0)))
    scaling["rope_type"] = scaling.pop("rope_type", scaling.pop("type", "default"))
    return theta, scaling, field


def _llama_rope(hf: dict) -> tuple[float, RopeScaling | None]:
    """(rope_theta, rope_scaling) of a Llama/Qwen2 config; refuses a rope type not in ROPE_TYPES, naming it."""
    theta, scaling, field = hf_rope(hf)
    kind = scaling["rope_type"]
    if kind not in ROPE_TYPES:
        raise HFImportError(f"config.json: {field}.rope_type {kind!r} is not implemented for "
                              f"{'/'.join(ARCHITECTURES)}; implemented: {', '.join(ROPE_TYPES)}")
    if kind == "default":
        return theta, None
    try:
        return theta, RopeScaling(float(scaling["factor"]), float(scaling["low_freq_factor"]),
                                  float(scaling["high_freq_factor"]), int(scaling["original_max_position_embeddings"]))
    except KeyError as e:
        raise HFImportError(f"config.json: {field} of rope_type 'llama3' lacks {e.args[0]!r}") from None


# config.json fields of Llama / Qwen2 whose other values the dense family does not implement: (field, accepted)
_IMPLEMENTED = (("hidden_act", lambda v: v == "silu"), ("mlp_bias", lambda v: not v),
                ("use_sliding_window", lambda v: not v),
                ("layer_types", lambda v: all(t == "full_attention" for t in v)))


def hf_config(hf: dict, name: str = "hf", dtype: str | None = None) -> ModelConfig:
    """Map a Hugging Face `config.json` dict to a ModelConfig (params in `dtype`, default the file's
    `dtype` / `torch_dtype`, else float32). Raises HFImportError naming an unsupported field."""
    arch = (hf.get("architectures") or ["?"])[0]
    if arch not in ARCHITECTURES:
        raise HFImportError(f"unsupported architecture {arch!r}; supported: {sorted(ARCHITECTURES)}")
    for field, ok in _IMPLEMENTED:
        if hf.get(field) is not None and not ok(hf[field]):
            raise HFImportError(f"config.json: {field}={hf[field]!r} is not implemented for {arch} "
                                  "(silu MLP without bias, full attention in every layer)")
    dtype = dtype or hf.get("dtype") or hf.get("torch_dtype") or "float32"
    if dtype not in DTYPES:
        raise HFImportError(f"config.json: dtype {dtype!r} is not one of {sorted(DTYPES)}; pass dtype= to load it")
    theta, scaling = _llama_rope(hf)
    return ModelConfig(
        name=name, vocab=hf["vocab_size"], d_model=hf["hidden_size"], n_layers=hf["num_hidden_layers"],
        n_heads=hf["num_attention_heads"], n_kv_heads=hf.get("num_key_value_heads", hf["num_attention_heads"]),
        head_dim=hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"],
        ffw=hf["intermediate_size"], max_seq_len=hf.get("max_position_embeddings", 4096),
        rope_theta=theta, rope_scaling=scaling, norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        qkv_bias=bool(hf.get("attention_bias", ARCHITECTURES[arch])),
        tie_embeddings=bool(hf.get("tie_word_embeddings")), dtype=dtype)


def _hf_layout(cfg: ModelConfig):
    """(hf name, params path, expected HF shape, convert) for every tensor of the checkpoint."""
    D, N, K, H, F, V = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffw, cfg.vocab
    same = lambda w: w  # noqa: E731
    t = lambda *shape: (lambda w: w.T.reshape(shape))  # noqa: E731
    rows = [("model.embed_tokens.weight", ("embed",), (V, D), same),
            ("model.norm.weight", ("final_norm",), (D,), same)]
    if not cfg.tie_embeddings:
        rows.append(("lm_head.weight", ("lm_head",), (V, D), t(D, V)))
    for i in range(cfg.n_layers):
        p, a, m = f"model.layers.{i}.", f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
        rows += [(p + "input_layernorm.weight", ("layers", i, "attn_norm"), (D,), same),
                 (a + "q_proj.weight", ("layers", i, "wq"), (N * H, D), t(D, N, H)),
                 (a + "k_proj.weight", ("layers", i, "wk"), (K * H, D), t(D, K, H)),
                 (a + "v_proj.weight", ("layers", i, "wv"), (K * H, D), t(D, K, H)),
                 (a + "o_proj.weight", ("layers", i, "wo"), (D, N * H), t(N, H, D)),
                 (p + "post_attention_layernorm.weight", ("layers", i, "mlp_norm"), (D,), same),
                 (m + "gate_proj.weight", ("layers", i, "w_gate"), (F, D), t(D, F)),
                 (m + "up_proj.weight", ("layers", i, "w_up"), (F, D), t(D, F)),
                 (m + "down_proj.weight", ("layers", i, "w_down"), (D, F), t(F, D))]
        if cfg.qkv_bias:
            rows += [(a + f"{x}_proj.bias", ("layers", i, f"b{x}"), (n * H,), (lambda n: lambda w: w.reshape(n, H))(n))
                     for x, n in (("q", N), ("k", K), ("v", K))]
    return rows


def _ignorable(names, cfg: ModelConfig) -> set[str]:
    """Tensors a checkpoint may hold that the model does not read: RoPE buffers older transformers
    saved, and the output head of a model whose embeddings are tied (it is the embedding's copy)."""
    tied = {"lm_head.weight"} if cfg.tie_embeddings else set()
    return {n for n in names if n.endswith("rotary_emb.inv_freq")} | (tied & set(names))


def load_hf(path: str, hf: dict, dtype: str | None = None) -> tuple[ModelConfig, Params]:
    """Import a local HF Llama/Qwen2 checkpoint directory whose config.json is `hf` -> (ModelConfig, params).

    Raises HFImportError naming the tensor when one is missing, misshaped or not part of the model.
    """
    cfg = hf_config(hf, name=os.path.basename(os.path.normpath(path)), dtype=dtype)
    tensors = open_tensors(path)
    layout = _hf_layout(cfg)
    ignorable = _ignorable(tensors, cfg)
    refuse_extra(tensors, {row[0] for row in layout}, ignorable.__contains__, path,
                 f" for {cfg.n_layers}-layer {hf['architectures'][0]}")
    params: Params = {"layers": [{} for _ in range(cfg.n_layers)]}
    for hf_name, dest, shape, convert in layout:
        value = jax.numpy.asarray(convert(read_tensor(tensors, hf_name, shape, path)), cfg.jnp_dtype)
        node = params
        for key in dest[:-1]:
            node = node[key]
        node[dest[-1]] = value
    check_params(params, cfg)
    return cfg, params


def export_hf(params: Params, cfg: ModelConfig) -> tuple[dict, dict[str, np.ndarray]]:
    """(config.json dict, HF tensors in float32) of params: what `load_hf` reads back as (cfg, params)."""
    arch = "Qwen2ForCausalLM" if cfg.qkv_bias else "LlamaForCausalLM"
    rope = cfg.rope_scaling and {"rope_type": "llama3", "factor": cfg.rope_scaling.factor,
                                 "low_freq_factor": cfg.rope_scaling.low_freq_factor,
                                 "high_freq_factor": cfg.rope_scaling.high_freq_factor,
                                 "original_max_position_embeddings": cfg.rope_scaling.original_max_position}
    hf = {"architectures": [arch], "model_type": {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2"}[arch],
          "vocab_size": cfg.vocab, "hidden_size": cfg.d_model, "num_hidden_layers": cfg.n_layers,
          "num_attention_heads": cfg.n_heads, "num_key_value_heads": cfg.n_kv_heads, "head_dim": cfg.head_dim,
          "intermediate_size": cfg.ffw, "max_position_embeddings": cfg.max_seq_len, "rope_theta": cfg.rope_theta,
          "rope_scaling": rope or None, "rms_norm_eps": cfg.norm_eps, "attention_bias": cfg.qkv_bias,
          "tie_word_embeddings": cfg.tie_embeddings, "hidden_act": "silu", "torch_dtype": cfg.dtype}
    tensors = {}
    for name, dest, shape, _ in _hf_layout(cfg):
        w = params
        for key in dest:
            w = w[key]
        w = np.asarray(w, np.float32)  # HF linear weights are [out, in]; ours [in, ...out]; the embedding as is
        w = w.reshape(shape) if len(shape) == 1 or dest == ("embed",) else w.reshape(shape[::-1]).T
        tensors[name] = np.ascontiguousarray(w)
    return hf, tensors
