"""The public model API over both families: each entry point dispatches on the config's type.

`models.prefill`, `models.Layerwise`, `models.DecodeCache`, `models.init_params`, ... resolve here
(see `models/__init__.py`), so the runtime, the benchmarks and the CLI run a `ModelConfig`
(Llama / Qwen2: `models.model`, `models.prefill`, `models.decode`, `models.params`) and a
`DeepSeekConfig` (`models.deepseek*`) through the same calls. The dense modules know nothing of
the DeepSeek family; this module sits above both.
"""

from __future__ import annotations

import json
import os

import jax
import numpy as np

from models import checkpoint, deepseek, deepseek_sharding, params, sharding
from models import decode as dense_decode
from models import prefill as dense_prefill
from models.buckets import DEFAULT_BUCKETS, Buckets
from models.deepseek_config import DeepSeekConfig
from models.deepseek_decode import DeepSeekDecodeCache
from models.deepseek_prefill import DeepSeekLayerwise
from models.hf_deepseek import MODEL_TYPES, load_hf_deepseek
from models.model import greedy


def _ds(cfg) -> bool:
    return isinstance(cfg, DeepSeekConfig)


def prefill(params_, cfg, tokens, prefix_kv=None, prefix_len=None, buckets: Buckets = DEFAULT_BUCKETS):
    """Prefill tokens [B, T] over cached records [L, B, S, *cfg.kv_record_shape] (None: no prefix).
    Returns (logits [B, T, V] float32, kv [L, B, T, *record]); raises InputError for bad input."""
    fn = deepseek.prefill if _ds(cfg) else dense_prefill.prefill
    return fn(params_, cfg, tokens, prefix_kv, prefix_len, buckets)


def Layerwise(params_, cfg, tokens, prefix_len=None, buckets: Buckets = DEFAULT_BUCKETS):  # noqa: N802
    """The layer-at-a-time prefill driver of cfg's family (`layer(l, prefix_l)`, then `logits()`)."""
    cls = DeepSeekLayerwise if _ds(cfg) else dense_prefill.Layerwise
    return cls(params_, cfg, tokens, prefix_len, buckets)


class DecodeCache:
    """The decode cache of cfg's family: `DecodeCache.create(cfg, slots, capacity)` and
    `DecodeCache.filled(cfg, slots, capacity, length)` return a `models.decode.DecodeCache` (dense)
    or a `DeepSeekDecodeCache`, both with the same immutable transitions."""

    @staticmethod
    def create(cfg, slots: int, capacity: int, sharding=None):
        return (DeepSeekDecodeCache if _ds(cfg) else dense_decode.DecodeCache).create(cfg, slots, capacity, sharding)

    @staticmethod
    def filled(cfg, slots: int, capacity: int, length: int):
        return (DeepSeekDecodeCache if _ds(cfg) else dense_decode.DecodeCache).filled(cfg, slots, capacity, length)


def generate(params_, cfg, tokens, steps: int, capacity: int | None = None) -> np.ndarray:
    """Greedy-generate `steps` tokens after each prompt row of tokens [B, T]; returns ids [B, steps]."""
    tokens = dense_prefill.check_tokens(tokens, cfg)
    B, T = tokens.shape
    logits, kv = prefill(params_, cfg, tokens)
    cache = DecodeCache.create(cfg, B, capacity or T + steps)
    for b in range(B):
        cache = cache.insert(b, kv[:, b])
    out = [np.asarray(greedy(logits[:, -1]))]
    for _ in range(steps - 1):
        logits, cache = cache.step(params_, out[-1])
        out.append(np.asarray(greedy(logits)))
    return np.stack(out, axis=1)


def _declare(cfg):
    return deepseek.declare(cfg) if _ds(cfg) else params.declare(cfg)


def init_params(cfg, seed: int = 0):
    """Seeded random params of cfg's family (deterministic in `seed`), in `cfg.dtype`."""
    return deepseek.init_params(cfg, seed) if _ds(cfg) else params.init_params(cfg, seed)


def abstract_params(cfg, shardings=None):
    """ShapeDtypeStructs of the params (Orbax restore target; `eval_shape` input)."""
    if not _ds(cfg):
        return params.abstract_params(cfg, shardings)
    tree = jax.tree.map(lambda d: jax.ShapeDtypeStruct(d.shape, cfg.jnp_dtype), _declare(cfg), is_leaf=deepseek.is_decl)
    if shardings is not None:
        tree = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), tree, shardings)
    return tree


def param_count(cfg) -> int:
    return deepseek.param_count(cfg) if _ds(cfg) else params.param_count(cfg)


def param_bytes(cfg) -> int:
    return param_count(cfg) * np.dtype(cfg.jnp_dtype).itemsize


def check_params(params_, cfg) -> None:
    """Raise ValueError naming the first leaf that is missing, extra or misshaped."""
    if not _ds(cfg):
        return params.check_params(params_, cfg)
    want = {jax.tree_util.keystr(p): d.shape for p, d in
            jax.tree_util.tree_flatten_with_path(_declare(cfg), is_leaf=deepseek.is_decl)[0]}
    got = {jax.tree_util.keystr(p): tuple(x.shape) for p, x in jax.tree_util.tree_flatten_with_path(params_)[0]}
    bad = sorted(k for k in set(want) | set(got) if want.get(k) != got.get(k))
    if bad:
        k = bad[0]
        raise ValueError(f"params for {cfg.name!r}: tensor {k} has shape {got.get(k)}, expected {want.get(k)}")


def param_shardings(cfg, mesh):
    return deepseek_sharding.param_shardings(cfg, mesh) if _ds(cfg) else sharding.param_shardings(cfg, mesh)


def shard_params(params_, cfg, mesh):
    return jax.device_put(params_, param_shardings(cfg, mesh))


def load_hf(path: str, dtype: str | None = None):
    """Import a local Hugging Face checkpoint directory of either family -> (config, params)."""
    try:
        with open(os.path.join(path, "config.json")) as f:
            model_type = json.load(f).get("model_type")
    except (FileNotFoundError, json.JSONDecodeError):
        model_type = None  # the dense loader names the problem
    return load_hf_deepseek(path, dtype) if model_type in MODEL_TYPES else checkpoint.load_hf(path, dtype)
