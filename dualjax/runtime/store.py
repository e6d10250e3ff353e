"""The one place where a model config becomes a KV block layout, and where a run opens its store.

A model config says what one token leaves in one layer's cache (`kv_record_shape`, `kv_dtype`,
`kv_format`); the store holds such records whatever they are. The layout's format string adds
the model's name and, when known, the weights' identity, so KV is never served across models or
checkpoints of the same shape.

The store's byte budget is `--store-gb`, or by default what the store holds now plus the free
space of its filesystem less a margin (5% of the filesystem, at least 1 GiB), so a run evicts
least recently used blocks before the disk fills; should it fill anyway (another writer), a
failed write-back only leaves blocks uncached.

A run's store is a local directory (`--store`), so its blocks move by the store's POSIX back end.
The first open of a run (the command's check) recovers a store whose own metadata is damaged and
says so in one line; a host reports the recovery as `store.recovered` (docs/store.md).
"""

from __future__ import annotations

import shutil

import models
from dualjax.outputs import unwritable_dir
from kvstore import BlockLayout, BlockStore, FingerprintMismatch, StoreError, local_spec

MARGIN_FRACTION, MARGIN_MIN_BYTES = 0.05, 1 << 30


def layout_for(cfg, block_tokens: int = 64, hash_seed: int = 0, weights: str = "") -> BlockLayout:
    """Full Block layout [L, T, *cfg.kv_record_shape] of `cfg`'s cache (any model config with the
    three `kv_*` properties), fingerprinted by its record format, model name and `weights`."""
    fmt = f"{cfg.kv_format} model={cfg.name}" + (f" weights={weights}" if weights else "")
    return BlockLayout(n_layers=cfg.n_layers, block_tokens=block_tokens, record_shape=tuple(cfg.kv_record_shape),
                       dtype=cfg.kv_dtype, format=fmt, hash_seed=hash_seed)


def run_model(cfg) -> models.ModelSource:
    """The model of a run (a RunConfig's `model` and `param_seed`): a preset with random weights or a
    checkpoint directory; its config is read without loading tensors."""
    return models.resolve_model(cfg.model, getattr(cfg, "param_seed", 0))


def run_layout(cfg) -> BlockLayout:
    """The layout of a run (a RunConfig): its model and weights, block size and hash seed."""
    source = run_model(cfg)
    return layout_for(source.config, cfg.block_tokens, cfg.hash_seed, source.weights)


def default_budget(directory: str, held_bytes: int) -> int:
    """What the store holds plus its filesystem's free space less the margin."""
    usage = shutil.disk_usage(directory)
    margin = max(int(usage.total * MARGIN_FRACTION), MARGIN_MIN_BYTES)
    return held_bytes + max(0, usage.free - margin)


def open_store(cfg) -> BlockStore | None:
    """The run's store with its byte budget, or None for the reference run. Raises StoreError
    (fail fast, before serving) on another fingerprint, an unwritable store, or a budget below one
    block."""
    if not cfg.use_store:
        return None
    if why := unwritable_dir(cfg.store_dir):
        raise StoreError(f"the store directory: {why}")
    try:
        store = BlockStore(local_spec(cfg.store_dir), run_layout(cfg))
    except FingerprintMismatch as e:  # say whose weights this run has, in words (path and digest, or seed)
        raise FingerprintMismatch(f"{e}; this run's weights: {run_model(cfg).describe}",
                                  e.cause) from None
    if cfg.store_gb is not None:
        store.set_capacity(int(cfg.store_gb * 1e9))
        return store
    # what it holds, not stats(): stats() reports a pending recovery, which belongs to a host's report
    budget = default_budget(cfg.store_dir, len(store.hashes()) * store.layout.block_bytes)
    if budget < store.layout.block_bytes:
        raise StoreError(f"the filesystem of {cfg.store_dir} has {shutil.disk_usage(cfg.store_dir).free} B free, "
                         f"less than the safety margin plus one block; free space or set --store-gb", "ENOSPC")
    store.set_capacity(budget)
    return store
