"""Cost terms, serving costs and parameter count of the dense GQA family (`models.costs`; imports without
JAX)."""

from __future__ import annotations

from models.costs import CostTerms, ServingCosts, kv_bytes_per_token
from models.dense.config import ModelConfig


def cost_terms(cfg: ModelConfig) -> CostTerms:
    """Q/K/V/O and SwiGLU matmuls plus the LM head per token; QK^T and PV over every visible position."""
    D, N, K, H, F = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffw
    per_layer = 2 * D * (N * H + 2 * K * H) + 2 * N * H * D + 2 * 3 * D * F
    linear = cfg.n_layers * per_layer + 2 * D * cfg.vocab
    return CostTerms(linear, 4.0 * cfg.n_layers * N * H, None, 0.0, kv_bytes_per_token(cfg), 0.0)


def param_count(cfg: ModelConfig) -> int:
    """Parameters of the config, without JAX (equals `models.param_count`, which counts the declarations)."""
    D, N, K, H, F = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffw
    layer = 2 * D + D * (N + 2 * K) * H + N * H * D + 3 * D * F + (N + 2 * K) * H * cfg.qkv_bias
    return cfg.n_layers * layer + cfg.vocab * D * (1 if cfg.tie_embeddings else 2) + D


def serving_costs(cfg: ModelConfig) -> ServingCosts:
    """Served as configured: weights in the config's dtype on every GPU of a copy; no experts."""
    return ServingCosts(cfg, cost_terms(cfg), float(param_count(cfg) * cfg.jnp_dtype.itemsize))
