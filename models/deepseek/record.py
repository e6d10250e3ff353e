"""The per-token cache record of the DeepSeek family: latent | RoPE key | indexer key, as one vector.

Model-dtype layout: `[R + Dr + Hi]` in `cfg.dtype`. FP8 layout (`kv_cache_dtype="fp8"`, bytes):
`[R fp8 | R/128 fp32 scales | Dr bf16 | Hi fp8 | 1 fp32 scale]`, 656 + 132 B for the real shape.
Every layer computes attention from `unpack(pack(...))`, so a token's own record and a cached one
are the same numbers and a prefix-split prefill equals a full one for either layout.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from models.deepseek.config import DeepSeekConfig

FP8_MAX = 448.0  # largest finite float8_e4m3fn


def _bytes(x, dtype):
    """x [..., n] as its bytes [..., n * itemsize] (uint8)."""
    b = jax.lax.bitcast_convert_type(x.astype(dtype), jnp.uint8)
    return b.reshape(*x.shape[:-1], -1)


def _from_bytes(b, dtype, n: int):
    """Inverse of `_bytes`: b [..., n * itemsize] uint8 -> [..., n] of dtype."""
    size = jnp.dtype(dtype).itemsize
    return jax.lax.bitcast_convert_type(b.reshape(*b.shape[:-1], n, size) if size > 1 else b, dtype)


def _quant(x, group: int):
    """x [..., n] -> (fp8 bytes [..., n], fp32 scale bytes [..., 4 n/group]): one scale per `group` values."""
    g = x.astype(jnp.float32).reshape(*x.shape[:-1], -1, group)
    scale = jnp.maximum(jnp.max(jnp.abs(g), axis=-1, keepdims=True) / FP8_MAX, 1e-12)
    q = (g / scale).astype(jnp.float8_e4m3fn).reshape(x.shape)
    return _bytes(q, jnp.float8_e4m3fn), _bytes(scale[..., 0], jnp.float32)


def _dequant(q_bytes, scale_bytes, n: int, group: int, dtype):
    q = _from_bytes(q_bytes, jnp.float8_e4m3fn, n).astype(jnp.float32).reshape(*q_bytes.shape[:-1], -1, group)
    scale = _from_bytes(scale_bytes, jnp.float32, n // group)[..., None]
    return (q * scale).reshape(*q_bytes.shape[:-1], n).astype(dtype)


def pack(c_kv, k_pe, k_idx, cfg: DeepSeekConfig):
    """The record [B, T, *cfg.kv_record_shape] of c_kv [B, T, R], k_pe [B, T, Dr], k_idx [B, T, Hi]."""
    if cfg.kv_cache_dtype != "fp8":
        record = jnp.concatenate([c_kv, k_pe, k_idx], axis=-1).astype(cfg.jnp_dtype)
    else:
        lat, lat_scale = _quant(c_kv, cfg.fp8_group)
        idx, idx_scale = _quant(k_idx, cfg.index_head_dim)
        record = jnp.concatenate([lat, lat_scale, _bytes(k_pe, jnp.bfloat16), idx, idx_scale], axis=-1)
    # The barrier keeps the compiler from folding a later unpack into this pack: XLA's GPU backend
    # otherwise drops the rounding of a fused round trip (its excess-precision rewrites: FP8 seen on an
    # H200; a float32 -> bfloat16 -> float32 pair is one it removes too), so a token would attend to its
    # own record unrounded and to a cached one rounded.
    return jax.lax.optimization_barrier(record)


def unpack(record, cfg: DeepSeekConfig):
    """(c_kv [.., R], k_pe [.., Dr], k_idx [.., Hi]) in the model dtype from records [.., *kv_record_shape]."""
    R, Dr, Hi = cfg.record_parts
    if cfg.kv_cache_dtype != "fp8":
        return record[..., :R], record[..., R:R + Dr], record[..., R + Dr:]
    dt = cfg.jnp_dtype
    cuts = [R, 4 * (R // cfg.fp8_group), 2 * Dr, Hi, 4]
    ends = [sum(cuts[:i + 1]) for i in range(len(cuts))]
    lat, lat_s, pe, idx, idx_s = (record[..., e - c:e] for c, e in zip(cuts, ends))
    return (_dequant(lat, lat_s, R, cfg.fp8_group, dt), _from_bytes(pe, jnp.bfloat16, Dr).astype(dt),
            _dequant(idx, idx_s, Hi, Hi, dt))
