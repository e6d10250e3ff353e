"""Cost model of a config: KV bytes per token and FLOPs of prefill and decode, for both model families.

Used by the scheduler's profiles, the simulator and the benchmarks (fraction of peak); imports
without JAX. FLOPs count multiply-adds as 2; attention counts QK^T and PV over the visible context.

DeepSeek family (`DeepSeekConfig`): MLA in the absorbed form DeepSeek's sparse kernels use (scores
over the latent + RoPE key, R + Dr dims; values are the latent, R dims; `w_uk` / `w_uv` folded into
query and output per token), attention over at most `index_topk` positions per query, the
lightning indexer over every visible position (Ni x Hi per pair), and only the activated experts
(`n_experts_per_tok` routed + the shared ones) in the linear work.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from models.config import ModelConfig
from models.deepseek_config import DeepSeekConfig


def kv_bytes_per_token(cfg) -> int:
    """Bytes of one token's cache record over all layers (K and V; latent, RoPE and indexer keys)."""
    if isinstance(cfg, DeepSeekConfig):
        return cfg.n_layers * cfg.kv_record_bytes
    return cfg.n_layers * 2 * cfg.n_kv_heads * cfg.head_dim * np.dtype(cfg.jnp_dtype).itemsize


def _deepseek_layer_macs(cfg: DeepSeekConfig, layer: int) -> int:
    D, N, R, Rq = cfg.d_model, cfg.n_heads, cfg.kv_lora_rank, cfg.q_lora_rank
    Dn, Dr, Dv, Ni, Hi = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim, cfg.index_n_heads, \
        cfg.index_head_dim
    q = D * Rq + Rq * N * (Dn + Dr) if Rq else D * N * (Dn + Dr)
    attn = q + D * (R + Dr) + N * R * (Dn + Dv) + N * Dv * D
    indexer = (Rq or D) * Ni * Hi + D * Hi + D * Ni
    if not cfg.is_moe_layer(layer):
        return attn + indexer + 3 * D * cfg.ffw
    experts = cfg.n_experts_per_tok + cfg.n_shared_experts
    return attn + indexer + D * cfg.n_routed_experts + 3 * D * cfg.moe_ffw * experts


def linear_flops_per_token(cfg) -> int:
    """FLOPs of every weight matmul one token goes through (DeepSeek: activated experts only)."""
    if isinstance(cfg, DeepSeekConfig):
        return 2 * sum(_deepseek_layer_macs(cfg, i) for i in range(cfg.n_layers)) + 2 * cfg.d_model * cfg.vocab
    D, N, K, H, F = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffw
    per_layer = 2 * D * (N * H + 2 * K * H) + 2 * N * H * D + 2 * 3 * D * F
    return cfg.n_layers * per_layer + 2 * D * cfg.vocab


@dataclasses.dataclass(frozen=True)
class CostTerms:
    """The per-token and per-(token x position) terms a cost model is made of (all layers)."""
    linear_flops: float  # per new token
    attn_flops: float  # per (new token x attended position)
    window: int | None  # sparse attention: at most this many attended positions per token
    indexer_flops: float  # per (new token x visible position)
    kv_bytes_per_token: float  # the cache a query attends to (DeepSeek: latent + RoPE key)
    indexer_bytes_per_token: float  # the indexer's keys (read over the whole context)


def cost_terms(cfg) -> CostTerms:
    """The terms of `cfg`'s cost model; DeepSeek's cache bytes split into attended part and indexer keys."""
    if isinstance(cfg, ModelConfig):
        return CostTerms(linear_flops_per_token(cfg), 4.0 * cfg.n_layers * cfg.n_heads * cfg.head_dim, None, 0.0,
                         kv_bytes_per_token(cfg), 0.0)
    L, N, R, Dr = cfg.n_layers, cfg.n_heads, cfg.kv_lora_rank, cfg.qk_rope_head_dim
    parts = cache_bytes_per_token_layer(cfg)
    return CostTerms(linear_flops_per_token(cfg), 2.0 * L * N * (R + Dr + R), cfg.index_topk,
                     2.0 * L * cfg.index_n_heads * cfg.index_head_dim, L * (parts["latent"] + parts["rope"]),
                     L * parts["indexer"])


