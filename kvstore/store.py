"""The KV block store's policy: Full Blocks named by chained content hashes, and what is read and
written: names, entries' checks, pins, recency, the byte budget and the counters.

The bytes move through an I/O back end (kvstore/backend.py): on a local directory
`PosixBackend` (kvstore/posix.py: plain system calls; TensorStore is not on its path), on any
other TensorStore kvstore `TensorStoreBackend` (kvstore/tsbackend.py: TensorStore does the I/O).
The store's metadata (its manifest, the data array's zarr3 metadata) is opened, checked and
recovered when damaged by kvstore/metadata.py, through TensorStore, whatever the back end. The
on-disk format is kvstore/segments.py's; reading, kvstore/reads.py's.

Slots are `writer id << COUNTER_BITS | counter` with a random writer id per open store, and
every put starts a fresh segment, so processes writing one store never collide and need no
coordination (nor locks: every segment has one writer, and an index entry's target is fixed by
its blocks). A block is visible (has an index entry) only once its whole segment is written. A
lookup checks the entry's checksum and re-hashes (parent, tokens), which must give the key back;
a read checks each Layer Block it fetched against its checksum. A block that is corrupt,
truncated or missing reads as a miss (never wrong bytes); `get_prefix` stops at the first one,
and the bad block's whole segment is dropped (the next put writes its blocks again). A store is
a cache: `cache()` turns a failed write (disk full, I/O error, permission) into blocks not cached,
logged once per cause and counted. With a byte budget, eviction frees whole segments, least
recently used first (reading a block makes its segment recent), index entries first, then the
segment; never a segment holding a block this process is reading, and a budget exceeded because
of one is restored when that read ends. A block another process evicts under a reader reads as a
miss.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import threading
import weakref

import numpy as np
import tensorstore as ts

from kvstore import reads
from kvstore.backend import Backend, BlockWrite, log
from kvstore.errors import StoreError, brief, cause_of
from kvstore.hashing import BlockId, check_hash, hash_block, is_hash
from kvstore.layout import BlockLayout
from kvstore.metadata import RECOVERED, Opened, open_metadata, store_name
from kvstore.posix import PosixBackend
from kvstore.reads import BlockRead
from kvstore.segments import COUNTER_BITS, SLOT_BITS, Entry, decode_entry
from kvstore.tsbackend import TensorStoreBackend

WRITER_BITS = SLOT_BITS - COUNTER_BITS
COUNTERS = ("blocks_read", "bad_blocks", "misses", "invalidated", "write_failures", "evicted", "recovered")
IO = ("auto", "posix", "tensorstore")


def _new_writer() -> int:
    return int.from_bytes(os.urandom(8), "little") >> (64 - WRITER_BITS)


def local_spec(directory: str) -> dict:
    """The embedded default: a local directory."""
    return {"driver": "file", "path": os.path.abspath(directory).rstrip("/") + "/"}


class _View:
    """What this process knows of one store's blocks: LRU order, pins and segment members. Every
    BlockStore on the same directory in a process shares one, so one host's eviction respects
    another host's reads (embedded runs)."""

    def __init__(self, keys):
        self.lock = threading.Lock()
        self.lru: collections.OrderedDict[str, None] = collections.OrderedDict((k, None) for k in keys)
        self.pins: collections.Counter[str] = collections.Counter()
        self.entries: dict[str, Entry] = {}  # block -> its entry (its segment and the segment's blocks)
        self.budgeted: weakref.WeakSet[BlockStore] = weakref.WeakSet()  # stores with a budget: a released pin checks

    def members(self, h: str) -> tuple[str, ...]:
        """The blocks of `h`'s segment (`h` alone while its entry is not known here)."""
        entry = self.entries.get(h)
        return entry.members if entry is not None else (h,)

    def touch(self, hashes: list[str]) -> None:
        """Make the whole segments of `hashes` most recently used, in order."""
        done: set[str] = set()
        for h in hashes:
            if h in self.lru and h not in done:
                members = self.members(h)
                for m in members:
                    if m in self.lru:
                        self.lru.move_to_end(m)
                done.update(members)


