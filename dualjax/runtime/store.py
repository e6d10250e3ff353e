"""The one place where a model config becomes a KV block layout, and where a run opens its store.

A model config says what one token leaves in one layer's cache (`kv_record_shape`, `kv_dtype`,
`kv_format`); the store holds such records whatever they are. The layout's format string adds
the model's name and, when known, the weights' identity, so KV is never served across models or
checkpoints of the same shape.

A run's store (`--store`) is a location as `kvstore.locate` reads it: a directory (the store's POSIX
back end) or any TensorStore kvstore, by URL or JSON spec (docs/store.md); this module names the
flag in that location's errors. A network store is reached once, within seconds, before it is
opened (`kvstore.store_exists`). A `memory://` store lives in one process: every host of an embedded
run shares it; MPI ranks cannot (`run_location`). The first open of a run (the command's check)
recovers a store whose own metadata is damaged and says so in one line; a host reports the recovery
as `store.recovered` (docs/store.md).

The store's byte budget is `--store-gb`, or by default what the store holds now plus the free
space of its filesystem less a margin (5% of the filesystem, at least 1 GiB), so a run evicts
least recently used blocks before the disk fills; should it fill anyway (another writer), a
failed write-back only leaves blocks uncached. A store without a filesystem (`gs://`, `s3://`,
`memory://`) has no free space to go by: it needs `--store-gb`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile

import numpy as np

import models
from dualjax.outputs import unwritable_dir
from kvstore import (
    BlockId,
    BlockLayout,
    BlockStore,
    FingerprintMismatch,
    StoreError,
    StoreLocation,
    block_chain,
    local_spec,
    locate,
    store_exists,
)

MARGIN_FRACTION, MARGIN_MIN_BYTES = 0.05, 1 << 30


def _store_flag(text: str) -> StoreLocation:
    """`--store`'s value as a location; a bad one is one line naming the flag."""
    try:
        return locate(text)
    except StoreError as e:
        raise StoreError(f"--store {e}", e.cause) from None


def run_location(cfg, processes: bool = False) -> StoreLocation:
    """Where the run `cfg` keeps its store, checked before anything opens it. Raises StoreError in one
    line: a bad `--store`; a store without a filesystem and no `--store-gb`; with `processes` (hosts
    that are processes: MPI), a `memory://` store, which lives inside one process."""
    where = _store_flag(cfg.store_dir)
    if processes and "memory" in where.drivers():
        raise StoreError(f"--store {where.name}: a memory:// store lives inside one process and MPI ranks are "
                         "separate processes, so they cannot share it; run --embedded, or give --store a directory "
                         "or URL that every host reaches", "spec")
    if cfg.store_gb is None and where.directory is None:
        raise StoreError(f"--store {where.name} has no filesystem whose free space sets the store's budget: "
                         "give --store-gb", "budget")
    return where


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


def _open(where: StoreLocation, cfg) -> BlockStore:
    """The store at `where` for `cfg`'s layout; a fingerprint mismatch names this run's weights."""
    if where.directory is not None and (why := unwritable_dir(where.directory)):
        raise StoreError(f"the store directory: {why}")
    if where.directory is None:
        store_exists(where)  # reached within seconds, or one line
    try:
        return BlockStore(where.spec, run_layout(cfg), io=where.io, context=where.context)
    except FingerprintMismatch as e:  # say whose weights this run has, in words (path and digest, or seed)
        raise FingerprintMismatch(f"{e}; this run's weights: {run_model(cfg).describe}", e.cause) from None


def open_store(cfg) -> BlockStore | None:
    """The run's store with its byte budget, or None for the reference run. Raises StoreError
    (fail fast, before serving) on a bad `--store`, an unreachable or unwritable store, another
    fingerprint, a store without a filesystem and no `--store-gb`, or a budget below one block."""
    if not cfg.use_store:
        return None
    where = run_location(cfg)
    store = _open(where, cfg)
    if cfg.store_gb is not None:
        store.set_capacity(int(cfg.store_gb * 1e9))
        return store
    # what it holds, not stats(): stats() reports a pending recovery, which belongs to a host's report
    budget = default_budget(where.directory, len(store.hashes()) * store.layout.block_bytes)
    if budget < store.layout.block_bytes:
        raise StoreError(f"the filesystem of {where.directory} has {shutil.disk_usage(where.directory).free} B "
                         "free, less than the safety margin plus one block; free space or set --store-gb", "ENOSPC")
    store.set_capacity(budget)
    return store


def random_ids(layout: BlockLayout, blocks: int, nonce: bytes) -> list[BlockId]:
    """Ids of a chain of `blocks` blocks whose tokens are drawn from `nonce`: no prompt names them."""
    rng = np.random.default_rng(int.from_bytes(nonce, "little"))
    return block_chain(rng.integers(0, 2**31 - 1, blocks * layout.block_tokens, dtype=np.int64), layout)


@contextlib.contextmanager
def scratch(store: str, layout: BlockLayout, blocks: int):
    """(a store, ids of `blocks` blocks no one else uses) on the storage of the store `store`, for a
    measurement: a temporary store beside a store directory (on its disk); on a kvstore, the store
    itself, the blocks named by a random nonce and dropped afterwards."""
    where = _store_flag(store)
    if where.io == "posix":
        parent = os.path.dirname(os.path.abspath(store)) or "."
        os.makedirs(parent, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=parent, prefix=".profile-") as d, \
                BlockStore(local_spec(d), layout) as s:
            yield s, block_chain(np.arange(blocks * layout.block_tokens) % 1000, layout)
        return
    ids = random_ids(layout, blocks, os.urandom(16))
    with BlockStore(where.spec, layout, io=where.io, context=where.context) as s:
        try:
            yield s, ids
        finally:
            for bid in ids:
                s.invalidate(bid.hash)
