"""DeepSeek Sparse Attention (V3.2): the lightning indexer and top-k selection of past tokens.

Each query scores every visible position with `sum_h w_h * relu(q_h . k)` over its own indexer
heads (Ni heads of Hi dims; one shared key per token, LayerNorm'd, RoPE on its first Dr dims in the
half-split layout), and main attention then reads only the `index_topk` best positions. With no
more visible positions than `index_topk` every one is selected, so DSA equals dense attention.
The indexer key of each token is part of its cache record (`models.deepseek.record`).

DeepSeek's reference also applies a Hadamard rotation to q and k before FP8-quantising them;
it is orthogonal, so it leaves the scores unchanged and is left out here.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from models.deepseek.config import DeepSeekConfig
from models.layers import rope_halves


def layer_norm(x, w, b, eps=1e-6):
    x32 = x.astype(jnp.float32)
    mean = jnp.mean(x32, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
    return ((x32 - mean) * jax.lax.rsqrt(var + eps) * w + b).astype(x.dtype)


def _rope_front(x, cos, sin, cfg: DeepSeekConfig):
    """RoPE on the first Dr dims of x [B, T, n, Hi] (the indexer puts its RoPE part first)."""
    Dr = cfg.qk_rope_head_dim
    return jnp.concatenate([rope_halves(x[..., :Dr], cos, sin), x[..., Dr:]], axis=-1)


def index_query(qr, h, lp, cos, sin, cfg: DeepSeekConfig):
    """Indexer queries [B, T, Ni, Hi] (from the Q-LoRA latent qr, or h without Q-LoRA) and head
    weights [B, T, Ni] float32 (softmax scale and 1/sqrt(Ni) folded in)."""
    q = _rope_front(jnp.einsum("btr,rnh->btnh", qr, lp["idx_wq"]), cos, sin, cfg)
    w = jnp.einsum("btd,dn->btn", h.astype(jnp.float32), lp["idx_w"].astype(jnp.float32))
    return q, w * (cfg.index_n_heads ** -0.5 * cfg.index_head_dim ** -0.5)


def index_key(h, lp, cos, sin, cfg: DeepSeekConfig):
    """The indexer key [B, T, Hi] of h [B, T, D] (what the cache record stores)."""
    k = layer_norm(jnp.einsum("btd,dh->bth", h, lp["idx_wk"]), lp["idx_k_norm"], lp["idx_k_bias"])
    return _rope_front(k[:, :, None], cos, sin, cfg)[:, :, 0]


def index_scores(q, w, keys):
    """Scores [B, T, S] float32 of queries q [B, T, Ni, Hi] with weights w [B, T, Ni] over keys [B, S, Hi]."""
    dots = jnp.einsum("btnh,bsh->btns", q, keys, preferred_element_type=jnp.float32)
    return jnp.einsum("btns,btn->bts", jax.nn.relu(dots), w)


def top_k_positions(scores, visible, k: int):
    """The `k` best visible positions per query: indices [B, T, k'] and their validity [B, T, k']
    (k' = min(k, S); a query with fewer than k visible positions gets invalid slots)."""
    k = min(k, scores.shape[-1])
    masked = jnp.where(visible, scores, -jnp.inf)
    _, idx = jax.lax.top_k(masked, k)
    return idx, jnp.take_along_axis(visible, idx, axis=-1)


def select_mask(scores, visible, k: int):
    """Boolean [B, T, S]: the top-k visible positions of each query (all visible ones when S <= k)."""
    if scores.shape[-1] <= k:
        return visible
    idx, ok = top_k_positions(scores, visible, k)
    B, T, _ = idx.shape
    sel = jnp.zeros(visible.shape, bool)
    return sel.at[jnp.arange(B)[:, None, None], jnp.arange(T)[None, :, None], idx].set(ok)
