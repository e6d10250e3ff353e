"""The I/O a block store needs (`Backend`), which its two back ends provide.

`BlockStore` (kvstore/store.py) decides what is read and written; a back end moves the bytes of
the on-disk format (kvstore/segments.py) and nothing else:

* `PosixBackend` (kvstore/posix.py), the default for a local directory (TensorStore's `file`
  driver): segment files written with one `pwritev` and renamed into place, `index/<hash>` a hard
  link, blocks read by `preadv` on reader threads straight into the caller's buffer. TensorStore
  is not on this path; it only opens the store (kvstore/metadata.py), and the files it leaves are
  a zarr3 array that TensorStore opens and reads.
* `TensorStoreBackend` (kvstore/tsbackend.py), for every other TensorStore kvstore (`memory://`,
  `gs://`, `s3://`, ...) and for a local directory when asked (`io="tensorstore"`): TensorStore
  does all the I/O, through the kvstore and the zarr3 array.

Both write the same format, so either reads a store the other wrote.
"""

from __future__ import annotations

import abc
import collections
import logging
from typing import NamedTuple, Protocol

import numpy as np
import tensorstore as ts

from kvstore.hashing import BlockId
from kvstore.layout import BlockLayout
from kvstore.segments import Entry

log = logging.getLogger("kvstore.store")  # the store's logger: one place to watch (and capture)


def sub_spec(spec: dict, path: str, **resources) -> dict:
    """Kvstore `spec` under `path`; file-driver context resources (`file_io_sync`, ...) set when it is one."""
    spec = dict(spec, **(resources if spec.get("driver") == "file" else {}))
    spec["path"] = spec.get("path", "") + path
    return spec


def prefix_range(prefix: str) -> ts.KvStore.KeyRange:
    """Every key that starts with `prefix` (non-empty)."""
    return ts.KvStore.KeyRange(prefix, prefix[:-1] + chr(ord(prefix[-1]) + 1))


class BlockWrite(NamedTuple):
    """One block of a put: its id, its Full Block and the slot it is written to."""

    bid: BlockId
    block: np.ndarray
    slot: int


class ReadTask(Protocol):
    """A back end's read in flight (a `concurrent.futures.Future`, or alike)."""

    def done(self) -> bool:
        """Whether `result()` would return at once."""

    def result(self) -> dict[int, str]:
        """{slot: why} for the blocks of the read that failed (missing, truncated, unreadable,
        checksum mismatch); empty when every block landed and checked."""


class Backend(abc.ABC):
    """What a back end does for the store. Every method is safe to call from several threads."""

    readers = 1  # read tasks a `get` is split into, so that they run at once

    def __init__(self, layout: BlockLayout, slots_per_segment: int):
        self.layout, self.S = layout, slots_per_segment

    def write(self, todo: list[BlockWrite]) -> dict[str, Entry]:
        """Write blocks `todo`: each segment written whole (`write_segment`), and only once every
        segment of the call is, its blocks made visible (`link`), so a block is visible only once
        complete; on failure nothing of the call is visible. Raises OSError or ValueError. The
        seam where tests inject write faults."""
        segments = collections.defaultdict(list)
        for item in todo:
            segments[item.slot // self.S].append(item)
        entries, done, linked = {}, [], []
        try:
            for seg, items in segments.items():
                sums, entry = self.write_segment(seg, items)
                members = tuple(item.bid.hash for item in items)
                entries.update((item.bid.hash, Entry(item.slot, s, members, k))
                               for k, (item, s) in enumerate(zip(items, sums)))
                done.append((seg, members, entry))
            for seg, members, entry in done:
                self.link(seg, members, entry, linked)
        except BaseException:  # a link that failed (index full, no hard links) frees its segment too
            if linked:
                self.drop(linked, None)
            for seg in segments:
                self.drop([], seg)
            raise
        return entries

    @abc.abstractmethod
    def write_segment(self, seg: int, items: list[BlockWrite]) -> tuple[np.ndarray, bytes]:
        """Segment `seg`'s data, whole and in place but not yet visible: its shard index, its
        blocks' Layer Blocks (`data_parts`) and its entry, fsynced where asked. Returns the
        blocks' layer checksums [n, L] and the entry."""

    @abc.abstractmethod
    def link(self, seg: int, hashes: tuple[str, ...], entry: bytes, linked: list[str]) -> None:
        """Make a written segment's blocks visible, an index entry each (where another writer's
        equal block is visible already, either entry is right); appends each key to `linked` before
        making it, so a caller can take them back when a later one fails."""

    @abc.abstractmethod
    def keys(self) -> list[str]:
        """Every key under `index/`."""

    @abc.abstractmethod
    def present(self, hashes: list[str]) -> list[bool]:
        """Whether each block has an index entry now."""

    @abc.abstractmethod
    def raw_entries(self, hashes: list[str]) -> dict[str, bytes | None]:
        """Bytes ending with each block's segment entry (None: no index entry; b"": unreadable)."""

    @abc.abstractmethod
    def drop(self, members, segment: int | None) -> None:
        """Delete index entries (first), then the segment's data; failures are logged, not raised
        (a block not freed is still a correct block)."""

    def discard_entry(self, h: str) -> None:
        """Free what block `h`'s unreadable entry leaves behind, where the back end can."""

    @abc.abstractmethod
    def read(self, out: np.ndarray, rows: list[int], entries: list[Entry], layers: slice) -> ReadTask:
        """Start reading blocks `entries` (in slot order; layers `layers`) into rows `rows` of `out`
        and checking each of their Layer Blocks against its checksum."""

    def cold(self, entry: Entry) -> bool:
        """Whether reading the block of `entry` goes to the disk (not in the page cache)."""
        return False

    @abc.abstractmethod
    def take(self, prefix: str) -> int:
        """Delete every key under `prefix`; returns how many this process deleted (of several
        processes that race, each key counts for one)."""

    def close(self) -> None:
        """Stop the back end's threads."""
