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

Slots are `writer_id << 24 | counter` with a random writer id per open store, so processes
writing one directory never collide and need no coordination (nor file locks: every chunk key
has one writer, and an index entry's content is fixed by its hash). A block that is corrupt,
truncated or missing reads as a miss (never wrong bytes); `get_prefix` stops at the first one.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import struct
import threading

import numpy as np
import tensorstore as ts
import xxhash

from kvstore.hashing import BlockId, check_hash, hash_block
from kvstore.layout import BlockLayout

log = logging.getLogger(__name__)

MANIFEST = "dualjax_store.json"
_ENTRY_MAGIC = b"DJIX3"
_ENTRY_HEAD = struct.Struct("<5sq16s")  # magic, slot, parent hash; then L xxh3-64 (<u8), T token ids (<i4)
_SLOT_BITS = 24


class StoreError(Exception):
    """A store that cannot be opened or written; the message says what to do."""


class FingerprintMismatch(StoreError):
    pass


def _zarr_metadata(layout: BlockLayout) -> dict:
    raw = {"name": "bytes", "configuration": {"endian": "little"}}
    shard = {"name": "sharding_indexed", "configuration": {
        "chunk_shape": [1, 1, *layout.layer_shape], "codecs": [raw], "index_location": "start",
        "index_codecs": [raw, {"name": "crc32c"}]}}
    return {"shape": [1 << 54, *layout.full_shape], "data_type": layout.dtype,
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [1, *layout.full_shape]}},
            "chunk_key_encoding": {"name": "v2", "configuration": {"separator": "."}}, "codecs": [shard]}


def _describe(layout_json) -> str:
    try:
        return BlockLayout.from_json(layout_json).describe()
    except (TypeError, ValueError, KeyError):
        return f"unreadable layout {layout_json!r}"


def _layer_sums(block: np.ndarray) -> np.ndarray:
    return np.array([xxhash.xxh3_64_intdigest(layer) for layer in block], "<u8")


def _sub(spec: dict, path: str) -> dict:
    spec = dict(spec)
    spec["path"] = spec.get("path", "") + path
    return spec


def local_spec(directory: str) -> dict:
    """The embedded default: a local directory."""
    return {"driver": "file", "path": os.path.abspath(directory).rstrip("/") + "/"}


