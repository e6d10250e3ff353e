"""The JAX building blocks every family shares: RMSNorm, RoPE rotations, the SwiGLU MLP, embedding and
output head, the prefill mask (a cached prefix, then causal), and attention through
`jax.nn.dot_product_attention` in the implementation `fused_implementation` picks per form.

Activations name their dims by logical axis (`models.sharding`) and are pinned with `constrain`,
which acts only under an active mesh.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from models.sharding import constrain

X_AXES = ("act_batch", "act_seq", "act_embed")  # x [B, T, D]
Q_AXES = ("act_batch", "act_seq", "heads", None)  # q, attention out [B, T, N, H]
FFW_AXES = ("act_batch", "act_seq", "ffw")  # MLP hidden [B, T, F]
LOGITS_AXES = ("act_batch", "act_seq", "vocab")  # logits [B, T, V]


def rms_norm(x, w, eps):
    x32 = x.astype(jnp.float32)
    return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps) * w).astype(x.dtype)


def cos_sin(positions, inv_freq):
    """cos, sin [B, T, R/2] (float32) of positions [B, T] at inverse frequencies inv_freq [R/2]."""
    angles = positions[..., None].astype(jnp.float32) * inv_freq
    return jnp.cos(angles), jnp.sin(angles)


def rope_halves(x, cos, sin):
    """Rotate pairs (x[i], x[i + R/2]) of x [B, T, n, R] by cos/sin [B, T, R/2] (the half-split layout of
    HF Llama / Qwen2 and of DeepSeek's indexer)."""
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    c, s = cos[:, :, None], sin[:, :, None]
    return jnp.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1).astype(x.dtype)


def rope_interleaved(x, cos, sin):
    """Rotate adjacent pairs (x[2i], x[2i+1]) of x [B, T, n, R] by cos/sin [B, T, R/2] (DeepSeek's MLA layout)."""
    x32 = x.astype(jnp.float32).reshape(*x.shape[:-1], -1, 2)
    c, s = cos[:, :, None], sin[:, :, None]
    out = jnp.stack([x32[..., 0] * c - x32[..., 1] * s, x32[..., 1] * c + x32[..., 0] * s], axis=-1)
    return out.reshape(x.shape).astype(x.dtype)


def swiglu(h, w_gate, w_up, w_down):
    """SwiGLU MLP: h [B, T, D] -> [B, T, D] (hidden [B, T, F])."""
    gate = jax.nn.silu(jnp.einsum("btd,df->btf", h, w_gate))
    hidden = constrain(gate * jnp.einsum("btd,df->btf", h, w_up), FFW_AXES)
    return jnp.einsum("btf,fd->btd", hidden, w_down)


def embed(params, tokens):
    """tokens [B, T] -> x [B, T, D]."""
    return constrain(params["embed"][tokens], X_AXES)


def head(params, cfg, x):
    """x [B, T, D] -> float32 logits [B, T, V]."""
    x = rms_norm(x, params["final_norm"], cfg.norm_eps)
    w = params["embed"].T if cfg.tie_embeddings else params["lm_head"]
    return constrain(jnp.einsum("btd,dv->btv", x, w, preferred_element_type=jnp.float32), LOGITS_AXES)


def prefill_mask(prefix_len, S: int, T: int):
    """Boolean [B, T, S + T]: each new token sees its row's first prefix_len[b] of S cached positions
    and, causally, the new tokens up to itself."""
    B = prefix_len.shape[0]
    in_prefix = jnp.arange(S)[None, None, :] < prefix_len[:, None, None]  # [B, 1, S]
    causal = jnp.arange(T)[None, :, None] >= jnp.arange(T)[None, None, :]  # [1, T, T]
    return jnp.concatenate([jnp.broadcast_to(in_prefix, (B, T, S)), jnp.broadcast_to(causal, (B, T, T))], -1)


def attend(q, keys, vals, implementation: str, mask=None, kv_lengths=None, scale=None):
    """Attention of q [B, T, N, H] over keys/vals [B, S, K, H] (sequence-major; K divides N) where mask
    [B, T, S] (None: everywhere) and position < kv_lengths[b] (None: all S), through
    `jax.nn.dot_product_attention` in `implementation` (from `fused_implementation`); -> [B, T, N, H]."""
    out = jax.nn.dot_product_attention(q, keys, vals, mask=None if mask is None else mask[:, None], scale=scale,
                                       key_value_seq_lengths=kv_lengths, implementation=implementation)
    return constrain(out.astype(vals.dtype), Q_AXES)


@functools.cache
def fused_implementation(dtype, heads: int, kv_heads: int, head_dim: int, decode: bool = False) -> str:
    """"cudnn" when this backend is a GPU, `dtype` 16-bit and cuDNN's fused attention compiles for
    these heads in this form (probed once on a small shape: prefill's 128 queries under a mask, or
    decode's one query over per-row KV lengths), else "xla" (JAX's own default is always XLA)."""
    if jax.default_backend() != "gpu" or jnp.dtype(dtype).itemsize != 2:
        return "xla"
    T, S = (1, 256) if decode else (128, 256)
    q = jax.ShapeDtypeStruct((1, T, heads, head_dim), dtype)
    kv = jax.ShapeDtypeStruct((1, S, kv_heads, head_dim), dtype)
    where = {"key_value_seq_lengths": jax.ShapeDtypeStruct((1,), jnp.int32)} if decode else \
        {"mask": jax.ShapeDtypeStruct((1, 1, T, S), jnp.bool_)}
    try:
        jax.jit(functools.partial(jax.nn.dot_product_attention, implementation="cudnn")).lower(
            q, kv, kv, **where).compile()
    except (ValueError, NotImplementedError, RuntimeError):  # not available for this shape or build
        return "xla"
    return "cudnn"
