"""The DeepSeek-V3.2 family's reference forward (`models.reference_logits`): NumPy in float64, no cache,
no padding, written after DeepSeek's own reference `inference/model.py` and apart from the JAX model:
per-head keys `[k_nope, k_pe]`, the indexer's top-k by sorting, MoE one token at a time over its chosen
experts. The tests' oracle for this family; slow beyond the tiny presets."""

from __future__ import annotations

import math

import numpy as np


def _rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps) * w


def _freqs(cfg):
    dim, base = cfg.qk_rope_head_dim, cfg.rope_theta
    inv = 1.0 / base ** (np.arange(0, dim, 2) / dim)
    if cfg.rope_factor > 1:
        corr = lambda r: dim * math.log(cfg.rope_original_max / (r * 2 * math.pi)) / (2 * math.log(base))  # noqa: E731
        low, high = max(math.floor(corr(cfg.beta_fast)), 0), min(math.ceil(corr(cfg.beta_slow)), dim - 1)
        smooth = 1 - np.clip((np.arange(dim // 2) - low) / max(high - low, 1e-3), 0, 1)
        inv = inv / cfg.rope_factor * (1 - smooth) + inv * smooth
    return inv


def _rope(x, pos, cfg, interleaved):
    """x [T, n, Dr] rotated as complex pairs (adjacent when interleaved, else the two halves)."""
    ang = pos[:, None] * _freqs(cfg)[None]  # [T, Dr/2]
    rot = np.exp(1j * ang)[:, None]
    half = x.shape[-1] // 2
    z = x[..., 0::2] + 1j * x[..., 1::2] if interleaved else x[..., :half] + 1j * x[..., half:]
    z = z * rot
    if interleaved:
        return np.stack([z.real, z.imag], -1).reshape(x.shape)
    return np.concatenate([z.real, z.imag], -1)


def _silu(x):
    return x / (1 + np.exp(-x))


def _moe(h, lp, cfg):
    out = np.zeros_like(h)
    E, G = cfg.n_routed_experts, cfg.n_group
    for t in range(h.shape[0]):
        s = 1 / (1 + np.exp(-(h[t] @ lp["router"])))
        c = (s + lp["router_bias"]).reshape(G, E // G)
        groups = np.argsort(-np.sort(c, -1)[:, -2:].sum(-1))[:cfg.topk_group]
        c = np.where(np.isin(np.arange(G), groups)[:, None], c, -np.inf).reshape(E)
        idx = np.argsort(-c)[:cfg.n_experts_per_tok]
        w = s[idx] / (s[idx].sum() if cfg.norm_topk_prob else 1.0) * cfg.routed_scaling_factor
        for e, we in zip(idx, w):
            out[t] += we * ((_silu(h[t] @ lp["e_gate"][e]) * (h[t] @ lp["e_up"][e])) @ lp["e_down"][e])
    if cfg.n_shared_experts:
        out += (_silu(h @ lp["s_gate"]) * (h @ lp["s_up"])) @ lp["s_down"]
    return out


def _attention(h, lp, cfg, pos):
    T, Dn = h.shape[0], cfg.qk_nope_head_dim
    qr = _rms(h @ lp["wq_a"], lp["q_norm"], cfg.norm_eps) if cfg.q_lora_rank else h
    q = np.einsum("tr,rnk->tnk", qr, lp["wq_b"] if cfg.q_lora_rank else lp["wq"])
    q = np.concatenate([q[..., :Dn], _rope(q[..., Dn:], pos, cfg, True)], -1)
    kv = h @ lp["wkv_a"]
    c = _rms(kv[:, :cfg.kv_lora_rank], lp["kv_norm"], cfg.norm_eps)
    k_pe = _rope(kv[:, None, cfg.kv_lora_rank:], pos, cfg, True)
    k = np.concatenate([np.einsum("sr,rnk->snk", c, lp["w_uk"]),
                        np.broadcast_to(k_pe, (T, cfg.n_heads, cfg.qk_rope_head_dim))], -1)
    v = np.einsum("sr,rnv->snv", c, lp["w_uv"])
    scores = np.einsum("tnk,snk->nts", q, k) * cfg.softmax_scale
    causal = np.tril(np.ones((T, T), bool))
    # Lightning indexer: RoPE part first, half-split layout; LayerNorm'd key; ReLU-weighted heads.
    Dr = cfg.qk_rope_head_dim
    iq = np.einsum("tr,rnh->tnh", qr, lp["idx_wq"])
    iq = np.concatenate([_rope(iq[..., :Dr], pos, cfg, False), iq[..., Dr:]], -1)
    ik = h @ lp["idx_wk"]
    ik = (ik - ik.mean(-1, keepdims=True)) / np.sqrt(ik.var(-1, keepdims=True) + 1e-6) * lp["idx_k_norm"] \
        + lp["idx_k_bias"]
    ik = np.concatenate([_rope(ik[:, None, :Dr], pos, cfg, False)[:, 0], ik[:, Dr:]], -1)
    w = h @ lp["idx_w"] * cfg.index_n_heads ** -0.5 * cfg.index_head_dim ** -0.5
    iscore = np.einsum("tn,tns->ts", w, np.maximum(np.einsum("tnh,sh->tns", iq, ik), 0))
    iscore = np.where(causal, iscore, -np.inf)
    keep = np.zeros((T, T), bool)
    for t in range(T):
        keep[t, np.argsort(-iscore[t], kind="stable")[:min(cfg.index_topk, t + 1)]] = True
    scores = np.where(causal & keep, scores, -np.inf)
    p = np.exp(scores - scores.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("nts,snv,nvd->td", p, v, lp["wo"])


def reference_logits(params, cfg, tokens) -> np.ndarray:
    """float64 logits [B, T, V] of tokens [B, T] from params (any array type)."""
    P = {k: np.asarray(v, np.float64) for k, v in params.items() if k != "layers"}
    layers = [{k: np.asarray(v, np.float64) for k, v in lp.items()} for lp in params["layers"]]
    out = []
    for row in np.asarray(tokens):
        pos = np.arange(len(row), dtype=np.float64)
        x = P["embed"][row]
        for lp in layers:
            x = x + _attention(_rms(x, lp["attn_norm"], cfg.norm_eps), lp, cfg, pos)
            h = _rms(x, lp["mlp_norm"], cfg.norm_eps)
            x = x + (_moe(h, lp, cfg) if "router" in lp
                     else (_silu(h @ lp["w_gate"]) * (h @ lp["w_up"])) @ lp["w_down"])
        w = P["embed"].T if cfg.tie_embeddings else P["lm_head"]
        out.append(_rms(x, P["final_norm"], cfg.norm_eps) @ w)
    return np.stack(out)
