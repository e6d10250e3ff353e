"""Shardings of the DeepSeek family's params: the logical-axis table of `models.sharding` plus experts.

Routed experts shard over the mesh's "tp" axis by the `expert` logical axis (expert parallelism);
everything else follows the dense family's table (heads, FFN and vocabulary over "tp").
"""

from __future__ import annotations

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from models import deepseek
from models.deepseek_config import DeepSeekConfig
from models.sharding import LOGICAL_RULES

RULES = {**LOGICAL_RULES, "expert": LOGICAL_RULES.get("expert", "tp")}


def _spec(shape, axes, mesh: Mesh) -> PartitionSpec:
    spec, used = [], set()
    for dim, axis in zip(shape, axes):
        mesh_axis = RULES.get(axis) if axis else None
        if mesh_axis is not None and (dim % mesh.shape[mesh_axis] or mesh_axis in used):
            mesh_axis = None  # a dim the mesh does not divide, or a mesh axis already taken, is replicated
        used.add(mesh_axis)
        spec.append(mesh_axis)
    return PartitionSpec(*spec)


def param_shardings(cfg: DeepSeekConfig, mesh: Mesh):
    """NamedSharding per param leaf, derived from the declarations."""
    return jax.tree.map(lambda d: NamedSharding(mesh, _spec(d.shape, d.axes, mesh)), deepseek.declare(cfg),
                        is_leaf=deepseek.is_decl)


def shard_params(params, cfg: DeepSeekConfig, mesh: Mesh):
    return jax.device_put(params, param_shardings(cfg, mesh))
