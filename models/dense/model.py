"""The dense GQA family (Llama / Qwen2) as pure functions over a params pytree: declarations, the one
layer implementation, the decode layer, and a cache-free reference forward.

`forward_layer` is the one layer implementation: the fused forward and the layerwise driver
(`models.inference`, `models.layerwise`) both loop over it, and `decode_layer` is built from its three
pieces (`project_qkv`, `models.layers.attend`, `finish_layer`), so they agree by construction.

KV layout: a layer's records are `[B, S, 2, K, H]` (keys after RoPE, then values). The decode cache is
head-major `[L, 2, B, K, C, H]` or sequence-major `[L, 2, B, C, K, H]`, whichever its attention reads in
place (`cache_layout`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from models.cache import CacheLayout
from models.dense.config import ModelConfig
from models.layers import (
    Q_AXES,
    X_AXES,
    attend,
    cos_sin,
    fused_implementation,
    head,
    prefill_mask,
    rms_norm,
    rope_halves,
    swiglu,
)
from models.params import Decl, Params
from models.sharding import constrain

KV_AXES = ("cache_batch", "cache_seq", None, "kv_heads", None)  # a layer's records [B, S, 2, K, H], prefix or new
HEAD_MAJOR = CacheLayout("head-major", (0, 3, 1, 4, 2, 5),  # [L, 2, B, K, C, H]
                         ("layers", None, "cache_batch", "kv_heads", "cache_seq", None))
SEQ_MAJOR = CacheLayout("sequence-major", (0, 3, 1, 2, 4, 5),  # [L, 2, B, C, K, H]
                        ("layers", None, "cache_batch", "cache_seq", "kv_heads", None))


def _layer_decls(cfg: ModelConfig) -> dict[str, Decl]:
    D, N, K, H, F = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffw
    decls = {
        "attn_norm": Decl((D,), ("embed",), "ones"),
        "wq": Decl((D, N, H), ("embed", "heads", None), "normal"),
        "wk": Decl((D, K, H), ("embed", "kv_heads", None), "normal"),
        "wv": Decl((D, K, H), ("embed", "kv_heads", None), "normal"),
        "wo": Decl((N, H, D), ("heads", None, "embed"), "normal", fan_in_dims=(0, 1)),
        "mlp_norm": Decl((D,), ("embed",), "ones"),
        "w_gate": Decl((D, F), ("embed", "ffw"), "normal"),
        "w_up": Decl((D, F), ("embed", "ffw"), "normal"),
        "w_down": Decl((F, D), ("ffw", "embed"), "normal"),
    }
    if cfg.qkv_bias:
        decls["bq"] = Decl((N, H), ("heads", None), "zeros")
        decls["bk"] = Decl((K, H), ("kv_heads", None), "zeros")
        decls["bv"] = Decl((K, H), ("kv_heads", None), "zeros")
    return decls


def declare(cfg: ModelConfig) -> Params:
    """The declaration pytree: same structure as the params, with a `Decl` at each leaf."""
    tree: Params = {
        "embed": Decl((cfg.vocab, cfg.d_model), ("vocab", "embed"), "embed"),
        "final_norm": Decl((cfg.d_model,), ("embed",), "ones"),
        "layers": [_layer_decls(cfg) for _ in range(cfg.n_layers)],
    }
    if not cfg.tie_embeddings:
        tree["lm_head"] = Decl((cfg.d_model, cfg.vocab), ("embed", "vocab"), "normal")
    return tree


def rope_inv_freq(cfg: ModelConfig) -> np.ndarray:
    """Inverse RoPE frequencies [H/2], with Llama 3 scaling when `cfg.rope_scaling` is set."""
    H = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (np.arange(0, H, 2, dtype=np.float64) / H))
    if cfg.rope_scaling is not None:
        s = cfg.rope_scaling
        factor, low, high, orig = s.factor, s.low_freq_factor, s.high_freq_factor, s.original_max_position
        wavelen = 2 * np.pi / inv
        smooth = np.clip((orig / wavelen - low) / (high - low), 0.0, 1.0)
        scaled = np.where(wavelen > orig / low, inv / factor, inv)
        mid = (wavelen <= orig / low) & (wavelen >= orig / high)
        inv = np.where(mid, (1 - smooth) * inv / factor + smooth * inv, scaled)
    return inv.astype(np.float32)


def apply_rope(x, positions, cfg: ModelConfig):
    """Rotate x [B, T, n, H] by positions [B, T] (half-split layout, as in HF Llama/Qwen2)."""
    return rope_halves(x, *cos_sin(positions, rope_inv_freq(cfg)))


def project_qkv(x, lp, positions, cfg: ModelConfig):
    """Attention inputs of x [B, T, D]: q [B, T, N, H] and kv [B, T, 2, K, H] (RoPE applied)."""
    h = rms_norm(x, lp["attn_norm"], cfg.norm_eps)
    q = jnp.einsum("btd,dnh->btnh", h, lp["wq"])
    k = jnp.einsum("btd,dkh->btkh", h, lp["wk"])
    v = jnp.einsum("btd,dkh->btkh", h, lp["wv"])
    if cfg.qkv_bias:
        q, k, v = q + lp["bq"], k + lp["bk"], v + lp["bv"]
    kv = jnp.stack([apply_rope(k, positions, cfg), v], axis=2)
    return constrain(apply_rope(q, positions, cfg), Q_AXES), constrain(kv, KV_AXES)


def attention_implementation(cfg: ModelConfig, decode: bool = False) -> str:
    """The implementation of `cfg`'s attention in prefill's form or decode's (`fused_implementation`)."""
    return fused_implementation(cfg.jnp_dtype, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, decode)


