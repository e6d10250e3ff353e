"""Cost model of a config: KV bytes per token and FLOPs of prefill and decode.

Used by the scheduler's profiles, the simulator and the benchmarks (fraction of peak).
FLOPs count multiply-adds as 2; attention counts QK^T and PV over the visible context.
"""

from __future__ import annotations

import numpy as np

from models.config import ModelConfig


def kv_bytes_per_token(cfg: ModelConfig) -> int:
    """Bytes of K and V for one token over all layers."""
    return cfg.n_layers * 2 * cfg.n_kv_heads * cfg.head_dim * np.dtype(cfg.jnp_dtype).itemsize


def linear_flops_per_token(cfg: ModelConfig) -> int:
    D, N, K, H, F = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffw
    per_layer = 2 * D * (N * H + 2 * K * H) + 2 * N * H * D + 2 * 3 * D * F
    return cfg.n_layers * per_layer + 2 * D * cfg.vocab


def prefill_flops(cfg: ModelConfig, new: int, cached: int = 0) -> float:
    """FLOPs to prefill `new` tokens over `cached` tokens (causal among the new ones)."""
    visible = new * cached + new * (new + 1) / 2  # sum over new tokens of their context length
    return new * linear_flops_per_token(cfg) + 4.0 * cfg.n_layers * cfg.n_heads * cfg.head_dim * visible


def decode_flops(cfg: ModelConfig, context: int) -> float:
    """FLOPs of one decode step for one sequence that already holds `context` tokens."""
    return prefill_flops(cfg, 1, context)
