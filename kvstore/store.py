"""The KV block store: Full Blocks in TensorStore, named by chained content hashes.

On-disk format, under one TensorStore kvstore (a local directory by default, `memory://` in
tests, any TensorStore kvstore by changing the spec):

* `dualjax_store.json`: format, layout and fingerprint (a store refuses another fingerprint);
* `data/`: a zarr3 array `[slots, L, T, *record]`, one shard (one file) per Full Block whose
  inner chunks are its Layer Blocks, so a read can fetch whole blocks or only some layers
  (layer-major loading for layerwise prefill) as byte ranges; TensorStore reads straight into
  the caller's host buffer;
* `index/<hash>`: a small entry (slot, one XXH3-64 checksum per Layer Block, parent hash, token
  ids) written *after* the data: a block becomes visible only once completely written. A read
  checks each Layer Block it fetched against its checksum and re-hashes (parent, tokens), which
  must give the key back. (XXH3 runs at ~25 GB/s here; zarr3's crc32c codec halved reads.)

Slots are `writer id << COUNTER_BITS | counter` with a random writer id per open store, so
processes writing one directory never collide and need no coordination (nor file locks: every
chunk has one writer, and an index entry's content is fixed by its hash). A block that is
corrupt, truncated or missing reads as a miss (never wrong bytes); `get_prefix` stops at the
first one. A store is a cache: `cache()` turns a failed write (disk full, I/O error, permission)
into a block not cached, logged once per cause and counted. With a byte budget, least recently
used blocks are evicted (index entry first, then the data through the array), never one that
this process is reading; a block another process evicts under a reader reads as a miss.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import struct
import threading
import weakref

import numpy as np
import tensorstore as ts
import xxhash

from kvstore.errors import FingerprintMismatch, StoreError, cause_of
from kvstore.hashing import BlockId, check_hash, hash_block
from kvstore.layout import BlockLayout
from kvstore.reads import BlockRead

log = logging.getLogger(__name__)

MANIFEST = "dualjax_store.json"
SLOT_BITS = 54  # slots index the data array's first axis, [0, 2**SLOT_BITS)
COUNTER_BITS = 24  # blocks one writer id names before it draws a new id
WRITER_BITS = SLOT_BITS - COUNTER_BITS
COUNTERS = ("blocks_read", "bad_blocks", "misses", "invalidated", "write_failures", "evicted")
_READ_GROUP_BYTES = 8 << 20  # one TensorStore read covers up to this many bytes of a get
_ENTRY_MAGIC = b"DJIX3"
_ENTRY_HEAD = struct.Struct("<5sq16s")  # magic, slot, parent hash; then L xxh3-64 (<u8), T token ids (<i4)


def _zarr_metadata(layout: BlockLayout) -> dict:
    raw = {"name": "bytes", "configuration": {"endian": "little"}}
    shard = {"name": "sharding_indexed", "configuration": {
        "chunk_shape": [1, 1, *layout.layer_shape], "codecs": [raw], "index_location": "start",
        "index_codecs": [raw, {"name": "crc32c"}]}}
    return {"shape": [1 << SLOT_BITS, *layout.full_shape], "data_type": layout.dtype,
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [1, *layout.full_shape]}},
            "chunk_key_encoding": {"name": "v2", "configuration": {"separator": "."}}, "codecs": [shard]}


def _describe(layout_json) -> str:
    try:
        return BlockLayout.from_json(layout_json).describe()
    except (TypeError, ValueError, KeyError):
        return f"unreadable layout {layout_json!r}"


def _layer_sums(block: np.ndarray) -> np.ndarray:
    return np.array([xxhash.xxh3_64_intdigest(layer) for layer in block], "<u8")


def _new_writer() -> int:
    return int.from_bytes(os.urandom(8), "little") >> (64 - WRITER_BITS)


def _sub(spec: dict, path: str) -> dict:
    spec = dict(spec)
    spec["path"] = spec.get("path", "") + path
    return spec


def local_spec(directory: str) -> dict:
    """The embedded default: a local directory."""
    return {"driver": "file", "path": os.path.abspath(directory).rstrip("/") + "/"}


class _View:
    """What this process knows of one store's blocks: LRU order and pins. Every BlockStore on the
    same directory in a process shares one, so one host's eviction respects another host's reads
    (embedded runs)."""

    def __init__(self, keys):
        self.lock = threading.Lock()
        self.lru: collections.OrderedDict[str, None] = collections.OrderedDict((k, None) for k in keys)
        self.pins: collections.Counter[str] = collections.Counter()


_VIEWS: weakref.WeakValueDictionary[str, _View] = weakref.WeakValueDictionary()
_VIEWS_LOCK = threading.Lock()


class BlockStore:
    """put / get / contains over Full Blocks, with an optional byte budget (LRU eviction).

    `spec`: a TensorStore kvstore spec (dict or URL such as "memory://"). `sync`: fsync every
    write (durability across power loss; atomic rename already protects against process crashes).
    `context`: share one ts.Context between stores that must see the same `memory://` store.
    Raises StoreError (FingerprintMismatch) when the store cannot be opened or written.
    """

    def __init__(self, spec, layout: BlockLayout, capacity_bytes: int | None = None, sync: bool = False,
                 context: ts.Context | None = None):
        self.layout = layout
        self.context = context or ts.Context({"file_io_sync": sync, "file_io_locking": {"mode": "none"}})
        try:
            self.kv = ts.KvStore.open(spec, context=self.context).result()
            base = self.kv.spec().to_json()
            self._open_manifest()
            self.index_kv = ts.KvStore.open(_sub(base, "index/"), context=self.context).result()
            array = {"driver": "zarr3", "kvstore": _sub(base, "data/"), "fill_missing_data_reads": False,
                     "store_data_equal_to_fill_value": True, "metadata": _zarr_metadata(layout)}
            self.array = ts.open(array, create=True, open=True, context=self.context).result()
            # Writing the fill value through this handle deletes a block's data (eviction).
            self._eraser = ts.open({**array, "store_data_equal_to_fill_value": False}, open=True,
                                   context=self.context).result()
            self._check_writable()
            keys = [k.decode() for k in self.index_kv.list().result()]
        except ValueError as e:
            raise StoreError(f"cannot open store {spec!r}: {e}", cause_of(e)) from None
        self._view = self._shared_view(base, keys)
        self._lock = self._view.lock
        self._entries: dict[str, tuple[int, np.ndarray]] = {}  # hash -> (slot, layer checksums) verified here
        self._writer, self._counter = _new_writer(), 0
        self._logged_causes: set[str] = set()
        self.counters = collections.Counter({k: 0 for k in COUNTERS})
        self.capacity_bytes = None
        self.set_capacity(capacity_bytes)

    def _shared_view(self, base: dict, keys: list[str]) -> _View:
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

    # -- opening -------------------------------------------------------------------------------
    def _open_manifest(self) -> None:
        want = {"format": "dualjax-kvstore", "version": 1, "fingerprint": self.layout.fingerprint(),
                "layout": self.layout.to_json()}
        got = self.kv.read(MANIFEST).result()
        if got.state == "missing":
            stray = self.kv.list().result()
            if stray:
                raise StoreError(f"{self.kv.spec().to_json()} is not a dualjax store (no {MANIFEST}, but it holds "
                                 f"{len(stray)} keys, e.g. {stray[0]!r}); point --store at an empty or dualjax "
                                 "directory")
            self.kv.write(MANIFEST, json.dumps(want, indent=1)).result()
            return
        try:
            manifest = json.loads(got.value)
            theirs = manifest["fingerprint"]
        except (ValueError, KeyError):
            raise StoreError(f"{MANIFEST} is not a dualjax store manifest") from None
        if theirs != want["fingerprint"]:
            raise FingerprintMismatch(
                f"store fingerprint {theirs} (format {_describe(manifest.get('layout'))}) does not match this run's "
                f"{want['fingerprint']} (format {self.layout.describe()}); use another store directory, or the "
                f"store's model, weights and layout")

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

    # -- writing -------------------------------------------------------------------------------
    def _next_slot(self) -> int:
        with self._lock:
            if self._counter >= 1 << COUNTER_BITS:
                self._writer, self._counter = _new_writer(), 0
            self._counter += 1
            return (self._writer << COUNTER_BITS) | (self._counter - 1)

    def put(self, ids: list[BlockId], blocks) -> int:
        """Store Full Blocks `blocks` [n, L, T, *record] named by `ids`; returns how many were new.

        Blocks already present are skipped (putting twice is harmless). Raises ValueError for a
        misshaped block or an id whose hash does not match its parent and tokens, StoreError
        (with `.cause`, e.g. "ENOSPC") when the write fails; either way every block visible before
        stays readable and correct, and no block of this call becomes visible half-written.
        """
        if len(ids) != len(blocks):
            raise ValueError(f"put: {len(ids)} ids for {len(blocks)} blocks")
        todo = []
        for bid, block in zip(ids, blocks):
            self.layout.check_block(np.asarray(block), f"block {bid.hash}")
            if hash_block(bid.parent, bid.tokens, self.layout) != check_hash(bid.hash):
                raise ValueError(f"block id {bid.hash} does not match the hash of its parent and tokens")
        present = self._present([bid.hash for bid in ids])  # the store's word: a bad block gets rewritten
        todo = [(bid, np.asarray(b), self._next_slot()) for bid, b, p in zip(ids, blocks, present) if not p]
        if not todo:
            return 0
        self._evict_for(len(todo) * self.layout.block_bytes)
        try:
            entries = self._write_blocks(todo)
        except (ValueError, OSError) as e:
            self.counters["write_failures"] += 1
            raise StoreError(f"writing {len(todo)} blocks failed: {e}", cause_of(e)) from None
        with self._lock:
            for bid, _, _ in todo:
                self._entries[bid.hash] = entries[bid.hash]
                self._view.lru[bid.hash] = None
        self.counters["blocks_written"] += len(todo)
        self.counters["bytes_written"] += len(todo) * self.layout.block_bytes
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

    def _write_blocks(self, todo) -> dict[str, tuple[int, np.ndarray]]:
        """Data first, then index entries (a block is visible only once complete). The seam where
        tests inject write faults."""
        slots = [slot for _, _, slot in todo]
        data = np.stack([block for _, block, _ in todo])
        if slots == list(range(slots[0], slots[0] + len(slots))):  # one writer's consecutive slots: one write
            self.array[slots[0]:slots[0] + len(slots)].translate_to[0].write(data).result()
        else:
            self.array[np.array(slots, np.int64)].write(data).result()
        entries = {bid.hash: (slot, _layer_sums(block)) for bid, block, slot in todo}
        for f in [self.index_kv.write(bid.hash, self._entry(bid, *entries[bid.hash])) for bid, _, _ in todo]:
            f.result()
        return entries

    def _entry(self, bid: BlockId, slot: int, sums: np.ndarray) -> bytes:
        return _ENTRY_HEAD.pack(_ENTRY_MAGIC, slot, bytes.fromhex(bid.parent)) + sums.tobytes() + \
            np.asarray(bid.tokens, "<i4").tobytes()

    # -- index ---------------------------------------------------------------------------------
    def _present(self, hashes: list[str]) -> list[bool]:
        """Whether each block has an index entry now (one concurrent index read per block)."""
        futs = [self.index_kv.read(check_hash(h)) for h in hashes]
        out = [f.result().state == "value" for f in futs]
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
        """Forget a block found bad: drop its index entry so the next `put` writes it again."""
        with self._lock:
            self._view.lru.pop(h, None)
            self._entries.pop(h, None)
        self.index_kv.write(h, None).result()
        self.counters["invalidated"] += 1

    def _parse_entry(self, h: str, got) -> tuple[int, np.ndarray] | None:
        """(slot, layer checksums) of a verified index entry, or None: missing, or malformed (then
        dropped from the index and counted as a bad block, so the next put writes it again)."""
        if got.state != "value":
            return None
        raw, L, T, head = got.value, self.layout.n_layers, self.layout.block_tokens, _ENTRY_HEAD.size
        ok = len(raw) == head + 8 * L + 4 * T and raw.startswith(_ENTRY_MAGIC)
        _, slot, parent = _ENTRY_HEAD.unpack_from(raw) if ok else (None, -1, b"")
        if not (ok and 0 <= slot < 1 << SLOT_BITS
                and hash_block(parent.hex(), np.frombuffer(raw[head + 8 * L:], "<i4"), self.layout) == h):
            log.warning("index entry of block %s is malformed; dropped, the block is a miss", h)
            self.counters["bad_blocks"] += 1
            self.invalidate(h)
            return None
        entry = (slot, np.frombuffer(raw[head:head + 8 * L], "<u8"))
        with self._lock:
            self._entries[h] = entry
        return entry

    def _slots(self, hashes: list[str]) -> list[tuple[int, np.ndarray] | None]:
        with self._lock:
            known = [self._entries.get(h) for h in hashes]
        pending = {h: self.index_kv.read(h) for h, s in zip(hashes, known) if s is None}
        return [s if s is not None else self._parse_entry(h, pending[h].result()) for h, s in zip(hashes, known)]

    # -- reading -------------------------------------------------------------------------------
    @contextlib.contextmanager
    def pinned(self, hashes: list[str]):
        """Keep `hashes` from eviction inside the `with` block (reads in flight are pinned too)."""
        self._pin(hashes, touch=False)
        try:
            yield
        finally:
            for h in hashes:
                self._unpin(h)

    def _pin(self, hashes: list[str], touch: bool = True) -> None:
        with self._lock:
            for h in hashes:
                self._view.pins[h] += 1
                if touch and h in self._view.lru:
                    self._view.lru.move_to_end(h)

    def _unpin(self, h: str) -> None:
        with self._lock:
            self._view.pins[h] -= 1
            if self._view.pins[h] <= 0:
                del self._view.pins[h]

    def get(self, hashes: list[str], out: np.ndarray | None = None, layers: range | None = None) -> list[BlockRead]:
        """Start reading blocks into `out` [n, L, T, *record] (allocated when None); TensorStore
        copies each block (or only `layers` of it) straight into its row. Returns one
        `BlockRead` per hash, whose `result()` is that row, checked, or None (missing, corrupt or
        truncated). Blocks being read are pinned against eviction until `result()`."""
        for h in hashes:
            check_hash(h)
        layers = range(self.layout.n_layers) if layers is None else layers
        want = (len(hashes), *self.layout.full_shape)
        if out is None:
            out = np.empty(want, self.layout.np_dtype)
        elif out.shape != want or out.dtype != self.layout.np_dtype:
            raise ValueError(f"get: out has shape {out.shape} {out.dtype}, expected {want} {self.layout.dtype}")
        self._pin(hashes)
        entries = self._slots(hashes)
        rows = [i for i, e in enumerate(entries) if e is not None]
        futs: list = [None] * len(hashes)
        per = max(1, _READ_GROUP_BYTES // (self.layout.layer_bytes * len(layers)))
        for g in range(0, len(rows), per):  # a few large reads, all in flight: the first verifies while the rest land
            group = rows[g:g + per]
            fut = self._read_rows(out, group, [entries[i][0] for i in group], slice(layers.start, layers.stop))
            for i in group:
                futs[i] = fut
        return [BlockRead(self, h, out[i], futs[i], layers, e) for i, (h, e) in enumerate(zip(hashes, entries))]

    def _read_rows(self, out: np.ndarray, rows: list[int], slots: list[int], sel: slice):
        """One TensorStore read of blocks `slots` (layers `sel`) into rows `rows` of `out`."""
        dst = ts.array(out, copy=False)
        dst = dst[rows[0]:rows[-1] + 1, sel] if rows[-1] - rows[0] + 1 == len(rows) else dst[np.array(rows), sel]
        return dst.write(self.array[np.array(slots, np.int64), sel])

    def get_prefix(self, hashes: list[str]) -> list[np.ndarray]:
        """The leading run of readable blocks: a bad block is a miss for it and every block after."""
        out = []
        for read in self.get(hashes):
            block = read.result()
            if block is None:
                break
            out.append(block)
        return out

    # -- capacity ------------------------------------------------------------------------------
    def _evict_for(self, incoming: int) -> None:
        """Evict least recently used, unpinned blocks until `incoming` bytes fit the budget."""
        if self.capacity_bytes is None:
            return
        victims = []
        with self._lock:
            used = len(self._view.lru) * self.layout.block_bytes
            for h in list(self._view.lru):
                if used + incoming <= self.capacity_bytes:
                    break
                if self._view.pins[h]:
                    continue
                del self._view.lru[h]
                victims.append((h, self._entries.pop(h, None)))
                used -= self.layout.block_bytes
        for h, entry in victims:
            entry = entry if entry is not None else self._slots([h])[0]
            with self._lock:  # _slots re-caches what it reads
                self._entries.pop(h, None)
            try:
                self.index_kv.write(h, None).result()  # invisible first, then free the data
                if entry is not None:
                    self._eraser[entry[0]].write(0).result()
            except ValueError as e:  # a block not freed is still a correct block; count, go on
                log.warning("evicting block %s failed: %s", h, e)
        self.counters["evicted"] += len(victims)

    def stats(self) -> dict:
        with self._lock:
            blocks = len(self._view.lru)
        return {"blocks": blocks, "bytes": blocks * self.layout.block_bytes, "capacity_bytes": self.capacity_bytes,
                "block_bytes": self.layout.block_bytes, "fingerprint": self.layout.fingerprint(), **self.counters}

    def close(self) -> None:
        """Nothing to release beyond TensorStore handles; kept for `with` and symmetry."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


__all__ = ["BlockStore", "BlockRead", "StoreError", "FingerprintMismatch", "local_spec", "MANIFEST", "COUNTERS",
           "SLOT_BITS"]
