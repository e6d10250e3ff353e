"""The DeepSeek-V3.2 family as pure functions: parameter declarations, the one layer implementation, the
decode layer.

Same contract as the dense family (`models.dense.model`): `forward_layer(x, lp, positions, cfg, prefix_kv,
prefix_len) -> (x, kv)` is the one layer implementation that the fused forward, the layerwise driver and
`decode_layer` share. A layer's records are `[B, T, *cfg.kv_record_shape]` (latent | RoPE key | indexer
key per token, see `models.deepseek.record`); the decode cache is `[L, B, C, *record]` (`RECORDS`), the
sequence layout itself, so nothing is transposed on the way in or out.

Layers: MLA attention with DSA top-k selection (`mla`, `dsa`), then a dense SwiGLU MLP for the first
`first_k_dense_replace` layers and routed + shared experts after (`moe`).
"""

from __future__ import annotations

import jax.numpy as jnp

from models.cache import CacheLayout
from models.deepseek import dsa, mla, moe
from models.deepseek.config import DeepSeekConfig
from models.deepseek.record import pack, unpack
from models.layers import prefill_mask, rms_norm, swiglu
from models.params import Decl, Params

KV_AXES = ("cache_batch", "cache_seq", None)  # a layer's records [B, S, *record]
RECORDS = CacheLayout("records", (0, 1, 2, 3), ("layers", "cache_batch", "cache_seq", None))  # [L, B, C, *record]


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
        "wo": Decl((N, Dv, D), ("heads", None, "embed"), "normal", fan_in_dims=(0, 1)),
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
              # an expert's fan-in is its middle dim (D for gate/up, Fe for down)
              "e_gate": Decl((E, D, Fe), ("expert", "embed", None), "normal", fan_in_dims=(1,)),
              "e_up": Decl((E, D, Fe), ("expert", "embed", None), "normal", fan_in_dims=(1,)),
              "e_down": Decl((E, Fe, D), ("expert", None, "embed"), "normal", fan_in_dims=(1,))}
    if cfg.n_shared_experts:
        Fs = cfg.n_shared_experts * Fe
        decls |= {"s_gate": Decl((D, Fs), ("embed", "ffw"), "normal"),
                  "s_up": Decl((D, Fs), ("embed", "ffw"), "normal"),
                  "s_down": Decl((Fs, D), ("ffw", "embed"), "normal")}
    return decls


def declare(cfg: DeepSeekConfig) -> Params:
    """The declaration pytree (a `Decl` per leaf); layers differ (dense FFN first, then MoE). The embedding
    is drawn N(0, 1/V) (fan-in V), unlike the dense family's N(0, 1)."""
    tree = {"embed": Decl((cfg.vocab, cfg.d_model), ("vocab", "embed"), "normal"),
            "final_norm": Decl((cfg.d_model,), ("embed",), "ones"),
            "layers": [_attn_decls(cfg) | _ffn_decls(cfg, i) for i in range(cfg.n_layers)]}
    if not cfg.tie_embeddings:
        tree["lm_head"] = Decl((cfg.d_model, cfg.vocab), ("embed", "vocab"), "normal")
    return tree


def project(x, lp, positions, cfg: DeepSeekConfig):
    """Attention inputs of x [B, T, D]: (h, qr, q_nope, q_pe, cos, sin, record [B, T, *rec])."""
    h = rms_norm(x, lp["attn_norm"], cfg.norm_eps)
    cos, sin = mla.rope_cos_sin(positions, cfg)
    qr = mla.query_latent(h, lp, cfg)
    q_nope, q_pe = mla.project_q(qr, lp, cos, sin, cfg)
    c_kv, k_pe = mla.project_latent(h, lp, cos, sin, cfg)
    return h, qr, q_nope, q_pe, cos, sin, pack(c_kv, k_pe, dsa.index_key(h, lp, cos, sin, cfg), cfg)


def finish_layer(x, attn, lp, cfg: DeepSeekConfig):
    """o_proj, residuals and the FFN (dense or MoE, by the layer's params): attn [B, T, N, Dv] -> x."""
    x = x + mla.output(attn, lp)
    h = rms_norm(x, lp["mlp_norm"], cfg.norm_eps)
    ffn = moe.moe(h, lp, cfg) if "router" in lp else swiglu(h, lp["w_gate"], lp["w_up"], lp["w_down"])
    return x + ffn


def forward_layer(x, lp, positions, cfg: DeepSeekConfig, prefix_kv, prefix_len):
    """One layer over new tokens, attending to a cached prefix and causally to themselves (DSA top-k).

    x [B, T, D]; positions [B, T] (= prefix_len + t); prefix_kv [B, S, *rec] of which the first
    prefix_len[b] are valid (S may be 0); returns (x [B, T, D], kv [B, T, *rec]).
    """
    S, T = prefix_kv.shape[1], x.shape[1]
    h, qr, q_nope, q_pe, cos, sin, new = project(x, lp, positions, cfg)
    c_kv, k_pe, k_idx = unpack(jnp.concatenate([prefix_kv, new], axis=1), cfg)
    mask = visible = prefill_mask(prefix_len, S, T)
    if S + T > cfg.index_topk:
        iq, iw = dsa.index_query(qr, h, lp, cos, sin, cfg)
        mask = dsa.select_mask(dsa.index_scores(iq, iw, k_idx), visible, cfg.index_topk)
    attn = mla.attend_expanded(q_nope, q_pe, c_kv, k_pe, mask, lp, cfg)
    return finish_layer(x, attn, lp, cfg), new


def decode_layer(x, lp, layer: int, cache, lengths, cfg: DeepSeekConfig, layout: CacheLayout):
    """One layer of a decode step: the new token's record is written into the cache [L, B, C, *rec] at
    (b, lengths[b]) first; then absorbed sparse attention over the row's records, gathering the top-k
    ones (never the whole latent). x [B, 1, D]; returns (x, cache)."""
    h, qr, q_nope, q_pe, cos, sin, new = project(x, lp, lengths[:, None], cfg)
    cache = cache.at[layout.token_index(layer, lengths)].set(new[:, 0])
    cache_l, C = cache[layer], cache.shape[2]
    visible = (jnp.arange(C)[None, :] <= lengths[:, None])[:, None, :]  # [B, 1, C]
    if C > cfg.index_topk:
        iq, iw = dsa.index_query(qr, h, lp, cos, sin, cfg)
        scores = dsa.index_scores(iq, iw, unpack(cache_l, cfg)[2])
        idx, visible = dsa.top_k_positions(scores, visible, cfg.index_topk)  # [B, 1, k]
        cache_l = jnp.take_along_axis(cache_l, idx[:, 0, :, None], axis=1)
    c_kv, k_pe, _ = unpack(cache_l, cfg)
    return finish_layer(x, mla.attend_absorbed(q_nope, q_pe, c_kv, k_pe, visible, lp, cfg), lp, cfg), cache


def cache_layout(cfg: DeepSeekConfig) -> CacheLayout:
    return RECORDS


def attention(cfg: DeepSeekConfig) -> dict[str, str]:
    """What prefill's and decode's attention run on this backend."""
    return {"prefill": mla.attention_implementation(cfg), "decode": "einsum (absorbed MLA)"}
