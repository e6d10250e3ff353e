"""The one place where a model config becomes a KV block layout, and where a run opens its store.

A model config says what one token leaves in one layer's cache (`kv_record_shape`, `kv_dtype`,
`kv_format`); the store holds such records whatever they are. The layout's format string adds
the model's name and, when known, the weights' identity, so KV is never served across models or
checkpoints of the same shape.
"""

from __future__ import annotations

import models
from kvstore import BlockLayout, BlockStore, local_spec


def layout_for(cfg, block_tokens: int = 64, hash_seed: int = 0, weights: str = "") -> BlockLayout:
    """Full Block layout [L, T, *cfg.kv_record_shape] of `cfg`'s cache (any model config with the
    three `kv_*` properties), fingerprinted by its record format, model name and `weights`."""
    fmt = f"{cfg.kv_format} model={cfg.name}" + (f" weights={weights}" if weights else "")
    return BlockLayout(n_layers=cfg.n_layers, block_tokens=block_tokens, record_shape=tuple(cfg.kv_record_shape),
                       dtype=cfg.kv_dtype, format=fmt, hash_seed=hash_seed)


def run_layout(cfg) -> BlockLayout:
    """The layout of a run (a RunConfig): its model, block size and hash seed."""
    return layout_for(models.get_config(cfg.model), cfg.block_tokens, cfg.hash_seed)


def open_store(cfg) -> BlockStore | None:
    """The run's store (refuses one with another fingerprint), or None for the reference run."""
    return BlockStore(local_spec(cfg.store_dir), run_layout(cfg)) if cfg.use_store else None
