"""Reading blocks, whatever the back end: `get` (`BlockStore.get`: a few large reads in flight,
one `BlockRead` per block) and a storage NIC's reads of one request (`RequestReads`: one outcome
per block and batch). Each read task is the back end's (`Backend.read`), which checks every Layer
Block against its index entry's checksum. Uses only the store's public methods."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from kvstore.hashing import check_hash
from kvstore.segments import Entry

READ_GROUP_BYTES = 8 << 20  # one read task covers up to this many bytes of a get


def get(store, hashes: list[str], out: np.ndarray | None, layers: range | None) -> list[BlockRead]:
    """`BlockStore.get`: pin, look the entries up, then a few large reads, all in flight (the first
    verifies while the rest land), in slot order so a read covers runs of consecutive blocks of few
    segments whatever the request's order (a cold read then streams instead of seeking)."""
    for h in hashes:
        check_hash(h)
    layout = store.layout
    layers = range(layout.n_layers) if layers is None else layers
    want = (len(hashes), *layout.full_shape)
    if out is None:
        out = layout.empty(len(hashes))
    elif out.shape != want or out.dtype != layout.np_dtype:
        raise ValueError(f"get: out has shape {out.shape} {out.dtype}, expected {want} {layout.dtype}")
    store.pin(hashes)
    entries = store.entries(hashes)
    rows = sorted((i for i, e in enumerate(entries) if e is not None), key=lambda i: entries[i].slot)
    futs: list = [None] * len(hashes)
    per = max(1, min(READ_GROUP_BYTES // (layout.layer_bytes * len(layers)),  # every reader busy
                     -(-len(rows) // store.files.readers)))
    for g in range(0, len(rows), per):
        group = rows[g:g + per]
        fut = store.files.read(out, group, [entries[i] for i in group], slice(layers.start, layers.stop))
        for i in group:
            futs[i] = fut
    return [BlockRead(store, h, out[i], futs[i], layers, e) for i, (h, e) in enumerate(zip(hashes, entries))]


class ReadBatch(NamedTuple):
    """A storage NIC's read of blocks [b0, b1) of a request, `layers` of each: one read task
    (`fut`, None when none of them is stored)."""

    b0: int
    b1: int
    layers: range
    fut: object


class RequestReads:
    """A storage NIC's reads of one request's blocks, batch by batch (blocks [b0, b1), a layer of
    them or all): the blocks are pinned and their index entries looked up once per request, not
    per batch as `get` would, and a batch is one read task with one outcome per block (read and
    verified, or not)."""

    def __init__(self, store, hashes: list[str], out: np.ndarray):
        self.store, self.hashes, self.out = store, hashes, out
        for h in hashes:
            check_hash(h)
        store.pin(hashes)
        self.entries = store.entries(hashes)

    def cold(self) -> bool:
        """Whether the request's first stored block is not in the page cache, so its read goes to
        the disk (False with no block stored, and on back ends without a page cache)."""
        first = next((e for e in self.entries if e is not None), None)
        return first is not None and self.store.files.cold(first)

    def submit(self, b0: int, b1: int, layers: range) -> ReadBatch:
        """Start reading blocks [b0, b1), layers `layers`, into their rows of `out`."""
        rows = sorted((i for i in range(b0, b1) if self.entries[i] is not None), key=lambda i: self.entries[i].slot)
        fut = self.store.files.read(self.out, rows, [self.entries[i] for i in rows],
                                    slice(layers.start, layers.stop)) if rows else None
        return ReadBatch(b0, b1, layers, fut)

    def done(self, batch: ReadBatch) -> bool:
        return batch.fut is None or batch.fut.done()

    def collect(self, batch: ReadBatch) -> list[bool]:
        """Per block of the batch: whether it was read and verified (a bad one is dropped, as `get`
        drops it)."""
        failed = batch.fut.result() if batch.fut is not None else {}
        ok = []
        for h, entry in zip(self.hashes[batch.b0:batch.b1], self.entries[batch.b0:batch.b1]):
            if entry is None:
                self.store.counters["misses"] += 1
            elif entry.slot in failed:
                self.store.block_failed(h, failed[entry.slot])
            ok.append(entry is not None and entry.slot not in failed)
        self.store.count_read(sum(ok), batch.layers)
        return ok

    def close(self) -> None:
        """Release the request's pins (after its last batch is collected)."""
        for h in self.hashes:
            self.store.unpin(h)


class BlockRead:
    """One block read in flight: `done()`, and `result()` -> the verified block or None.

    The block stays pinned against eviction until `result()` or `release()` is called (or the
    BlockRead is garbage-collected); no Python callback runs on TensorStore's threads.
    """

    def __init__(self, store, h: str, row: np.ndarray, fut, layers: range, entry: Entry | None):
        """`fut`: the read task that fills `row` (shared by a group of blocks of one `get`; its
        result is {slot: why} for its blocks that failed), None for a miss."""
        self.store, self.hash, self.row, self.fut, self.layers, self.entry = store, h, row, fut, layers, entry
        self._outcome: np.ndarray | None | bool = False  # False: not collected yet

    def done(self) -> bool:
        return self.fut is None or self.fut.done()

    def result(self) -> np.ndarray | None:
        if self._outcome is False:
            try:
                self._outcome = self._collect()
            finally:
                self.store.unpin(self.hash)
        return self._outcome

    def release(self) -> None:
        """Give the block up unread (a miss before it ended the prefix): unpin it now."""
        if self._outcome is False:
            self._outcome = None
            self.store.unpin(self.hash)

    def __del__(self):
        if self._outcome is False:
            self.store.unpin(self.hash)

    def _collect(self) -> np.ndarray | None:
        if self.fut is None:
            self.store.counters["misses"] += 1
            return None
        failed = self.fut.result()
        if self.entry.slot in failed:
            self.store.block_failed(self.hash, failed[self.entry.slot])
            return None
        self.store.count_read(1, self.layers)
        return self.row
