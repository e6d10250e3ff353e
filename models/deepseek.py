"""The DeepSeek-V3.2 family as pure functions: parameter declarations, layer, forward, prefill, decode.

Same contract as the dense family (`models.model`): `forward_layer(x, lp, positions, cfg, prefix_kv,
prefix_len) -> (x, kv)` is the one layer implementation that the fused `forward`, the layerwise
driver and `decode_step` share. A layer's KV is `[B, T, *cfg.kv_record_shape]` (latent | RoPE key |
indexer key per token, see `models.mla_cache`); all layers stack to `[L, B, T, *record]`.

Layers: MLA attention with DSA top-k selection (`models.mla`, `models.dsa`), then a dense SwiGLU MLP
for the first `first_k_dense_replace` layers and routed + shared experts after (`models.moe`).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from models import dsa, mla, mla_cache, moe
from models.buckets import DEFAULT_BUCKETS, Buckets
from models.deepseek_config import DeepSeekConfig
from models.params import Decl, Params, random_params
from models.prefill import InputError, check_prefix_len, check_tokens

# --------------------------------------------------------------------------- parameters


def _attn_decls(cfg: DeepSeekConfig) -> dict[str, Decl]:
    D, N, R, Rq = cfg.d_model, cfg.n_heads, cfg.kv_lora_rank, cfg.q_lora_rank
    Dn, Dr, Dv = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim
    Ni, Hi = cfg.index_n_heads, cfg.index_head_dim
    q_in = Rq or D
    decls = {"attn_norm": Decl((D,), ("embed",), "ones")}
    if Rq:
        decls |= {"wq_a": Decl((D, Rq), ("embed", None), "normal"), "q_norm": Decl((Rq,), (None,), "ones"),
                  "wq_b": Decl((Rq, N, Dn + Dr), (None, "heads", None), "normal")}
    else:
        decls["wq"] = Decl((D, N, Dn + Dr), ("embed", "heads", None), "normal")
    return decls | {
        "wkv_a": Decl((D, R + Dr), ("embed", None), "normal"),
        "kv_norm": Decl((R,), (None,), "ones"),
        "w_uk": Decl((R, N, Dn), (None, "heads", None), "normal"),
        "w_uv": Decl((R, N, Dv), (None, "heads", None), "normal"),
        "wo": Decl((N, Dv, D), ("heads", None, "embed"), "normal", fan_in_dims=2),
        "idx_wq": Decl((q_in, Ni, Hi), (None, "heads", None), "normal"),
        "idx_wk": Decl((D, Hi), ("embed", None), "normal"),
        "idx_k_norm": Decl((Hi,), (None,), "ones"),
        "idx_k_bias": Decl((Hi,), (None,), "zeros"),
        "idx_w": Decl((D, Ni), ("embed", None), "normal"),
    }


def _ffn_decls(cfg: DeepSeekConfig, layer: int) -> dict[str, Decl]:
    D, E, Fe = cfg.d_model, cfg.n_routed_experts, cfg.moe_ffw
    decls = {"mlp_norm": Decl((D,), ("embed",), "ones")}
    if not cfg.is_moe_layer(layer):
        F = cfg.ffw
        return decls | {"w_gate": Decl((D, F), ("embed", "ffw"), "normal"),
                        "w_up": Decl((D, F), ("embed", "ffw"), "normal"),
                        "w_down": Decl((F, D), ("ffw", "embed"), "normal")}
    decls |= {"router": Decl((D, E), ("embed", None), "normal"),
              "router_bias": Decl((E,), (None,), "normal"),
              # "expert" init: fan-in is the middle dim (D for gate/up, Fe for down).
              "e_gate": Decl((E, D, Fe), ("expert", "embed", None), "expert"),
              "e_up": Decl((E, D, Fe), ("expert", "embed", None), "expert"),
              "e_down": Decl((E, Fe, D), ("expert", None, "embed"), "expert")}
    if cfg.n_shared_experts:
        Fs = cfg.n_shared_experts * Fe
        decls |= {"s_gate": Decl((D, Fs), ("embed", "ffw"), "normal"),
                  "s_up": Decl((D, Fs), ("embed", "ffw"), "normal"),
                  "s_down": Decl((Fs, D), ("ffw", "embed"), "normal")}
    return decls


def declare(cfg: DeepSeekConfig) -> dict:
    """The declaration pytree (a `Decl` per leaf); layers differ (dense FFN first, then MoE)."""
    tree = {"embed": Decl((cfg.vocab, cfg.d_model), ("vocab", "embed"), "embed"),
            "final_norm": Decl((cfg.d_model,), ("embed",), "ones"),
            "layers": [_attn_decls(cfg) | _ffn_decls(cfg, i) for i in range(cfg.n_layers)]}
    if not cfg.tie_embeddings:
        tree["lm_head"] = Decl((cfg.d_model, cfg.vocab), ("embed", "vocab"), "normal")
    return tree


def is_decl(x) -> bool:
    return isinstance(x, Decl)


def init_params(cfg: DeepSeekConfig, seed: int = 0) -> Params:
    """Seeded random params (deterministic in `seed`), in `cfg.dtype` (`models.params.random_leaf`)."""
    return random_params(declare(cfg), seed, cfg.jnp_dtype,
                         lambda d: d.shape[1] if d.init == "expert" else math.prod(d.shape[:d.fan_in_dims]))


def param_count(cfg: DeepSeekConfig) -> int:
    return sum(math.prod(d.shape) for d in jax.tree_util.tree_leaves(declare(cfg), is_leaf=is_decl))


# --------------------------------------------------------------------------- the model


def embed(params: Params, tokens):
    """tokens [B, T] -> x [B, T, D]."""
    return params["embed"][tokens]


def head(params: Params, cfg: DeepSeekConfig, x):
    """x [B, T, D] -> float32 logits [B, T, V]."""
    x = mla.rms_norm(x, params["final_norm"], cfg.norm_eps)
    w = params["embed"].T if cfg.tie_embeddings else params["lm_head"]
    return jnp.einsum("btd,dv->btv", x, w, preferred_element_type=jnp.float32)


def project(x, lp, positions, cfg: DeepSeekConfig):
    """Attention inputs of x [B, T, D]: (h, qr, q_nope, q_pe, cos, sin, record [B, T, *rec])."""
    h = mla.rms_norm(x, lp["attn_norm"], cfg.norm_eps)
    cos, sin = mla.rope_cos_sin(positions, cfg)
    qr = mla.query_latent(h, lp, cfg)
    q_nope, q_pe = mla.project_q(qr, lp, cos, sin, cfg)
    c_kv, k_pe = mla.project_latent(h, lp, cos, sin, cfg)
    record = mla_cache.pack(c_kv, k_pe, dsa.index_key(h, lp, cos, sin, cfg), cfg)
    return h, qr, q_nope, q_pe, cos, sin, record


def finish_layer(x, attn, lp, cfg: DeepSeekConfig):
    """o_proj, residuals and the FFN (dense or MoE, by the layer's params): attn [B, T, N, Dv] -> x."""
    x = x + mla.output(attn, lp)
    h = mla.rms_norm(x, lp["mlp_norm"], cfg.norm_eps)
    ffn = moe.moe(h, lp, cfg) if "router" in lp else moe.mlp(h, lp["w_gate"], lp["w_up"], lp["w_down"])
    return x + ffn


def forward_layer(x, lp, positions, cfg: DeepSeekConfig, prefix_kv, prefix_len):
    """One layer over new tokens, attending to a cached prefix and causally to themselves (DSA top-k).

    x [B, T, D]; positions [B, T] (= prefix_len + t); prefix_kv [B, S, *rec] of which the first
    prefix_len[b] are valid (S may be 0); returns (x [B, T, D], kv [B, T, *rec]).
    """
    B, T, _ = x.shape
    S = prefix_kv.shape[1]
    h, qr, q_nope, q_pe, cos, sin, record = project(x, lp, positions, cfg)
    c_kv, k_pe, k_idx = mla_cache.unpack(jnp.concatenate([prefix_kv, record], axis=1), cfg)
    in_prefix = jnp.arange(S)[None, None, :] < prefix_len[:, None, None]
    causal = jnp.arange(T)[None, :, None] >= jnp.arange(T)[None, None, :]
    visible = jnp.concatenate([jnp.broadcast_to(in_prefix, (B, T, S)), jnp.broadcast_to(causal, (B, T, T))], -1)
    mask = visible
    if S + T > cfg.index_topk:
        iq, iw = dsa.index_query(qr, h, lp, cos, sin, cfg)
        mask = dsa.select_mask(dsa.index_scores(iq, iw, k_idx), visible, cfg.index_topk)
    attn = mla.attend_expanded(q_nope, q_pe, c_kv, k_pe, mask, lp, cfg)
    return finish_layer(x, attn, lp, cfg), record


def forward(params: Params, cfg: DeepSeekConfig, tokens, prefix_kv, prefix_len):
    """Fused prefill: tokens [B, T], prefix_kv [L, B, S, *rec], prefix_len [B]
    -> (logits [B, T, V] float32, kv [L, B, T, *rec])."""
    positions = prefix_len[:, None] + jnp.arange(tokens.shape[1])[None, :]
    x = embed(params, tokens)
    kvs = []
    for layer, lp in enumerate(params["layers"]):
        x, kv = forward_layer(x, lp, positions, cfg, prefix_kv[layer], prefix_len)
        kvs.append(kv)
    return head(params, cfg, x), jnp.stack(kvs)


def decode_attend(h, qr, q_nope, q_pe, cos, sin, cache_l, lengths, lp, cfg: DeepSeekConfig):
    """Absorbed sparse attention of one new token per row over its cache row cache_l [B, C, *rec]
    (the new record already written at lengths[b]): gathers the top-k records, never the whole latent."""
    B, C = cache_l.shape[:2]
    visible = (jnp.arange(C)[None, :] <= lengths[:, None])[:, None, :]  # [B, 1, C]
    if C > cfg.index_topk:
        iq, iw = dsa.index_query(qr, h, lp, cos, sin, cfg)
        scores = dsa.index_scores(iq, iw, mla_cache.unpack(cache_l, cfg)[2])
        idx, visible = dsa.top_k_positions(scores, visible, cfg.index_topk)  # [B, 1, k]
        cache_l = jnp.take_along_axis(cache_l, idx[:, 0, :, None], axis=1)
    c_kv, k_pe, _ = mla_cache.unpack(cache_l, cfg)
    return mla.attend_absorbed(q_nope, q_pe, c_kv, k_pe, visible, lp, cfg)


def decode_step(params: Params, cfg: DeepSeekConfig, tokens, cache, lengths):
    """One batched decode step. tokens [B]; cache [L, B, C, *rec]; lengths [B] valid entries per row,
    the new token goes at position lengths[b]. Returns (logits [B, V], cache'). The jitted
    `decode_step_jit` donates `cache`."""
    x = embed(params, tokens[:, None])
    rows = jnp.arange(tokens.shape[0])
    for layer, lp in enumerate(params["layers"]):
        h, qr, q_nope, q_pe, cos, sin, record = project(x, lp, lengths[:, None], cfg)
        cache = cache.at[layer, rows, lengths].set(record[:, 0])
        attn = decode_attend(h, qr, q_nope, q_pe, cos, sin, cache[layer], lengths, lp, cfg)
        x = finish_layer(x, attn, lp, cfg)
    return head(params, cfg, x)[:, 0], cache


decode_step_jit = jax.jit(decode_step, static_argnums=1, donate_argnums=3)


@functools.partial(jax.jit, static_argnums=1)
def _forward_jit(params, cfg, tokens, prefix_kv, prefix_len):
    return forward(params, cfg, tokens, prefix_kv, prefix_len)


def pad_to(a, axis: int, size: int):
    """a zero-padded along `axis` to `size`."""
    widths = [(0, 0)] * a.ndim
    widths[axis] = (0, size - a.shape[axis])
    return jnp.pad(a, widths)


def kv_np_dtype(cfg: DeepSeekConfig) -> np.dtype:
    """The NumPy dtype of the cache record (the model dtype, or uint8 for the FP8 byte layout)."""
    return np.dtype(np.uint8) if cfg.kv_cache_dtype == "fp8" else np.dtype(cfg.jnp_dtype)


def check_records(prefix_kv, prefix_len, cfg: DeepSeekConfig, batch: int, new: int, layers: int):
    """Validate a cached prefix [layers, B, S, *rec] and its per-row lengths; returns (kv, lengths)."""
    if prefix_kv is None:
        prefix_kv = empty_kv(cfg, layers, batch)
    shape = tuple(prefix_kv.shape)
    if len(shape) != 3 + len(cfg.kv_record_shape) or shape[:2] != (layers, batch) \
            or shape[3:] != cfg.kv_record_shape:
        raise InputError(f"prefix_kv has shape {shape}, expected [L={layers}, B={batch}, S, "
                         f"*{cfg.kv_record_shape}] for {cfg.name!r} ({cfg.kv_format})")
    if prefix_kv.dtype != kv_np_dtype(cfg):
        raise InputError(f"prefix_kv has dtype {prefix_kv.dtype}, expected {cfg.kv_dtype} for {cfg.name!r}")
    return prefix_kv, check_prefix_len(prefix_len, batch, shape[2], new, cfg)


def prefill(params: Params, cfg: DeepSeekConfig, tokens, prefix_kv=None, prefix_len=None,
            buckets: Buckets = DEFAULT_BUCKETS):
    """Prefill new tokens [B, T] over cached records [L, B, S, *rec] (None: no prefix).

    Returns (logits [B, T, V] float32, kv [L, B, T, *rec]); raises InputError like `models.prefill`.
    """
    tokens = check_tokens(tokens, cfg)
    B, T = tokens.shape
    prefix_kv, lengths = check_records(prefix_kv, prefix_len, cfg, B, T, cfg.n_layers)
    Tb, Sb = buckets.new(T), buckets.prefix(int(lengths.max(initial=0)))
    logits, kv = _forward_jit(params, cfg, pad_to(jnp.asarray(tokens), 1, Tb),
                              pad_to(jnp.asarray(prefix_kv)[:, :, :Sb], 2, Sb), jnp.asarray(lengths))
    return logits[:, :T], kv[:, :, :T]


def empty_kv(cfg: DeepSeekConfig, layers: int, batch: int, length: int = 0) -> np.ndarray:
    """Zero records [layers, batch, length, *rec] (an empty prefix when length is 0)."""
    return np.zeros((layers, batch, length, *cfg.kv_record_shape), kv_np_dtype(cfg))
