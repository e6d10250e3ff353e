"""Parameters: each is declared once by its family (shape, logical axes, init), and everything else is
derived here from the declarations, for every family: seeded init, abstract shapes (Orbax restore
targets, `eval_shape`), shardings, counts and checks.

A params pytree is a plain nested dict: `{"embed", "final_norm", "lm_head"?, "layers": [ {per-layer
leaves}, ... ]}`; a family's `declare(cfg)` gives the same tree with a `Decl` at each leaf.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from models.sharding import logical_sharding

Params = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Decl:
    shape: tuple[int, ...]
    axes: tuple[str | None, ...]  # logical axis per dim, see models.sharding.LOGICAL_RULES
    init: str  # "normal" (N(0, 1/fan-in)), "embed" (N(0, 1)), "ones", "zeros"
    fan_in_dims: tuple[int, ...] = (0,)  # dims contracted with the input: (0, 1) for wo [N, H, D]

    @property
    def fan_in(self) -> int:
        return math.prod(self.shape[d] for d in self.fan_in_dims) if self.init == "normal" else 1


def is_decl(x) -> bool:
    return isinstance(x, Decl)


def declare(cfg) -> Params:
    """The declaration tree of cfg's family."""
    return cfg.family.declare(cfg)


def _flat_decls(cfg) -> dict[str, Decl]:
    leaves = jax.tree_util.tree_flatten_with_path(declare(cfg), is_leaf=is_decl)[0]
    return {jax.tree_util.keystr(p): d for p, d in leaves}


NUMPY_LEAF = 1 << 22  # elements: a random leaf smaller than this is drawn by NumPy (`random_leaf`)


def random_leaf(seed: int, index: int, decl: Decl, dtype):
    """Leaf `index` of a seeded random init on the default device: `decl.init` "ones" or "zeros",
    else N(0, 1/decl.fan_in). A leaf under NUMPY_LEAF elements is drawn and cast on the host by NumPy,
    one stream per (seed, index): op by op, `jax.random.normal` (and `jnp.ones`, `astype`) compile a
    program per shape, 0.5-1.5 s each on a 2-core CPU, which made up most of a host's start-up for the
    small presets. A larger leaf, whose program pays for itself, is drawn by `jax.random` on the device."""
    np_dtype = np.dtype(dtype)
    if decl.init in ("ones", "zeros"):
        return jax.device_put((np.ones if decl.init == "ones" else np.zeros)(decl.shape, np_dtype))
    scale = np.float32(math.sqrt(decl.fan_in))
    if math.prod(decl.shape) < NUMPY_LEAF:
        x = np.random.default_rng((seed % 2**64, index)).standard_normal(decl.shape, np.float32) / scale
        return jax.device_put(x.astype(np_dtype))  # (`jnp.asarray` compiles a copy per shape)
    key = jax.random.fold_in(jax.random.key(seed), index)
    return (jax.random.normal(key, decl.shape, jnp.float32) / scale).astype(dtype)


def init_params(cfg, seed: int = 0) -> Params:
    """Seeded random params of cfg's family (deterministic in `seed`), in `cfg.dtype`: leaf i by
    `random_leaf(seed, i, ...)`."""
    leaves, treedef = jax.tree_util.tree_flatten(declare(cfg), is_leaf=is_decl)
    return jax.tree_util.tree_unflatten(treedef, [random_leaf(seed, i, d, cfg.jnp_dtype) for i, d in enumerate(leaves)])


def abstract_params(cfg, shardings=None) -> Params:
    """ShapeDtypeStructs of the params (Orbax restore target; `eval_shape` input), on `shardings` if given."""
    tree = jax.tree.map(lambda d: jax.ShapeDtypeStruct(d.shape, cfg.jnp_dtype), declare(cfg), is_leaf=is_decl)
    if shardings is not None:
        tree = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), tree, shardings)
    return tree


def param_count(cfg) -> int:
    return sum(math.prod(d.shape) for d in _flat_decls(cfg).values())


def param_bytes(cfg) -> int:
    return param_count(cfg) * np.dtype(cfg.jnp_dtype).itemsize


def check_params(params: Params, cfg) -> None:
    """Raise ValueError naming the first leaf that is missing, extra or of the wrong shape/dtype."""
    expected = _flat_decls(cfg)
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


def param_shardings(cfg, mesh):
    """NamedSharding per param leaf, from the declarations' logical axes."""
    return jax.tree.map(lambda d: logical_sharding(d.shape, d.axes, mesh), declare(cfg), is_leaf=is_decl)


def shard_params(params: Params, cfg, mesh):
    return jax.device_put(params, param_shardings(cfg, mesh))
