"""One block read in flight, checked against its index entry's per-layer checksums."""

from __future__ import annotations

import logging

import numpy as np
import tensorstore as ts
import xxhash

log = logging.getLogger("kvstore.store")


class BlockRead:
    """One block read in flight: `done()`, and `result()` -> the verified block or None.

    The block stays pinned against eviction until `result()` or `release()` is called (or the
    BlockRead is garbage-collected); no Python callback runs on TensorStore's threads.
    """

    def __init__(self, store, h: str, row: np.ndarray, fut, layers: range, entry: tuple[int, np.ndarray] | None):
        """`fut`: the read that fills `row` (shared by a group of blocks of one `get`), None for a
        miss: a local read's future gives {slot: why} for its blocks that failed, checksums
        included; a TensorStore read's raises when any of its blocks failed. `entry`: (slot,
        per-layer checksums) from the block's index entry."""
        self.store, self.hash, self.row, self.fut, self.layers, self.entry = store, h, row, fut, layers, entry
        self._outcome: np.ndarray | None | bool = False  # False: not collected yet

    def done(self) -> bool:
        return self.fut is None or self.fut.done()

    def result(self) -> np.ndarray | None:
        if self._outcome is False:
            try:
                self._outcome = self._collect()
            finally:
                self.store._unpin(self.hash)
        return self._outcome

    def release(self) -> None:
        """Give the block up unread (a miss before it ended the prefix): unpin it now."""
        if self._outcome is False:
            self._outcome = None
            self.store._unpin(self.hash)

    def _bad(self, why: str) -> None:
        if self.hash not in self.store._entries:  # dropped meanwhile with a bad block of its segment
            self.store.counters["misses"] += 1
            return None
        log.warning("block %s unreadable, treated as a miss and dropped from the index with its segment: %s",
                    self.hash, why)
        self.store.counters["bad_blocks"] += 1
        self.store.invalidate(self.hash)
        return None

    def __del__(self):
        if self._outcome is False:
            self.store._unpin(self.hash)

    def _collect(self) -> np.ndarray | None:
        counters = self.store.counters
        if self.fut is None:
            counters["misses"] += 1
            return None
        slot, sums = self.entry
        try:
            failed = self.fut.result()  # local reads: {slot: why}, checksums checked by the reader thread
        except ValueError:  # a TensorStore read of the batch failed: read this one alone to see whether it did
            sel, failed = slice(self.layers.start, self.layers.stop), None
            try:
                ts.array(self.row, copy=False)[sel].write(self.store.array[slot, sel]).result()
            except ValueError as e:  # NOT_FOUND (missing), FAILED_PRECONDITION (truncated)
                return self._bad(str(e).splitlines()[0][:200])
        if failed is not None and slot in failed:
            return self._bad(failed[slot])
        for layer in self.layers if failed is None else ():
            if xxhash.xxh3_64_intdigest(self.row[layer]) != sums[layer]:
                return self._bad(f"checksum mismatch in layer {layer}")
        counters["layer_blocks_read"] += len(self.layers)
        counters["bytes_read"] += self.row[0].nbytes * len(self.layers)
        if self.layers.stop == self.store.layout.n_layers:  # a block counts once, at its last layer
            counters["blocks_read"] += 1
        return self.row