def cache_layout(cfg: ModelConfig) -> CacheLayout:
    """The layout of a new decode cache: sequence-major when decode's attention is cuDNN's, which reads
    keys and values only as [B, C, K, H]; otherwise head-major, which XLA's attention dots read in place
    (a sequence-major cache would cost them a transposed copy of every layer's KV per step)."""
    return SEQ_MAJOR if attention_implementation(cfg, decode=True) == "cudnn" else HEAD_MAJOR


def decode_implementation(cfg: ModelConfig, layout: CacheLayout) -> str:
    """The attention implementation a decode step over a cache of this layout runs: cuDNN's needs the
    sequence-major one, so a head-major cache always runs XLA's."""
    return attention_implementation(cfg, decode=True) if layout == SEQ_MAJOR else "xla"


def attention(cfg: ModelConfig) -> dict[str, str]:
    """What prefill's and decode's attention run on this backend, and the decode cache's layout."""
    layout = cache_layout(cfg)
    return {"prefill": attention_implementation(cfg), "decode": decode_implementation(cfg, layout),
            "decode_cache": layout.name}


def finish_layer(x, attn, lp, cfg: ModelConfig):
    """Output projection, residuals and the SwiGLU MLP: x [B, T, D], attn [B, T, N, H] -> x."""
    x = constrain(x + jnp.einsum("btnh,nhd->btd", attn, lp["wo"]), X_AXES)
    h = rms_norm(x, lp["mlp_norm"], cfg.norm_eps)
    return constrain(x + swiglu(h, lp["w_gate"], lp["w_up"], lp["w_down"]), X_AXES)


def forward_layer(x, lp, positions, cfg: ModelConfig, prefix_kv, prefix_len):
    """One decoder layer over new tokens, attending to a cached prefix and causally to themselves.

    x [B, T, D]; positions [B, T] (= prefix_len + t); prefix_kv [B, S, 2, K, H] of which the
    first prefix_len[b] entries are valid (S may be 0); returns (x [B, T, D], kv [B, T, 2, K, H]).
    """
    prefix_kv = constrain(prefix_kv, KV_AXES)
    q, kv = project_qkv(x, lp, positions, cfg)
    keys = jnp.concatenate([prefix_kv[:, :, 0], kv[:, :, 0]], axis=1)  # [B, S+T, K, H]
    vals = jnp.concatenate([prefix_kv[:, :, 1], kv[:, :, 1]], axis=1)
    mask = prefill_mask(prefix_len, prefix_kv.shape[1], x.shape[1])
    return finish_layer(x, attend(q, keys, vals, attention_implementation(cfg), mask), lp, cfg), kv


def decode_layer(x, lp, layer: int, cache, lengths, cfg: ModelConfig, layout: CacheLayout):
    """One layer of a decode step: the new token's K and V are written into the cache at (b, lengths[b])
    first, and attention reads the cache in place (no per-step copy) up to each row's length.
    x [B, 1, D]; cache in `layout`; returns (x, cache)."""
    q, kv = project_qkv(x, lp, lengths[:, None], cfg)
    cache = cache.at[layout.token_index(layer, lengths)].set(kv[:, 0])  # [B, 2, K, H]
    seq_major = layout == SEQ_MAJOR
    keys, vals = (cache[layer, i] if seq_major else cache[layer, i].swapaxes(1, 2) for i in (0, 1))
    attn = attend(q, keys, vals, decode_implementation(cfg, layout), kv_lengths=lengths + 1)
    return finish_layer(x, attn, lp, cfg), cache


def reference_logits(params: Params, cfg: ModelConfig, tokens) -> np.ndarray:
    """A plain, cache-free forward (kv heads repeated, explicit causal mask): the test reference.

    tokens [B, T] -> float32 logits [B, T, V] as a NumPy array. One compiled program per shape.
    """
    return np.asarray(_reference_logits(params, cfg, np.asarray(tokens)))


@functools.partial(jax.jit, static_argnums=1)
def _reference_logits(params: Params, cfg: ModelConfig, tokens):
    B, T = tokens.shape
    pos = jnp.broadcast_to(jnp.arange(T), (B, T))
    x = params["embed"][tokens]
    for lp in params["layers"]:
        h = rms_norm(x, lp["attn_norm"], cfg.norm_eps)
        q, k, v = (jnp.einsum("btd,dnh->btnh", h, lp[w]) for w in ("wq", "wk", "wv"))
        if cfg.qkv_bias:
            q, k, v = q + lp["bq"], k + lp["bk"], v + lp["bv"]
        q, k = apply_rope(q, pos, cfg), apply_rope(k, pos, cfg)
        k, v = (jnp.repeat(a, cfg.q_per_kv, axis=2) for a in (k, v))
        s = jnp.einsum("bqnh,bknh->bnqk", q, k).astype(jnp.float32) / np.sqrt(cfg.head_dim)
        s = jnp.where(jnp.tril(jnp.ones((T, T), bool)), s, -jnp.inf)
        a = jnp.einsum("bnqk,bknh->bqnh", jax.nn.softmax(s, -1).astype(v.dtype), v)
        x = x + jnp.einsum("bqnh,nhd->bqd", a, lp["wo"])
        h = rms_norm(x, lp["mlp_norm"], cfg.norm_eps)
        x = x + (jax.nn.silu(h @ lp["w_gate"]) * (h @ lp["w_up"])) @ lp["w_down"]
    return head(params, cfg, x)
