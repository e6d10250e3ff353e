"""The functional decoder (Llama / Qwen2 family): pure functions over a params pytree.

`forward_layer` is the one layer implementation; the fused `forward` and the layerwise driver
(`Layerwise`) both call it, and `decode_step` is built from its three pieces (`project_qkv`,
`attend_fused`, `finish_layer`), so they agree by construction. Attention of both goes through
`jax.nn.dot_product_attention`, in the implementation `attention_implementation` picks per form.

KV layout: a layer's KV is `[B, S, 2, K, H]` (keys after RoPE, then values); all layers stack
to `[L, B, S, 2, K, H]`, so one sequence's slice `[L, S, 2, K, H]` is a run of Full Blocks. The
decode cache is head-major `[L, 2, B, K, C, H]` or sequence-major `[L, 2, B, C, K, H]`, whichever
its attention reads in place (`decode_seq_major`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from models.config import ModelConfig
from models.params import Params
from models.sharding import constrain

# Logical axes (models.sharding.LOGICAL_RULES) of the activations and caches: pinned with `constrain`,
# which acts only under an active mesh.
X_AXES = ("act_batch", "act_seq", "act_embed")  # x [B, T, D]
Q_AXES = ("act_batch", "act_seq", "heads", None)  # q, attention out [B, T, N, H]
FFW_AXES = ("act_batch", "act_seq", "ffw")  # MLP hidden [B, T, F]
LOGITS_AXES = ("act_batch", "act_seq", "vocab")  # logits [B, T, V]
KV_AXES = ("cache_batch", "cache_seq", None, "kv_heads", None)  # a layer's KV [B, S, 2, K, H], prefix or new
DECODE_CACHE_AXES = ("layers", None, "cache_batch", "kv_heads", "cache_seq", None)  # [L, 2, B, K, C, H]
DECODE_CACHE_AXES_SEQ = ("layers", None, "cache_batch", "cache_seq", "kv_heads", None)  # [L, 2, B, C, K, H]


def rope_inv_freq(cfg: ModelConfig) -> np.ndarray:
    """Inverse RoPE frequencies [H/2], with Llama 3 scaling when `cfg.rope_scaling` is set."""
    H = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (np.arange(0, H, 2, dtype=np.float64) / H))
    if cfg.rope_scaling is not None:
        s = cfg.rope_scaling
        factor, low, high, orig = s.factor, s.low_freq_factor, s.high_freq_factor, s.original_max_position
        wavelen = 2 * np.pi / inv
        smooth = np.clip((orig / wavelen - low) / (high - low), 0.0, 1.0)
        scaled = np.where(wavelen > orig / low, inv / factor, inv)
        mid = (wavelen <= orig / low) & (wavelen >= orig / high)
        inv = np.where(mid, (1 - smooth) * inv / factor + smooth * inv, scaled)
    return inv.astype(np.float32)


def apply_rope(x, positions, cfg: ModelConfig):
    """Rotate x [B, T, n, H] by positions [B, T] (half-split layout, as in HF Llama/Qwen2)."""
    angles = positions[..., None].astype(jnp.float32) * rope_inv_freq(cfg)  # [B, T, H/2]
    cos, sin = jnp.cos(angles)[:, :, None, :], jnp.sin(angles)[:, :, None, :]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def rms_norm(x, w, eps):
    x32 = x.astype(jnp.float32)
    return (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps) * w).astype(x.dtype)


def embed(params: Params, tokens):
    """tokens [B, T] -> x [B, T, D]."""
    return constrain(params["embed"][tokens], X_AXES)


def head(params: Params, cfg: ModelConfig, x):
    """x [B, T, D] -> float32 logits [B, T, V]."""
    x = rms_norm(x, params["final_norm"], cfg.norm_eps)
    w = params["embed"].T if cfg.tie_embeddings else params["lm_head"]
    return constrain(jnp.einsum("btd,dv->btv", x, w, preferred_element_type=jnp.float32), LOGITS_AXES)


def project_qkv(x, lp, positions, cfg: ModelConfig):
    """Attention inputs of x [B, T, D]: q [B, T, N, H] and kv [B, T, 2, K, H] (RoPE applied)."""
    h = rms_norm(x, lp["attn_norm"], cfg.norm_eps)
    q = jnp.einsum("btd,dnh->btnh", h, lp["wq"])
    k = jnp.einsum("btd,dkh->btkh", h, lp["wk"])
    v = jnp.einsum("btd,dkh->btkh", h, lp["wv"])
    if cfg.qkv_bias:
        q, k, v = q + lp["bq"], k + lp["bk"], v + lp["bv"]
    kv = jnp.stack([apply_rope(k, positions, cfg), v], axis=2)
    return constrain(apply_rope(q, positions, cfg), Q_AXES), constrain(kv, KV_AXES)


def attend_fused(q, keys, vals, mask, cfg: ModelConfig, implementation: str | None = None, kv_lengths=None):
    """GQA attention through `jax.nn.dot_product_attention`: q [B, T, N, H] over keys/vals
    [B, S, K, H] (sequence-major) where mask [B, T, S] (None: everywhere) and position < kv_lengths[b]
    (None: all S), in `implementation` (default `attention_implementation(cfg)`: cuDNN's fused
    attention on GPUs where it compiles, XLA's elsewhere; JAX's own default is always XLA)."""
    out = jax.nn.dot_product_attention(q, keys, vals, mask=None if mask is None else mask[:, None],
                                       key_value_seq_lengths=kv_lengths,
                                       implementation=implementation or attention_implementation(cfg))
    return constrain(out.astype(vals.dtype), Q_AXES)


@functools.cache
def fused_implementation(dtype, heads: int, kv_heads: int, head_dim: int, decode: bool = False) -> str:
    """"cudnn" when this backend is a GPU, `dtype` 16-bit and cuDNN's fused attention compiles for
    these heads in this form (probed once on a small shape: prefill's 128 queries under a mask, or
    decode's one query over per-row KV lengths), else "xla"."""
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


def attention_implementation(cfg: ModelConfig, decode: bool = False) -> str:
    """The implementation of `cfg`'s attention in prefill's form or decode's (`fused_implementation`)."""
    return fused_implementation(cfg.jnp_dtype, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, decode)


def decode_seq_major(cfg: ModelConfig) -> bool:
    """Whether a new decode cache is sequence-major: when decode's attention is cuDNN's, which reads
    keys and values only as [B, C, K, H]. Otherwise it is head-major, which XLA's attention dots read
    in place (a sequence-major cache would cost them a transposed copy of every layer's KV per step)."""
    return attention_implementation(cfg, decode=True) == "cudnn"


def decode_implementation(cfg: ModelConfig, seq_major: bool) -> str:
    """The attention implementation a decode step over a cache of this layout runs: cuDNN's needs the
    sequence-major one, so a head-major cache always runs XLA's."""
    return attention_implementation(cfg, decode=True) if seq_major else "xla"


def finish_layer(x, attn, lp, cfg: ModelConfig):
    """Output projection, residuals and the SwiGLU MLP: x [B, T, D], attn [B, T, N, H] -> x."""
    x = constrain(x + jnp.einsum("btnh,nhd->btd", attn, lp["wo"]), X_AXES)
    h = rms_norm(x, lp["mlp_norm"], cfg.norm_eps)
    gate = jax.nn.silu(jnp.einsum("btd,df->btf", h, lp["w_gate"]))
    hidden = constrain(gate * jnp.einsum("btd,df->btf", h, lp["w_up"]), FFW_AXES)
    return constrain(x + jnp.einsum("btf,fd->btd", hidden, lp["w_down"]), X_AXES)


def forward_layer(x, lp, positions, cfg: ModelConfig, prefix_kv, prefix_len):
    """One decoder layer over new tokens, attending to a cached prefix and causally to themselves.

    x [B, T, D]; positions [B, T] (= prefix_len + t); prefix_kv [B, S, 2, K, H] of which the
    first prefix_len[b] entries are valid (S may be 0); returns (x [B, T, D], kv [B, T, 2, K, H]).
    """
    B, T, _ = x.shape
    S = prefix_kv.shape[1]
    prefix_kv = constrain(prefix_kv, KV_AXES)
    q, kv = project_qkv(x, lp, positions, cfg)
    keys = jnp.concatenate([prefix_kv[:, :, 0], kv[:, :, 0]], axis=1)  # [B, S+T, K, H]
    vals = jnp.concatenate([prefix_kv[:, :, 1], kv[:, :, 1]], axis=1)
    in_prefix = jnp.arange(S)[None, None, :] < prefix_len[:, None, None]  # [B, 1, S]
    causal = jnp.arange(T)[None, :, None] >= jnp.arange(T)[None, None, :]  # [1, T, T]
    mask = jnp.concatenate([jnp.broadcast_to(in_prefix, (B, T, S)), jnp.broadcast_to(causal, (B, T, T))], -1)
    return finish_layer(x, attend_fused(q, keys, vals, mask, cfg), lp, cfg), kv


def forward(params: Params, cfg: ModelConfig, tokens, prefix_kv, prefix_len):
    """Fused prefill: tokens [B, T], prefix_kv [L, B, S, 2, K, H], prefix_len [B]
    -> (logits [B, T, V] float32, kv [L, B, T, 2, K, H])."""
    positions = prefix_len[:, None] + jnp.arange(tokens.shape[1])[None, :]
    x = embed(params, tokens)
    kvs = []
    for layer, lp in enumerate(params["layers"]):
        x, kv = forward_layer(x, lp, positions, cfg, prefix_kv[layer], prefix_len)
        kvs.append(kv)
    return head(params, cfg, x), constrain(jnp.stack(kvs), ("layers", *KV_AXES))


def decode_step(params: Params, cfg: ModelConfig, tokens, cache, lengths, seq_major: bool | None = None):
    """One batched decode step. tokens [B]; cache [L, 2, B, K, C, H] (head-major) or, when `seq_major`
    (default `decode_seq_major(cfg)`, as `DecodeCache.create`), [L, 2, B, C, K, H]: each layer's K and V
    contiguous; lengths [B] valid entries per row, the new token goes at position lengths[b].
    Returns (logits [B, V], cache').

    Built from the pieces of `forward_layer`, but the new KV is written into the cache first and
    attention reads the cache in place (no per-step copy), up to each row's length. The jitted form
    `decode_step_jit` donates `cache`: the caller's array is invalid afterwards.
    """
    seq_major = decode_seq_major(cfg) if seq_major is None else seq_major
    axes = DECODE_CACHE_AXES_SEQ if seq_major else DECODE_CACHE_AXES
    implementation = decode_implementation(cfg, seq_major)
    positions = lengths[:, None]
    x = embed(params, tokens[:, None])
    rows = jnp.arange(tokens.shape[0])
    cache = constrain(cache, axes)
    for layer, lp in enumerate(params["layers"]):
        q, kv = project_qkv(x, lp, positions, cfg)
        at = (layer, slice(None), rows, lengths) if seq_major else (layer, slice(None), rows, slice(None), lengths)
        cache = cache.at[at].set(kv[:, 0])  # [B, 2, K, H] at (b, lengths[b])
        keys, vals = (cache[layer, i] if seq_major else cache[layer, i].swapaxes(1, 2) for i in (0, 1))
        attn = attend_fused(q, keys, vals, None, cfg, implementation, kv_lengths=lengths + 1)
        x = finish_layer(x, attn, lp, cfg)
    return head(params, cfg, x)[:, 0], constrain(cache, axes)


decode_step_jit = jax.jit(decode_step, static_argnums=1, static_argnames="seq_major", donate_argnums=3)


def greedy(logits):
    """Greedy sampling: argmax over the vocabulary (ties go to the lowest id)."""
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)