class BlockStore:
    """put / get / contains over Full Blocks, with an optional byte budget (LRU eviction).

    `spec`: a TensorStore kvstore spec (dict or URL such as "memory://"). `sync`: fsync every
    write (durability across power loss; atomic rename already protects against process crashes).
    `context`: share one ts.Context between stores that must see the same `memory://` store.
    """

    def __init__(self, spec, layout: BlockLayout, capacity_bytes: int | None = None, sync: bool = False,
                 context: ts.Context | None = None):
        self.layout, self.capacity_bytes = layout, capacity_bytes
        if capacity_bytes is not None and capacity_bytes < layout.block_bytes:
            raise StoreError(f"capacity {capacity_bytes} B is smaller than one block ({layout.block_bytes} B)")
        self.context = context or ts.Context({"file_io_sync": sync, "file_io_locking": {"mode": "none"}})
        try:
            self.kv = ts.KvStore.open(spec, context=self.context).result()
        except ValueError as e:
            raise StoreError(f"cannot open kvstore {spec!r}: {e}") from None
        base = self.kv.spec().to_json()
        self._open_manifest()
        self.index_kv = ts.KvStore.open(_sub(base, "index/"), context=self.context).result()
        self.array = ts.open({"driver": "zarr3", "kvstore": _sub(base, "data/"), "fill_missing_data_reads": False,
                              "store_data_equal_to_fill_value": True, "metadata": _zarr_metadata(layout)},
                             create=True, open=True, context=self.context).result()
        self._lock = threading.Lock()
        self._entries: dict[str, tuple[int, np.ndarray]] = {}  # hash -> (slot, layer checksums) seen here
        self._lru: collections.OrderedDict[str, None] = collections.OrderedDict(
            (k.decode(), None) for k in self.index_kv.list().result())
        self._pins: collections.Counter[str] = collections.Counter()
        self._writer = int.from_bytes(os.urandom(4), "little") >> 2
        self._counter = 0
        self.counters = collections.Counter()

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

    # -- writing -------------------------------------------------------------------------------
    def _next_slot(self) -> int:
        with self._lock:
            if self._counter >= 1 << _SLOT_BITS:
                self._writer, self._counter = int.from_bytes(os.urandom(4), "little") >> 2, 0
            self._counter += 1
            return (self._writer << _SLOT_BITS) | (self._counter - 1)

    def put(self, ids: list[BlockId], blocks) -> int:
        """Store Full Blocks `blocks` [n, L, T, *record] named by `ids`; returns how many were new.

        Blocks already present are skipped (putting twice is harmless). Raises ValueError for a
        misshaped block or an id whose hash does not match its parent and tokens, StoreError when
        the write fails; either way every block visible before stays readable and correct.
        """
        if len(ids) != len(blocks):
            raise ValueError(f"put: {len(ids)} ids for {len(blocks)} blocks")
        todo = []
        for bid, block in zip(ids, blocks):
            self.layout.check_block(np.asarray(block), f"block {bid.hash}")
            if hash_block(bid.parent, bid.tokens, self.layout) != check_hash(bid.hash):
                raise ValueError(f"block id {bid.hash} does not match the hash of its parent and tokens")
            if not self._in_index(bid.hash):  # the store's word, not our cache: a bad block gets rewritten
                todo.append((bid, np.asarray(block), self._next_slot()))
        if not todo:
            return 0
        self._evict_for(len(todo) * self.layout.block_bytes)
        try:
            for f in [self.array[slot].write(block) for _, block, slot in todo]:
                f.result()
            entries = {bid.hash: (slot, _layer_sums(block)) for bid, block, slot in todo}
            for f in [self.index_kv.write(bid.hash, self._entry(bid, *entries[bid.hash])) for bid, _, _ in todo]:
                f.result()
        except ValueError as e:
            raise StoreError(f"writing {len(todo)} blocks failed: {e}") from None
        with self._lock:
            for bid, _, _ in todo:
                self._entries[bid.hash] = entries[bid.hash]
                self._lru[bid.hash] = None
        self.counters["blocks_written"] += len(todo)
        self.counters["bytes_written"] += len(todo) * self.layout.block_bytes
        return len(todo)

    def _entry(self, bid: BlockId, slot: int, sums: np.ndarray) -> bytes:
        return _ENTRY_HEAD.pack(_ENTRY_MAGIC, slot, bytes.fromhex(bid.parent)) + sums.tobytes() + \
            np.asarray(bid.tokens, "<i4").tobytes()

    # -- reading -------------------------------------------------------------------------------
    def contains(self, h: str) -> bool:
        check_hash(h)
        with self._lock:
            if h in self._lru:
                return True
        if self.index_kv.read(h).result().state == "value":  # written by another process
            with self._lock:
                self._lru[h] = None
            return True
        return False

    def _in_index(self, h: str) -> bool:
        return self.index_kv.read(h).result().state == "value"

    def invalidate(self, h: str) -> None:
        """Forget a block found bad: drop its index entry so the next `put` writes it again."""
        with self._lock:
            self._lru.pop(h, None)
            self._entries.pop(h, None)
        self.index_kv.write(h, None).result()
        self.counters["invalidated"] += 1

    def match_prefix(self, hashes: list[str]) -> int:
        """Number of leading blocks of `hashes` present in the store."""
        for i, h in enumerate(hashes):
            if not self.contains(h):
                return i
        return len(hashes)

    def _parse_entry(self, h: str, got) -> tuple[int, np.ndarray] | None:
        """(slot, layer checksums) of a verified index entry, or None (missing or malformed)."""
        raw, L, T, head = got.value, self.layout.n_layers, self.layout.block_tokens, _ENTRY_HEAD.size
        if got.state != "value" or len(raw) != head + 8 * L + 4 * T or not raw.startswith(_ENTRY_MAGIC):
            return None
        _, slot, parent = _ENTRY_HEAD.unpack_from(raw)
        if hash_block(parent.hex(), np.frombuffer(raw[head + 8 * L:], "<i4"), self.layout) != h:
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
                self._pins[h] += 1
                if touch and h in self._lru:
                    self._lru.move_to_end(h)

    def _unpin(self, h: str) -> None:
        with self._lock:
            self._pins[h] -= 1
            if self._pins[h] <= 0:
                del self._pins[h]

    def get(self, hashes: list[str], out: np.ndarray | None = None, layers: range | None = None) -> list["BlockRead"]:
        """Start reading blocks into `out` [n, L, T, *record] (allocated when None); TensorStore
        copies each block (or only `layers` of it) straight into its row. Returns one
        `BlockRead` per hash, whose `result()` is that row, checked, or None (missing, corrupt or
        truncated). Blocks being read are pinned against eviction until `result()`."""
        for h in hashes:
            check_hash(h)
        layers = range(self.layout.n_layers) if layers is None else layers
        if out is None:
            out = np.empty((len(hashes), *self.layout.full_shape), self.layout.np_dtype)
        elif out.shape != (len(hashes), *self.layout.full_shape) or out.dtype != self.layout.np_dtype:
            raise ValueError(f"get: out has shape {out.shape} {out.dtype}, expected "
                             f"{(len(hashes), *self.layout.full_shape)} {self.layout.dtype}")
        self._pin(hashes)
        dst, sel = ts.array(out, copy=False), slice(layers.start, layers.stop)
        reads = []
        for i, (h, entry) in enumerate(zip(hashes, self._slots(hashes))):
            fut = None if entry is None else dst[i, sel].write(self.array[entry[0], sel])
            reads.append(BlockRead(self, h, out[i], fut, layers, entry[1] if entry else None))
        return reads

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
        if self.capacity_bytes is None:
            return
        victims = []
        with self._lock:
            used = len(self._lru) * self.layout.block_bytes
            for h in list(self._lru):
                if used + incoming <= self.capacity_bytes:
                    break
                if self._pins[h]:
                    continue
                del self._lru[h]
                victims.append((h, self._entries.pop(h, None)))
                used -= self.layout.block_bytes
        for h, entry in victims:
            entry = entry if entry is not None else self._slots([h])[0]
            self.index_kv.write(h, None).result()  # invisible first, then free the data
            if entry is not None:
                self.kv.write(f"data/{entry[0]}" + ".0" * len(self.layout.full_shape), None).result()
        self.counters["evicted"] += len(victims)

    def stats(self) -> dict:
        with self._lock:
            blocks = len(self._lru)
        return {"blocks": blocks, "bytes": blocks * self.layout.block_bytes, "capacity_bytes": self.capacity_bytes,
                "block_bytes": self.layout.block_bytes, "fingerprint": self.layout.fingerprint(), **self.counters}

    def close(self) -> None:
        """Nothing to release beyond TensorStore handles; kept for `with` and symmetry."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class BlockRead:
    """One block read in flight: `done()`, and `result()` -> the verified block or None.

    The block stays pinned against eviction until `result()` is called (or the BlockRead is
    garbage-collected); no Python callback runs on TensorStore's threads.
    """

    def __init__(self, store: BlockStore, h: str, row: np.ndarray, fut, layers: range, sums: np.ndarray | None):
        self.store, self.hash, self.row, self.fut, self.layers, self.sums = store, h, row, fut, layers, sums
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

    def _bad(self, why: str) -> None:
        log.warning("block %s unreadable, treated as a miss and dropped from the index: %s", self.hash, why)
        self.store.counters["bad_blocks"] += 1
        self.store.invalidate(self.hash)
        return None

    def __del__(self):
        if self._outcome is False:
            self.store._unpin(self.hash)

    def _collect(self) -> np.ndarray | None:
        if self.fut is None:
            self.store.counters["misses"] += 1
            return None
        try:
            self.fut.result()
        except ValueError as e:  # NOT_FOUND (missing), FAILED_PRECONDITION (truncated)
            return self._bad(str(e).splitlines()[0][:200])
        for layer in self.layers:
            if xxhash.xxh3_64_intdigest(self.row[layer]) != self.sums[layer]:
                return self._bad(f"checksum mismatch in layer {layer}")
        self.store.counters["layer_blocks_read"] += len(self.layers)
        self.store.counters["bytes_read"] += self.row[0].nbytes * len(self.layers)
        return self.row


__all__ = ["BlockStore", "BlockRead", "StoreError", "FingerprintMismatch", "local_spec", "MANIFEST"]
