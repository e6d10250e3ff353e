"""The cost model of any family's config: KV bytes per token and the FLOPs and cache bytes of prefill and
decode, from the family's cost terms (`cfg.cost_terms()`, each family's `costs` module).

Used by the scheduler's profiles, the simulator and the benchmarks (fraction of peak); imports without
JAX. FLOPs count multiply-adds as 2; attention counts QK^T and PV over the attended positions: every
visible one, or at most `window` of them under sparse attention (DeepSeek's DSA), where an indexer
scores every visible position.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class CostTerms:
    """The per-token and per-(token x position) terms a cost model is made of (all layers)."""
    linear_flops: float  # per new token: every weight matmul (MoE: the activated experts only)
    attn_flops: float  # per (new token x attended position)
    window: int | None  # sparse attention: at most this many attended positions per token
    indexer_flops: float  # per (new token x visible position)
    kv_bytes_per_token: float  # the cache a query attends to (DeepSeek: latent + RoPE key)
    indexer_bytes_per_token: float  # the indexer's keys (read over the whole context)


def kv_bytes_per_token(cfg) -> int:
    """Bytes of one token's cache record over all layers (K and V; latent, RoPE and indexer keys)."""
    return cfg.n_layers * cfg.kv_record_bytes


def cost_terms(cfg) -> CostTerms:
    return cfg.cost_terms()


def linear_flops_per_token(cfg) -> float:
    """FLOPs of every weight matmul one token goes through (DeepSeek: activated experts only)."""
    return cost_terms(cfg).linear_flops


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
    dense attention, every record; sparse, the indexer keys of every position and the attended part of
    the `window` selected ones."""
    t = cost_terms(cfg)
    if t.window is None:
        return (context + 1) * t.kv_bytes_per_token
    return (context + 1) * t.indexer_bytes_per_token + min(context + 1, t.window) * t.kv_bytes_per_token