def cache_bytes_per_token_layer(cfg: DeepSeekConfig) -> dict[str, int]:
    """Bytes of one token's record in one layer by part: latent (with its FP8 scales), RoPE key, indexer key."""
    R, Dr, Hi = cfg.record_parts
    if cfg.kv_cache_dtype == "fp8":
        return {"latent": R + 4 * (R // cfg.fp8_group), "rope": 2 * Dr, "indexer": Hi + 4}
    size = cfg.jnp_dtype.itemsize
    return {"latent": R * size, "rope": Dr * size, "indexer": Hi * size}


def _visible(cached: int, new: int, window: int | None) -> float:
    """Sum over the new tokens of min(position, window) (positions cached+1 .. cached+new)."""
    def tri(n: int) -> float:  # sum_{p=1..n} min(p, window)
        return n * (n + 1) / 2 if window is None or n <= window else window * (window + 1) / 2 + (n - window) * window
    return tri(cached + new) - tri(cached)


def prefill_flops(cfg, new: int, cached: int = 0) -> float:
    """FLOPs to prefill `new` tokens over `cached` tokens (causal among the new ones)."""
    t = cost_terms(cfg)
    return new * t.linear_flops + t.attn_flops * _visible(cached, new, t.window) \
        + t.indexer_flops * _visible(cached, new, None)


def decode_flops(cfg, context: int) -> float:
    """FLOPs of one decode step for one sequence that already holds `context` tokens."""
    return prefill_flops(cfg, 1, context)


def decode_bytes_per_step(cfg, context: int) -> float:
    """Cache bytes one decode step reads for one sequence of `context` tokens (weights not included):
    dense, every K and V; DeepSeek, the indexer keys of every position and the latent and RoPE key of
    the `index_topk` selected ones."""
    t = cost_terms(cfg)
    if t.window is None:
        return (context + 1) * t.kv_bytes_per_token
    return (context + 1) * t.indexer_bytes_per_token + min(context + 1, cfg.index_topk) * t.kv_bytes_per_token


def param_count(cfg) -> int:
    """Parameters of a DeepSeek config, without JAX (equals `models.deepseek.param_count`)."""
    D, N, R, Rq = cfg.d_model, cfg.n_heads, cfg.kv_lora_rank, cfg.q_lora_rank
    Dn, Dr, Dv, Ni, Hi = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim, cfg.index_n_heads, \
        cfg.index_head_dim
    q = D * Rq + Rq + Rq * N * (Dn + Dr) if Rq else D * N * (Dn + Dr)
    attn = D + q + D * (R + Dr) + R + R * N * (Dn + Dv) + N * Dv * D + (Rq or D) * Ni * Hi + D * Hi + 2 * Hi + D * Ni
    dense = D + 3 * D * cfg.ffw
    moe = D + D * cfg.n_routed_experts + cfg.n_routed_experts + 3 * D * cfg.moe_ffw * (
        cfg.n_routed_experts + cfg.n_shared_experts)
    layers = sum(attn + (moe if cfg.is_moe_layer(i) else dense) for i in range(cfg.n_layers))
    return layers + cfg.vocab * D * (1 if cfg.tie_embeddings else 2) + D


def expert_param_count(cfg: DeepSeekConfig) -> int:
    """Parameters of the routed experts (what expert parallelism splits)."""
    moe_layers = sum(cfg.is_moe_layer(i) for i in range(cfg.n_layers))
    return moe_layers * cfg.n_routed_experts * 3 * cfg.d_model * cfg.moe_ffw
