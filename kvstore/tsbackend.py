"""The TensorStore back end: a store on any TensorStore kvstore (`memory://`, `file://`, `gs://`,
`s3://`, ...; every driver TensorStore's kvstore layer accepts), TensorStore doing all the I/O.

* a put: per segment, one kvstore write of the whole segment value (shard index, Layer Blocks,
  entry: the file the POSIX back end writes), then `index/<hash>` written as a copy of the
  segment's entry per block (kvstores have no links);
* a lookup: a kvstore read of `index/<hash>` (the entry, or, for a store the POSIX back end wrote,
  the linked segment file, whose end is the entry);
* a read: TensorStore's zarr3 driver reads the blocks' rows of the data array (`data/zarr.json`)
  through each segment's shard index into the caller's buffer, and the caller's thread checks
  each Layer Block against its checksum when it collects the read;
* eviction and bad segments: kvstore deletes.
"""

from __future__ import annotations

import threading

import numpy as np
import tensorstore as ts
import xxhash

from kvstore.backend import Backend, BlockWrite, log, prefix_range, sub_spec
from kvstore.errors import brief
from kvstore.hashing import check_hash
from kvstore.layout import BlockLayout
from kvstore.segments import Entry, data_parts, encode_entry, joined, layer_sums, segment_key, shard_index


class TensorStoreBackend(Backend):
    """The segments and index entries of the store at kvstore spec `base`, and its zarr3 `array`."""

    readers = 2

    def __init__(self, base: dict, layout: BlockLayout, slots_per_segment: int, context: ts.Context,
                 array: ts.TensorStore):
        super().__init__(layout, slots_per_segment)
        self.array = array
        self.kv = ts.KvStore.open(base, context=context).result()
        self.index_kv = ts.KvStore.open(sub_spec(base, "index/", file_io_sync=False), context=context).result()
        self.data_kv = ts.KvStore.open(sub_spec(base, "data/"), context=context).result()

    # -- writing -------------------------------------------------------------------------------
    def write_segment(self, seg: int, items: list[BlockWrite]) -> tuple[np.ndarray, bytes]:
        blocks = [item.block for item in items]
        sums = np.array([layer_sums(b) for b in blocks], "<u8")
        entry = encode_entry([item.bid for item in items], [item.slot for item in items], sums)
        index = shard_index(self.layout, self.S, items[0].slot % self.S, len(items))
        self.data_kv.write(segment_key(self.layout, seg), joined([index, *data_parts(blocks), entry])).result()
        return sums, entry

    def link(self, seg: int, hashes: tuple[str, ...], entry: bytes, linked: list[str]) -> None:
        """`index/<hash>`: a copy of the segment's entry (it reads as the linked file's end does)."""
        linked.extend(hashes)
        for f in [self.index_kv.write(h, entry) for h in hashes]:
            f.result()

    def drop(self, members, segment: int | None) -> None:
        try:
            for f in [self.index_kv.write(m, None) for m in members]:
                f.result()
            if segment is not None:
                self.data_kv.write(segment_key(self.layout, segment), None).result()
        except ValueError as e:
            log.warning("dropping blocks %s failed: %s", ", ".join(members), brief(e))

    def take(self, prefix: str) -> int:
        """Each key deleted only if it is still the value read (a conditional write: atomic where
        the kvstore makes it so)."""
        keys = self.kv.list(prefix_range(prefix)).result()
        taken = 0
        for key in keys:
            got = self.kv.read(key).result()
            if got.state == "value" and self.kv.write(key, None, if_equal=got.stamp.generation).result().generation:
                taken += 1
        return taken

    # -- index ---------------------------------------------------------------------------------
    def keys(self) -> list[str]:
        return [k.decode() for k in self.index_kv.list().result()]

    def present(self, hashes: list[str]) -> list[bool]:
        """One concurrent index read per block."""
        futs = [self.index_kv.read(check_hash(h)) for h in hashes]
        return [f.result().state == "value" for f in futs]

    def raw_entries(self, hashes: list[str]) -> dict[str, bytes | None]:
        pending = {h: self.index_kv.read(h) for h in hashes}
        return {h: (got.value if got.state == "value" else None) for h, f in pending.items() for got in [f.result()]}

    # -- reading -------------------------------------------------------------------------------
    def read(self, out: np.ndarray, rows: list[int], entries: list[Entry], layers: slice) -> CheckedRead:
        """One TensorStore read of the blocks' rows of the data array into `out`."""
        dst = ts.array(out, copy=False)
        in_order = rows == list(range(rows[0], rows[0] + len(rows)))  # rows come in slot order, not row order
        dst = dst[rows[0]:rows[-1] + 1, layers] if in_order else dst[np.array(rows), layers]
        src = self.array[np.array([e.slot for e in entries], np.int64), layers]
        return CheckedRead(dst.write(src), self.array, out, rows, entries, layers)


class CheckedRead:
    """A TensorStore read of several blocks as a `ReadTask`: `result()` (on the caller's thread,
    once) reads each block alone when the read as a whole failed, to tell which did, and checks
    every Layer Block of the others against its checksum."""

    def __init__(self, fut: ts.Future, array: ts.TensorStore, out: np.ndarray, rows: list[int],
                 entries: list[Entry], layers: slice):
        self.fut, self.array, self.out, self.rows, self.entries, self.layers = fut, array, out, rows, entries, layers
        self._lock = threading.Lock()
        self._failed: dict[int, str] | None = None

    def done(self) -> bool:
        return self.fut.done()

    def result(self) -> dict[int, str]:
        with self._lock:
            if self._failed is None:
                self._failed = self._check()
            return self._failed

    def _check(self) -> dict[int, str]:
        failed: dict[int, str] = {}
        try:
            self.fut.result()
        except ValueError:  # NOT_FOUND (a missing segment), FAILED_PRECONDITION (cut short), ...
            for row, e in zip(self.rows, self.entries):
                try:
                    ts.array(self.out[row], copy=False)[self.layers].write(self.array[e.slot, self.layers]).result()
                except ValueError as err:
                    failed[e.slot] = brief(err)
        for row, e in zip(self.rows, self.entries):
            for layer in range(self.layers.start, self.layers.stop):
                if e.slot not in failed and xxhash.xxh3_64_intdigest(
                        np.ascontiguousarray(self.out[row, layer])) != e.sums[layer]:
                    failed[e.slot] = f"checksum mismatch in layer {layer}"
        return failed
