"""Shardings of the DeepSeek family's params, from their declarations and `models.sharding`'s one table.

Routed experts carry the `expert` logical axis (expert parallelism over the mesh's "tp" axis); the
rest follow the dense family's rules (heads, FFN and vocabulary over "tp", replicated where the mesh
does not divide a dim).
"""

from __future__ import annotations

import jax
from jax.sharding import Mesh

from models import deepseek
from models.deepseek_config import DeepSeekConfig
from models.sharding import logical_sharding


def param_shardings(cfg: DeepSeekConfig, mesh: Mesh):
    """NamedSharding per param leaf, derived from the declarations."""
    return jax.tree.map(lambda d: logical_sharding(d.shape, d.axes, mesh), deepseek.declare(cfg),
                        is_leaf=deepseek.is_decl)


def shard_params(params, cfg: DeepSeekConfig, mesh: Mesh):
    return jax.device_put(params, param_shardings(cfg, mesh))