_VIEWS: weakref.WeakValueDictionary[str, _View] = weakref.WeakValueDictionary()
_VIEWS_LOCK = threading.Lock()


class BlockStore:
    """put / get / contains over Full Blocks, with an optional byte budget (LRU eviction).

    `spec`: a TensorStore kvstore spec (dict or URL such as "memory://"). `io`: the I/O back end,
    "posix" on a local directory (the default there), "tensorstore" on any kvstore (the default
    elsewhere). `sync`: fsync every segment, its entry included (and the manifest), before its
    blocks' index entries are made, so a block visible after a power loss is complete; the
    entries (directory entries, on a local directory) are not fsynced (one lost by a power loss
    reads as a miss), and atomic renames already protect against process crashes.
    `context`: share one ts.Context between stores that must see the same `memory://` store.
    Raises StoreError (FingerprintMismatch) when the store cannot be opened or written.
    """

    READER_THREADS = PosixBackend.READER_THREADS  # read-only here: the reader pool is the back end's

    def __init__(self, spec, layout: BlockLayout, capacity_bytes: int | None = None, sync: bool = False,
                 context: ts.Context | None = None, io: str = "auto"):
        if io not in IO:
            raise ValueError(f"BlockStore: io {io!r} is not one of {', '.join(IO)}")
        self.layout, self.sync = layout, sync
        self.context = context or ts.Context({"file_io_sync": sync, "file_io_locking": {"mode": "none"}})
        try:
            self.kv = ts.KvStore.open(spec, context=self.context).result()
        except ValueError as e:
            raise StoreError(f"cannot open store {spec if isinstance(spec, str) else json.dumps(spec)}: {brief(e)}",
                             cause_of(e)) from None
        self.name = store_name(self.kv)
        try:
            opened = open_metadata(self.kv, layout, self.context)
            self.files = self._backend(io, opened)
            self._check_writable()
            keys = self.files.keys()
        except (ValueError, OSError, NotImplementedError) as e:  # NotImplementedError: a read-only kvstore (http)
            raise StoreError(f"cannot open store {self.name}: {brief(e)}", cause_of(e)) from None
        self.slots_per_segment = opened.slots_per_segment
        self.array = opened.array  # the zarr3 array [slots, L, T, *record] the segments make up
        self._view = self._shared_view([k for k in keys if is_hash(k)])
        self._lock = self._view.lock
        self._entries: dict[str, Entry] = {}  # hash -> its entry, verified here
        self._writer, self._counter = _new_writer(), 0
        self._logged_causes: set[str] = set()
        self.counters = collections.Counter({k: 0 for k in COUNTERS})
        self.capacity_bytes = None
        self.set_capacity(capacity_bytes)

    def _backend(self, io: str, opened: Opened) -> Backend:
        base = self.kv.spec().to_json()
        local = base.get("driver") == "file"
        if io == "posix" and not local:
            raise StoreError(f"store {self.name}: io='posix' needs a local directory (a file kvstore)")
        if local and io != "tensorstore":
            return PosixBackend(base["path"], self.layout, opened.slots_per_segment, self.sync)
        return TensorStoreBackend(base, self.layout, opened.slots_per_segment, self.context, opened.array)

    def _shared_view(self, keys: list[str]) -> _View:
        base = self.kv.spec().to_json()
        if base.get("driver") != "file":
            return _View(keys)
        key = json.dumps(base, sort_keys=True) + self.layout.fingerprint()
        with _VIEWS_LOCK:
            view = _VIEWS.get(key)
            if view is None:
                view = _VIEWS[key] = _View(keys)
            else:
                with view.lock:
                    for k in keys:
                        view.lru.setdefault(k, None)
            return view

    def _check_writable(self) -> None:
        """Fail at open, not mid-run, when the store cannot be written at all."""
        probe = f"index/.probe-{os.getpid()}-{id(self)}"
        self.kv.write(probe, b"w").result()
        self.kv.delete_range(ts.KvStore.KeyRange(probe, probe + "\0")).result()

    def set_capacity(self, capacity_bytes: int | None) -> None:
        """Set the byte budget (None: unbounded); evicts down to it at the next put."""
        if capacity_bytes is not None and capacity_bytes < self.layout.block_bytes:
            raise StoreError(f"store budget {capacity_bytes} B is smaller than one block "
                             f"({self.layout.block_bytes} B); raise --store-gb or free disk space", "budget")
        self.capacity_bytes = capacity_bytes
        with self._lock:
            if capacity_bytes is None:
                self._view.budgeted.discard(self)
            else:
                self._view.budgeted.add(self)

    # -- writing -------------------------------------------------------------------------------
    def _segment_cap(self) -> int:
        """Blocks one put may write into one segment: S, fewer when the budget is smaller."""
        if self.capacity_bytes is None:
            return self.slots_per_segment
        return max(1, min(self.slots_per_segment, self.capacity_bytes // self.layout.block_bytes))

    def _next_segment(self) -> int:
        """The first slot of a fresh segment of this writer."""
        S = self.slots_per_segment
        with self._lock:
            if self._counter + S > 1 << COUNTER_BITS:
                self._writer, self._counter = _new_writer(), 0
            self._counter += S
            return (self._writer << COUNTER_BITS) | (self._counter - S)

    def put(self, ids: list[BlockId], blocks) -> int:
        """Store Full Blocks `blocks` [n, L, T, *record] named by `ids`; returns how many were new.

        Blocks already present are skipped (putting twice is harmless); with a budget smaller
        than the new blocks, only the leading ones that fit are written. Raises ValueError for a
        misshaped block or an id whose hash does not match its parent and tokens, StoreError
        (with `.cause`, e.g. "ENOSPC") when the write fails; either way every block visible before
        stays readable and correct, and no block of this call becomes visible half-written.
        """
        if len(ids) != len(blocks):
            raise ValueError(f"put: {len(ids)} ids for {len(blocks)} blocks")
        layout = self.layout
        if not (isinstance(blocks, np.ndarray) and blocks.shape[1:] == layout.full_shape
                and blocks.dtype == layout.np_dtype):  # one check for an array of Full Blocks, else one per block
            for bid, block in zip(ids, blocks):
                layout.check_block(np.asarray(block), f"block {bid.hash}")
        for bid in ids:
            if hash_block(bid.parent, bid.tokens, layout) != check_hash(bid.hash):
                raise ValueError(f"block id {bid.hash} does not match the hash of its parent and tokens")
        present = self._present([bid.hash for bid in ids])  # the store's word: a bad block gets rewritten
        new = [i for i, p in enumerate(present) if not p]
        if self.capacity_bytes is not None:
            new = new[:self.capacity_bytes // layout.block_bytes]
        if not new:
            return 0
        cap = self._segment_cap()
        todo = [BlockWrite(ids[i], np.asarray(blocks[i]), base + j) for s in range(0, len(new), cap)
                for base in [self._next_segment()] for j, i in enumerate(new[s:s + cap])]
        self._evict_for(len(todo) * layout.block_bytes)
        try:
            entries = self.files.write(todo)
        except (ValueError, OSError) as e:
            self.counters["write_failures"] += 1
            raise StoreError(f"writing {len(todo)} blocks failed: {brief(e)}", cause_of(e)) from None
        with self._lock:
            for h, entry in entries.items():
                self._entries[h] = self._view.entries[h] = entry
                self._view.lru[h] = None
        self.counters["blocks_written"] += len(todo)
        self.counters["bytes_written"] += len(todo) * layout.block_bytes
        return len(todo)

    def cache(self, ids: list[BlockId], blocks) -> int:
        """`put` for a cache: a failed write is a block not cached, not a failed request. Logs
        once per cause (disk full, I/O error, permission, ...), counts `write_failures` and
        returns 0; the next read of those blocks misses and the caller recomputes them."""
        try:
            return self.put(ids, blocks)
        except StoreError as e:
            if e.cause not in self._logged_causes:
                self._logged_causes.add(e.cause)
                log.warning("KV store write failed (%s); serving continues without caching those blocks, "
                            "further %s failures are counted, not logged: %s", e.cause, e.cause, e)
            return 0

    # -- index ---------------------------------------------------------------------------------
    def _present(self, hashes: list[str]) -> list[bool]:
        """Whether each block has an index entry now; this process's view follows."""
        out = self.files.present(hashes)
        with self._lock:
            for h, there in zip(hashes, out):
                if there:
                    self._view.lru.setdefault(h, None)
                else:
                    self._view.lru.pop(h, None)
                    self._entries.pop(h, None)
        return out

    def contains(self, h: str) -> bool:
        """Whether block `h` is in the store now (asks the index: another process may have
        written, evicted or invalidated it)."""
        return self._present([h])[0]

    def match_prefix(self, hashes: list[str]) -> int:
        """Number of leading blocks of `hashes` present in the store."""
        present = self._present(hashes)
        return present.index(False) if False in present else len(hashes)

    def hashes(self) -> list[str]:
        """Blocks this process knows of, least recently used first."""
        with self._lock:
            return list(self._view.lru)

    def invalidate(self, h: str) -> None:
        """Forget a block found bad, with every block of its segment: drop their index entries and
        the segment's file, so the next `put` writes them again."""
        with self._lock:
            entry = self._view.entries.get(h)
            members = self._view.members(h)
            self._forget(members)
        self.files.drop(members, entry.slot // self.slots_per_segment if entry is not None else None)
        self.counters["invalidated"] += len(members)

    def block_failed(self, h: str, why: str) -> None:
        """Block `h` did not read right: a miss, and its segment is dropped from the index (once)."""
        if h not in self._entries:  # dropped meanwhile with a bad block of its segment
            self.counters["misses"] += 1
            return
        log.warning("block %s unreadable, treated as a miss and dropped from the index with its segment: %s", h, why)
        self.counters["bad_blocks"] += 1
        self.invalidate(h)

    def _forget(self, members) -> None:
        """Drop blocks from this process's view (the caller holds the lock)."""
        for m in members:
            self._view.lru.pop(m, None)
            self._view.entries.pop(m, None)
            self._entries.pop(m, None)

    def _parse_entry(self, h: str, raw: bytes | None) -> Entry | None:
        """Block `h`'s entry from `raw` (bytes ending with it), or None: missing, or malformed (then
        dropped from the index and counted as a bad block, so the next put writes it again). A
        local segment file whose entry is unreadable (cut short, garbled) cannot serve any of its
        blocks: the back end empties it, so its space returns at once (its other blocks' links
        then read as malformed in turn)."""
        if raw is None:
            return None
        entry = decode_entry(raw, h, self.layout)
        if entry is None:
            log.warning("index entry of block %s is malformed; dropped, the block is a miss", h)
            self.counters["bad_blocks"] += 1
            with self._lock:
                self._forget([h])
            if raw:
                self.files.discard_entry(h)
            self.files.drop([h], None)
            self.counters["invalidated"] += 1
            return None
        with self._lock:
            self._entries[h] = self._view.entries[h] = entry
        return entry

    def entries(self, hashes: list[str]) -> list[Entry | None]:
        """Each block's entry (None: a miss, or an entry found malformed, which is dropped); entries
        verified once are remembered."""
        with self._lock:
            known = [self._entries.get(h) for h in hashes]
        raw = self.files.raw_entries([h for h, e in zip(hashes, known) if e is None])
        return [e if e is not None else self._parse_entry(h, raw[h]) for h, e in zip(hashes, known)]

    # -- reading -------------------------------------------------------------------------------
    @contextlib.contextmanager
    def pinned(self, hashes: list[str]):
        """Keep `hashes` (and their segments) from eviction inside the `with` block (reads in
        flight are pinned too)."""
        self.pin(hashes, touch=False)
        try:
            yield
        finally:
            for h in hashes:
                self.unpin(h)

    def pin(self, hashes: list[str], touch: bool = True) -> None:
        """Keep `hashes` (and their segments) from eviction until each is `unpin`ned once; `touch`:
        make their segments most recently used (a read)."""
        with self._lock:
            for h in hashes:
                self._view.pins[h] += 1
            if touch:
                self._view.touch(hashes)

    def unpin(self, h: str) -> None:
        """Release one pin. Releasing the last one evicts down to the budget of every store on this
        directory in the process (a write's eviction had to spare this block's segment while it
        was read, so the store may be over budget until now)."""
        with self._lock:
            self._view.pins[h] -= 1
            if self._view.pins[h] > 0:
                return
            del self._view.pins[h]
            stores = list(self._view.budgeted) if self._view.budgeted else ()
        for store in stores:
            store._evict_for(0)

    def get(self, hashes: list[str], out: np.ndarray | None = None, layers: range | None = None) -> list[BlockRead]:
        """Start reading blocks into `out` [n, L, T, *record] (allocated page-aligned when None, as
        `layout.empty(n)` does: on some CPUs `preadv` into a buffer 16 bytes past a page, where
        NumPy's large arrays start, is several times slower); each block (or only `layers` of it)
        lands straight in its row (by the back end). Returns one
        `BlockRead` per hash, whose `result()` is that row, checked, or None (missing, corrupt or
        truncated). Blocks being read are pinned against eviction until `result()`."""
        return reads.get(self, hashes, out, layers)

    def get_prefix(self, hashes: list[str]) -> list[np.ndarray]:
        """The leading run of readable blocks: a bad block is a miss for it and every block after."""
        out = []
        pending = self.get(hashes)
        for read in pending:
            block = read.result()
            if block is None:
                break
            out.append(block)
        for read in pending[len(out) + 1:]:
            read.release()
        return out

    # -- capacity ------------------------------------------------------------------------------
    def _victim(self, incoming: int) -> Entry | str | None:
        """While over budget (the caller holds the lock): the least recently used segment with no
        pinned block, as the entry of one of its blocks, forgotten here; or a block whose segment
        is not known yet (its entry must be read first); or None."""
        if (len(self._view.lru) * self.layout.block_bytes) + incoming <= self.capacity_bytes:
            return None
        seen: set[str] = set()
        for h in self._view.lru:
            if h in seen:
                continue
            entry = self._view.entries.get(h)
            if entry is None:
                return h
            seen.update(entry.members)
            if not any(self._view.pins[m] for m in entry.members):
                self._forget(entry.members)
                return entry
        return None

    def _evict_for(self, incoming: int) -> None:
        """Evict least recently used segments with no pinned block until `incoming` bytes fit."""
        if self.capacity_bytes is None:
            return
        while True:
            with self._lock:
                victim = self._victim(incoming)
            if victim is None:
                return
            if isinstance(victim, str):  # listed at open: learn its segment from its entry
                self.entries([victim])
                with self._lock:
                    if victim not in self._view.entries:  # gone or malformed
                        self._forget([victim])
                continue
            self.files.drop(victim.members, victim.slot // self.slots_per_segment)
            self.counters["evicted"] += len(victim.members)

    def count_read(self, blocks: int, layers: range) -> None:
        """Count `blocks` read and verified (`layers` of each); a block counts once, at its last layer."""
        counters = self.counters
        counters["layer_blocks_read"] += blocks * len(layers)
        counters["bytes_read"] += blocks * len(layers) * self.layout.layer_bytes
        if layers.stop == self.layout.n_layers:
            counters["blocks_read"] += blocks

    def stats(self) -> dict:
        """What the store holds and its counters. Recoveries of the store's metadata not yet
        reported by any process are counted here, once (`recovered`: kvstore/metadata.py)."""
        self.counters["recovered"] += self.files.take(RECOVERED)
        with self._lock:
            blocks = len(self._view.lru)
        return {"blocks": blocks, "bytes": blocks * self.layout.block_bytes, "capacity_bytes": self.capacity_bytes,
                "block_bytes": self.layout.block_bytes, "fingerprint": self.layout.fingerprint(), **self.counters}

    def close(self) -> None:
        """Stop the back end's threads (TensorStore handles need no closing)."""
        self.files.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


__all__ = ["BlockStore", "BlockRead", "StoreError", "local_spec", "COUNTERS", "IO"]
