"""Sharding: one table mapping logical axes to mesh axes, and an engine's local mesh.

Parameters, activations and caches all name their dims by logical axis (parameters in each family's
declarations, activations in `models.layers`, caches in their `models.cache.CacheLayout`); this table
alone says which mesh axis each one splits over. Tensor parallelism runs over heads / kv heads / FFN /
vocab on the mesh axis "tp" (Megatron style: activations of the model width stay whole, per-head
tensors split like their weights). A dim that the mesh size does not divide is replicated (e.g. 2 kv
heads on 4 devices), so any preset runs on any device count.

Inside model code, `constrain(x, axes)` pins an activation or cache to its logical sharding when a
mesh is active (`with jax.set_mesh(mesh):` around the calls) and does nothing otherwise, so the
single-device programs are unchanged.

Why not flax's logical-axis rules (`flax.linen.logical_to_mesh_sharding`): they map names only, so
2 kv heads on a 4-way "tp" axis become an error (an indivisible dim) where this table replicates
the dim; and they would pull in `flax.linen` for a 20-line table. This table keeps that fallback.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

LOGICAL_RULES: dict[str, str | None] = {
    # parameters (and the per-head / FFN / vocab dims of activations, split like their weights)
    "heads": "tp",
    "kv_heads": "tp",
    "ffw": "tp",
    "vocab": "tp",
    "embed": None,
    "expert": "tp",  # routed experts (DeepSeek MoE): expert parallelism over the same devices
    "batch": None,
    # activations [B, T, ...]: a data-parallel mesh axis would map act_batch
    "act_batch": None,
    "act_seq": None,
    "act_embed": None,
    # caches: the prefix KV a prefill reads and the decode cache's slots and positions
    "layers": None,
    "cache_batch": None,
    "cache_seq": None,
}


def make_mesh(devices=None) -> Mesh:
    """A 1-D tensor-parallel mesh ("tp") over `devices` (default: all local devices)."""
    devices = jax.local_devices() if devices is None else list(devices)
    return Mesh(np.array(devices), ("tp",))


def logical_to_spec(shape, axes, mesh) -> PartitionSpec:
    """The PartitionSpec of an array of `shape` whose dims have logical `axes` on `mesh` (concrete or
    abstract): each logical axis maps through LOGICAL_RULES; a dim the mesh axis does not divide, a
    mesh axis this mesh lacks, or one an earlier dim already took, is replicated."""
    if len(shape) != len(axes):
        raise ValueError(f"logical axes {axes} do not match shape {tuple(shape)}")
    sizes, spec = dict(mesh.shape), []
    for dim, axis in zip(shape, axes):
        mesh_axis = LOGICAL_RULES[axis] if axis else None
        if mesh_axis not in sizes or dim % sizes[mesh_axis] or mesh_axis in spec:
            mesh_axis = None
        spec.append(mesh_axis)
    return PartitionSpec(*spec)


def logical_sharding(shape, axes, mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, logical_to_spec(shape, axes, mesh))


def constrain(x, axes):
    """`x` pinned to the logical sharding `axes` when a mesh is active (`jax.set_mesh`), else `x`.

    For use inside jitted model code: the active mesh is part of what a jitted function is compiled
    for, so one function serves both the single-device and the sharded program."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return x
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, logical_to_spec(x.shape, axes, mesh)))
