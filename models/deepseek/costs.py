"""Cost terms of the DeepSeek-V3.2 family (`models.costs`; imports without JAX), and its parameter
counts without JAX.

MLA in the absorbed form DeepSeek's sparse kernels use (scores over the latent + RoPE key, R + Dr
dims; values are the latent, R dims; `w_uk` / `w_uv` folded into query and output per token),
attention over at most `index_topk` positions per query, the lightning indexer over every visible
position (Ni x Hi per pair), and only the activated experts (`n_experts_per_tok` routed + the shared
ones) in the linear work. Served (`serving_costs`) in the production layout, with expert parallelism.
"""

from __future__ import annotations

from models.costs import CostTerms, ServingCosts
from models.deepseek.config import DeepSeekConfig


def _layer_macs(cfg: DeepSeekConfig, layer: int) -> int:
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


def cost_terms(cfg: DeepSeekConfig) -> CostTerms:
    """The cache bytes split into the attended part (latent + RoPE key) and the indexer keys."""
    L, N, R, Dr = cfg.n_layers, cfg.n_heads, cfg.kv_lora_rank, cfg.qk_rope_head_dim
    linear = 2 * sum(_layer_macs(cfg, i) for i in range(L)) + 2 * cfg.d_model * cfg.vocab
    parts = cache_bytes_per_token_layer(cfg)
    indexer = 2.0 * L * cfg.index_n_heads * cfg.index_head_dim
    return CostTerms(linear, 2.0 * L * N * (R + Dr + R), cfg.index_topk, indexer, L * (parts["latent"] + parts["rope"]),
                     L * parts["indexer"])


def cache_bytes_per_token_layer(cfg: DeepSeekConfig) -> dict[str, int]:
    """Bytes of one token's record in one layer by part: latent (with its FP8 scales), RoPE key, indexer key."""
    R, Dr, Hi = cfg.record_parts
    if cfg.kv_cache_dtype == "fp8":
        return {"latent": R + 4 * (R // cfg.fp8_group), "rope": 2 * Dr, "indexer": Hi + 4}
    size = cfg.jnp_dtype.itemsize
    return {"latent": R * size, "rope": Dr * size, "indexer": Hi * size}


def param_count(cfg: DeepSeekConfig) -> int:
    """Parameters of the config, without JAX (equals `models.param_count`, which counts the declarations)."""
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


def serving_costs(cfg: DeepSeekConfig) -> ServingCosts:
    """The production layout (../shared/traces/README.md §4): an FP8 cache (V3.2: 656 B of latent + RoPE key
    per token and layer, 132 B of indexer key) and FP8 weights (1 B per parameter), the routed experts split
    over an expert-parallel group. Expert-parallel traffic per token and MoE layer: the top-k experts x
    d_model, FP8 dispatch (1 B) + BF16 combine (2 B) (DeepSeek-V3 report §3.4)."""
    cfg = cfg.replace(kv_cache_dtype="fp8")
    experts, moe_layers = expert_param_count(cfg), sum(cfg.is_moe_layer(i) for i in range(cfg.n_layers))
    return ServingCosts(cfg, cost_terms(cfg), weight_bytes=param_count(cfg) - experts, expert_weight_bytes=experts,
                        ep_bytes_per_token=float(moe_layers * cfg.n_experts_per_tok * cfg.d_model * 3),
                        moe_layers=moe_layers)
