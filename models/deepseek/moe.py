"""DeepSeek-V3 mixture of experts: sigmoid router with correction bias, group-limited top-k, shared experts.

Selection uses `sigmoid(h W) + e_score_correction_bias`; the top `topk_group` of `n_group` groups
(each scored by the sum of its two best experts) are kept, then the `n_experts_per_tok` best
experts among them. Gates are the *unbiased* sigmoid scores of the chosen experts, renormalised
when `norm_topk_prob`, times `routed_scaling_factor`.

The routed experts are computed densely over the expert axis with zero gates for the experts a
token did not choose: exact, shape-static, and sharded over the `expert` logical axis (each device
computes its own experts; the combine is a sum XLA reduces across devices). It spends E/k times
the routed FLOPs of a dispatching implementation, which is fine at the CPU sizes this runs at.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from models.deepseek.config import DeepSeekConfig
from models.layers import swiglu


def route(h, lp, cfg: DeepSeekConfig):
    """Gates [B, T, E] float32 of h [B, T, D]: zero except at each token's chosen experts."""
    scores = jax.nn.sigmoid(jnp.einsum("btd,de->bte", h.astype(jnp.float32), lp["router"].astype(jnp.float32)))
    choice = scores + lp["router_bias"].astype(jnp.float32)
    B, T, E = scores.shape
    if cfg.n_group > 1:
        grouped = choice.reshape(B, T, cfg.n_group, E // cfg.n_group)
        group_score = jnp.sum(jax.lax.top_k(grouped, 2)[0], axis=-1)  # [B, T, G]
        _, keep = jax.lax.top_k(group_score, cfg.topk_group)
        kept = jnp.any(keep[..., None] == jnp.arange(cfg.n_group), axis=-2)  # [B, T, G]
        choice = jnp.where(kept[..., None], grouped, -jnp.inf).reshape(B, T, E)
    _, idx = jax.lax.top_k(choice, cfg.n_experts_per_tok)  # [B, T, k]
    weights = jnp.take_along_axis(scores, idx, axis=-1)
    if cfg.norm_topk_prob:
        weights = weights / (jnp.sum(weights, axis=-1, keepdims=True) + 1e-20)
    weights = weights * cfg.routed_scaling_factor
    return jnp.sum(jax.nn.one_hot(idx, E, dtype=jnp.float32) * weights[..., None], axis=-2)


def moe(h, lp, cfg: DeepSeekConfig):
    """Routed plus shared experts of h [B, T, D] -> [B, T, D]."""
    gates = route(h, lp, cfg).astype(h.dtype)
    act = jax.nn.silu(jnp.einsum("btd,edf->btef", h, lp["e_gate"])) * jnp.einsum("btd,edf->btef", h, lp["e_up"])
    out = jnp.einsum("btef,efd->btd", act * gates[..., None], lp["e_down"])
    if cfg.n_shared_experts:
        out = out + swiglu(h, lp["s_gate"], lp["s_up"], lp["s_down"])
    return out
