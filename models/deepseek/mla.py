"""Multi-head latent attention (DeepSeek-V2/V3): YaRN RoPE, projections, expanded and absorbed attention.

Per token the cache holds the normalised latent `c_kv` [R] and the shared RoPE key `k_pe` [Dr],
never per-head keys and values. Prefill expands the latent with `w_uk` / `w_uv` into per-head
no-RoPE keys and values (`attend_expanded`); decode folds `w_uk` into the query and `w_uv` into
the output and attends over the latent directly (`attend_absorbed`). The two are the same sums in
a different order.

The expanded form is plain multi-head attention (keys of width Dn + Dr, values of Dv), so it runs
through `jax.nn.dot_product_attention` (cuDNN's fused attention where it compiles). The absorbed form
does not fit that API: its one shared key is R + Dr wide (576 in DeepSeek-V3) over values of R, where
the API takes keys and values of one width and cuDNN at most 256; it stays einsums, over at most the
`index_topk` records DSA gathers.

RoPE layouts: MLA rotates adjacent pairs (DeepSeek's interleaved layout, what HF does after its
de-interleaving permutation); the DSA indexer rotates the two halves (`models.deepseek.dsa`).
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from models.deepseek.config import DeepSeekConfig, yarn_mscale
from models.layers import attend, cos_sin, fused_implementation, rms_norm, rope_interleaved


def _correction_dim(rotations: float, dim: int, base: float, original: int) -> float:
    return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))


def rope_inv_freq(cfg: DeepSeekConfig) -> np.ndarray:
    """Inverse frequencies [Dr/2] of the RoPE part, with DeepSeek's YaRN when `rope_factor` > 1."""
    dim, base = cfg.qk_rope_head_dim, cfg.rope_theta
    inv = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    if cfg.rope_factor > 1:
        low = max(math.floor(_correction_dim(cfg.beta_fast, dim, base, cfg.rope_original_max)), 0)
        high = min(math.ceil(_correction_dim(cfg.beta_slow, dim, base, cfg.rope_original_max)), dim - 1)
        ramp = np.clip((np.arange(dim // 2) - low) / max(high - low, 1e-3), 0.0, 1.0)
        inv = inv / cfg.rope_factor * ramp + inv * (1 - ramp)
    return inv.astype(np.float32)


def rope_cos_sin(positions, cfg: DeepSeekConfig):
    """cos, sin [B, T, Dr/2] (float32) for positions [B, T]; YaRN's magnitude factor folded in."""
    cos, sin = cos_sin(positions, rope_inv_freq(cfg))
    gain = 1.0  # HF's YaRN attention factor: 1 when mscale == mscale_all_dim, as in every DeepSeek config
    if cfg.rope_factor > 1:
        gain = (yarn_mscale(cfg.rope_factor, cfg.mscale) / yarn_mscale(cfg.rope_factor, cfg.mscale_all_dim)
                if cfg.mscale and cfg.mscale_all_dim else yarn_mscale(cfg.rope_factor, 1.0))
    return cos * gain, sin * gain


def query_latent(h, lp, cfg: DeepSeekConfig):
    """The query's input: the normalised Q-LoRA latent [B, T, Rq], or h [B, T, D] itself without Q-LoRA."""
    if cfg.q_lora_rank:
        return rms_norm(jnp.einsum("btd,dr->btr", h, lp["wq_a"]), lp["q_norm"], cfg.norm_eps)
    return h


def project_q(qr, lp, cos, sin, cfg: DeepSeekConfig):
    """Queries of qr (from `query_latent`): q_nope [B, T, N, Dn], q_pe [B, T, N, Dr] (RoPE applied)."""
    q = jnp.einsum("btr,rnk->btnk", qr, lp["wq_b"] if cfg.q_lora_rank else lp["wq"])
    return q[..., :cfg.qk_nope_head_dim], rope_interleaved(q[..., cfg.qk_nope_head_dim:], cos, sin)


def project_latent(h, lp, cos, sin, cfg: DeepSeekConfig):
    """The cached part of h [B, T, D]: normalised latent c_kv [B, T, R] and RoPE key k_pe [B, T, Dr]."""
    kv = jnp.einsum("btd,dr->btr", h, lp["wkv_a"])
    c_kv = rms_norm(kv[..., :cfg.kv_lora_rank], lp["kv_norm"], cfg.norm_eps)
    k_pe = rope_interleaved(kv[..., None, cfg.kv_lora_rank:], cos, sin)[:, :, 0]
    return c_kv, k_pe


def _softmax_where(scores, mask, dtype):
    """softmax over the last axis of float32 scores where mask, else 0 (a row with nothing visible gives 0s)."""
    scores = jnp.where(mask, scores, -jnp.inf)
    top = jnp.max(scores, axis=-1, keepdims=True)
    e = jnp.where(mask, jnp.exp(scores - jnp.where(jnp.isfinite(top), top, 0.0)), 0.0)
    return (e / jnp.maximum(jnp.sum(e, axis=-1, keepdims=True), 1e-30)).astype(dtype)


def attention_implementation(cfg: DeepSeekConfig) -> str:
    """The implementation of prefill's expanded attention (`models.layers.fused_implementation` for its
    heads: keys and values both padded to the wider of Dn + Dr and Dv)."""
    return fused_implementation(cfg.jnp_dtype, cfg.n_heads, cfg.n_heads, max(cfg.qk_head_dim, cfg.v_head_dim))


def attend_expanded(q_nope, q_pe, c_kv, k_pe, mask, lp, cfg: DeepSeekConfig):
    """Attention of q [B, T, N, *] over latents c_kv [B, S, R], k_pe [B, S, Dr] where mask [B, T, S],
    expanding per-head keys and values: returns [B, T, N, Dv].

    One `jax.nn.dot_product_attention` over q = [q_nope | q_pe] and k = [k_nope | k_pe] (the RoPE key
    shared by every head), with q, k and v zero-padded to one width (zeros add nothing to the scores,
    and the padded output columns are dropped). Every query sees at least one position (itself), so
    the API's masking equals `_softmax_where`'s."""
    B, S, _ = c_kv.shape
    N, Dv = q_nope.shape[2], cfg.v_head_dim
    k_nope = jnp.einsum("bsr,rnk->bsnk", c_kv, lp["w_uk"])
    v = jnp.einsum("bsr,rnv->bsnv", c_kv, lp["w_uv"])
    q = jnp.concatenate([q_nope, q_pe], axis=-1)
    k = jnp.concatenate([k_nope, jnp.broadcast_to(k_pe[:, :, None], (B, S, N, k_pe.shape[-1]))], axis=-1)
    width = max(cfg.qk_head_dim, Dv)
    q, k, v = (jnp.pad(a, [(0, 0)] * 3 + [(0, width - a.shape[-1])]) for a in (q, k, v))
    return attend(q, k, v, attention_implementation(cfg), mask, scale=cfg.softmax_scale)[..., :Dv]


def attend_absorbed(q_nope, q_pe, c_kv, k_pe, mask, lp, cfg: DeepSeekConfig):
    """The same attention as `attend_expanded`, with `w_uk` folded into the query and `w_uv` into the
    output, so per-head keys and values are never formed (the decode form)."""
    q_lat = jnp.einsum("btnk,rnk->btnr", q_nope, lp["w_uk"])
    scores = (jnp.einsum("btnr,bsr->bnts", q_lat, c_kv, preferred_element_type=jnp.float32)
              + jnp.einsum("btnr,bsr->bnts", q_pe, k_pe, preferred_element_type=jnp.float32)) * cfg.softmax_scale
    probs = _softmax_where(scores, mask[:, None], c_kv.dtype)
    return jnp.einsum("btnr,rnv->btnv", jnp.einsum("bnts,bsr->btnr", probs, c_kv), lp["w_uv"])


def output(attn, lp):
    """o_proj: attn [B, T, N, Dv] -> [B, T, D]."""
    return jnp.einsum("btnv,nvd->btd", attn, lp["wo"])
