"""The one place where a model config becomes a KV block layout, and where a run opens its store."""

from __future__ import annotations

import models
from kvstore import BlockLayout, BlockStore, local_spec
from models import ModelConfig


def layout_for(cfg: ModelConfig, block_tokens: int = 64, hash_seed: int = 0) -> BlockLayout:
    """Full Block layout [L, T, 2, K, H] of `cfg`'s KV, fingerprinted with the model name and dtype."""
    return BlockLayout(model=cfg.name, n_layers=cfg.n_layers, n_kv_heads=cfg.n_kv_heads, head_dim=cfg.head_dim,
                       dtype=cfg.dtype, block_tokens=block_tokens, hash_seed=hash_seed)


def run_layout(cfg) -> BlockLayout:
    """The layout of a run (a RunConfig): its model, block size and hash seed."""
    return layout_for(models.get_config(cfg.model), cfg.block_tokens, cfg.hash_seed)


def open_store(cfg) -> BlockStore | None:
    """The run's store (refuses one with another fingerprint), or None for the reference run."""
    return BlockStore(local_spec(cfg.store_dir), run_layout(cfg)) if cfg.use_store else None
