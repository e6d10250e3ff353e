"""Parameter declarations: each parameter is declared once (shape, logical axes, init).

Init, shardings, Orbax restore targets, checkpoint checks and memory estimates all derive
from `declare(cfg)`. The params pytree is a plain nested dict:
`{"embed", "final_norm", "lm_head"?, "layers": [ {per-layer leaves}, ... ]}`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from models.config import ModelConfig

Params = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Decl:
    shape: tuple[int, ...]
    axes: tuple[str | None, ...]  # logical axis per dim, see models.sharding.LOGICAL_RULES
    init: str  # "normal" (fan-in scaled), "embed", "ones", "zeros"
    fan_in_dims: int = 1  # leading dims contracted with the input (2 for wo [N, H, D])


def _layer_decls(cfg: ModelConfig) -> dict[str, Decl]:
    D, N, K, H, F = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.ffw
    decls = {
        "attn_norm": Decl((D,), ("embed",), "ones"),
        "wq": Decl((D, N, H), ("embed", "heads", None), "normal"),
        "wk": Decl((D, K, H), ("embed", "kv_heads", None), "normal"),
        "wv": Decl((D, K, H), ("embed", "kv_heads", None), "normal"),
        "wo": Decl((N, H, D), ("heads", None, "embed"), "normal", fan_in_dims=2),
        "mlp_norm": Decl((D,), ("embed",), "ones"),
        "w_gate": Decl((D, F), ("embed", "ffw"), "normal"),
        "w_up": Decl((D, F), ("embed", "ffw"), "normal"),
        "w_down": Decl((F, D), ("ffw", "embed"), "normal"),
    }
    if cfg.qkv_bias:
        decls["bq"] = Decl((N, H), ("heads", None), "zeros")
        decls["bk"] = Decl((K, H), ("kv_heads", None), "zeros")
        decls["bv"] = Decl((K, H), ("kv_heads", None), "zeros")
    return decls


def declare(cfg: ModelConfig) -> dict[str, Any]:
    """The declaration pytree: same structure as the params, with a `Decl` at each leaf."""
    tree: dict[str, Any] = {
        "embed": Decl((cfg.vocab, cfg.d_model), ("vocab", "embed"), "embed"),
        "final_norm": Decl((cfg.d_model,), ("embed",), "ones"),
        "layers": [_layer_decls(cfg) for _ in range(cfg.n_layers)],
    }
    if not cfg.tie_embeddings:
        tree["lm_head"] = Decl((cfg.d_model, cfg.vocab), ("embed", "vocab"), "normal")
    return tree


def _is_decl(x) -> bool:
    return isinstance(x, Decl)


def map_decls(fn, cfg: ModelConfig):
    """Apply `fn(path_str, decl)` to every declaration, keeping the tree structure."""
    return jax.tree_util.tree_map_with_path(lambda p, d: fn(jax.tree_util.keystr(p), d), declare(cfg),
                                            is_leaf=_is_decl)


NUMPY_LEAF = 1 << 22  # elements: a random leaf smaller than this is drawn by NumPy (`random_leaf`)


def random_leaf(seed: int, index: int, decl: Decl, fan_in: int, dtype):
    """Leaf `index` of a seeded random init on the default device: `decl.init` "ones" or "zeros",
    else N(0, 1/fan_in). A leaf under NUMPY_LEAF elements is drawn and cast on the host by NumPy,
    one stream per (seed, index): op by op, `jax.random.normal` (and `jnp.ones`, `astype`) compile a
    program per shape, 0.5-1.5 s each on a 2-core CPU, which made up most of a host's start-up for the
    small presets (`tiny` 6.2 s, `deepseek-tiny` 9.7 s). A larger leaf, whose program pays for
    itself, is drawn by `jax.random` on the device."""
    np_dtype = np.dtype(dtype)
    if decl.init in ("ones", "zeros"):
        return jax.device_put((np.ones if decl.init == "ones" else np.zeros)(decl.shape, np_dtype))
    scale = np.float32(math.sqrt(fan_in))
    if math.prod(decl.shape) < NUMPY_LEAF:
        x = np.random.default_rng((seed % 2**64, index)).standard_normal(decl.shape, np.float32) / scale
        return jax.device_put(x.astype(np_dtype))  # (`jnp.asarray` compiles a copy per shape)
    key = jax.random.fold_in(jax.random.key(seed), index)
    return (jax.random.normal(key, decl.shape, jnp.float32) / scale).astype(dtype)


def random_params(decls, seed: int, dtype, fan_in) -> Params:
    """Seeded random params for the declaration tree `decls` (either family's): leaf i by
    `random_leaf(seed, i, ...)` with `fan_in(decl)`, in `dtype`."""
    leaves, treedef = jax.tree_util.tree_flatten(decls, is_leaf=_is_decl)
    return jax.tree_util.tree_unflatten(treedef, [random_leaf(seed, i, d, fan_in(d), dtype)
                                                  for i, d in enumerate(leaves)])


def init_params(cfg: ModelConfig, seed: int = 0) -> Params:
    """Seeded random params (deterministic in `seed`), in `cfg.dtype`."""
    return random_params(declare(cfg), seed, cfg.jnp_dtype,
                         lambda d: math.prod(d.shape[:d.fan_in_dims]) if d.init == "normal" else 1)


def abstract_params(cfg: ModelConfig, shardings=None) -> Params:
    """ShapeDtypeStructs of the params (Orbax restore target; `eval_shape` input)."""
    tree = map_decls(lambda _, d: jax.ShapeDtypeStruct(d.shape, cfg.jnp_dtype), cfg)
    if shardings is not None:
        tree = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), tree, shardings)
    return tree


def param_count(cfg: ModelConfig) -> int:
    leaves = jax.tree_util.tree_leaves(declare(cfg), is_leaf=_is_decl)
    return sum(math.prod(d.shape) for d in leaves)


def param_bytes(cfg: ModelConfig) -> int:
    return param_count(cfg) * np.dtype(cfg.jnp_dtype).itemsize


def check_params(params: Params, cfg: ModelConfig) -> None:
    """Raise ValueError naming the first leaf that is missing, extra or of the wrong shape/dtype."""
    expected = {jax.tree_util.keystr(p): d for p, d in
                jax.tree_util.tree_flatten_with_path(declare(cfg), is_leaf=_is_decl)[0]}
    got = {jax.tree_util.keystr(p): x for p, x in jax.tree_util.tree_flatten_with_path(params)[0]}
    for name, decl in expected.items():
        if name not in got:
            raise ValueError(f"params for {cfg.name!r}: missing tensor {name} (expected shape {decl.shape})")
        if tuple(got[name].shape) != decl.shape:
            raise ValueError(f"params for {cfg.name!r}: tensor {name} has shape {tuple(got[name].shape)}, "
                             f"expected {decl.shape}")
        if got[name].dtype != cfg.jnp_dtype:
            raise ValueError(f"params for {cfg.name!r}: tensor {name} has dtype {got[name].dtype}, "
                             f"expected {cfg.dtype}")
    extra = sorted(set(got) - set(expected))
    if extra:
        raise ValueError(f"params for {cfg.name!r}: unexpected tensors {extra}")