def reference_logits(params: Params, cfg: ModelConfig, tokens) -> np.ndarray:
    """A plain, cache-free forward (kv heads repeated, explicit causal mask): the test reference.

    tokens [B, T] -> float32 logits [B, T, V] as a NumPy array. One compiled program per shape
    (op by op, every new length recompiled each of its operations: 3-4 s a call for `tiny`).
    """
    return np.asarray(_reference_logits(params, cfg, np.asarray(tokens)))


@functools.partial(jax.jit, static_argnums=1)
def _reference_logits(params: Params, cfg: ModelConfig, tokens):
    B, T = tokens.shape
    pos = jnp.broadcast_to(jnp.arange(T), (B, T))
    x = params["embed"][tokens]
    for lp in params["layers"]:
        h = rms_norm(x, lp["attn_norm"], cfg.norm_eps)
        q, k, v = (jnp.einsum("btd,dnh->btnh", h, lp[w]) for w in ("wq", "wk", "wv"))
        if cfg.qkv_bias:
            q, k, v = q + lp["bq"], k + lp["bk"], v + lp["bv"]
        q, k = apply_rope(q, pos, cfg), apply_rope(k, pos, cfg)
        k, v = (jnp.repeat(a, cfg.q_per_kv, axis=2) for a in (k, v))
        s = jnp.einsum("bqnh,bknh->bnqk", q, k).astype(jnp.float32) / np.sqrt(cfg.head_dim)
        s = jnp.where(jnp.tril(jnp.ones((T, T), bool)), s, -jnp.inf)
        a = jnp.einsum("bnqk,bknh->bqnh", jax.nn.softmax(s, -1).astype(v.dtype), v)
        x = x + jnp.einsum("bqnh,nhd->bqd", a, lp["wo"])
        h = rms_norm(x, lp["mlp_norm"], cfg.norm_eps)
        x = x + (jax.nn.silu(h @ lp["w_gate"]) * (h @ lp["w_up"])) @ lp["w_down"]
    return head(params, cfg, x)


@functools.partial(jax.jit, static_argnums=1)
def forward_jit(params, cfg, tokens, prefix_kv, prefix_len):
    return forward(params, cfg, tokens, prefix_kv, prefix_len)
