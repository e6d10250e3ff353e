"""The cost model of any family's config: KV bytes per token and the FLOPs and cache bytes of prefill and
decode, from the family's cost terms (`cfg.cost_terms()`, each family's `costs` module), and what serving
the model costs as the family deploys it (`serving_costs`: the served cache layout, weight and expert
bytes, expert-parallel traffic), which the simulator's cost model asks the family for instead of knowing
any family's fields.

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


@dataclasses.dataclass(frozen=True)
class ServingCosts:
    """What serving a model costs as its family deploys it (each family's `costs.serving_costs`)."""
    config: object  # the config as served (DeepSeek: its FP8 cache record, the production layout)
    terms: CostTerms  # of `config`
    weight_bytes: float  # weights every GPU of one model copy holds (and a decode step reads): all but routed experts
    expert_weight_bytes: float = 0.0  # routed experts, split over an expert-parallel group
    ep_bytes_per_token: float = 0.0  # expert-parallel dispatch + combine bytes one token moves per forward
    moe_layers: int = 0  # layers with routed experts (an expert-parallel all-to-all each)


def serving_costs(cfg) -> ServingCosts:
    return cfg.serving_costs()


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
