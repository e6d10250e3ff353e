"""Sharding: one table mapping logical axes to mesh axes, and an engine's local mesh.

Tensor parallelism runs over heads / kv heads / FFN / vocab on the mesh axis "tp". A dim that
the mesh size does not divide is replicated (e.g. 2 kv heads on 4 devices), so any preset runs
on any device count.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from models.config import ModelConfig
from models.params import map_decls

LOGICAL_RULES: dict[str, str | None] = {
    "batch": None,
    "heads": "tp",
    "kv_heads": "tp",
    "ffw": "tp",
    "vocab": "tp",
    "embed": None,
}


def make_mesh(devices=None) -> Mesh:
    """A 1-D tensor-parallel mesh ("tp") over `devices` (default: all local devices)."""
    devices = jax.local_devices() if devices is None else list(devices)
    return Mesh(np.array(devices), ("tp",))


def logical_to_spec(shape, axes, mesh: Mesh) -> PartitionSpec:
    spec = []
    for dim, axis in zip(shape, axes):
        mesh_axis = LOGICAL_RULES.get(axis) if axis else None
        if mesh_axis is not None and dim % mesh.shape[mesh_axis]:
            mesh_axis = None
        spec.append(mesh_axis)
    return PartitionSpec(*spec)


def param_shardings(cfg: ModelConfig, mesh: Mesh):
    """NamedSharding per param leaf, derived from the declarations."""
    return map_decls(lambda _, d: NamedSharding(mesh, logical_to_spec(d.shape, d.axes, mesh)), cfg)


def shard_params(params, cfg: ModelConfig, mesh: Mesh):
    return jax.device_put(params, param_shardings(cfg, mesh))

