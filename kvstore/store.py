"""The KV block store: Full Blocks in TensorStore, named by chained content hashes.

On-disk format, under one TensorStore kvstore (a local directory by default, `memory://` in
tests, any TensorStore kvstore by changing the spec):

* `dualjax_store.json`: format, layout and fingerprint (a store refuses another fingerprint);
* `data/`: a zarr3 array `[slots, L, T, 2, K, H]`, one chunk (one file) per block, with the
  `crc32c` codec, so TensorStore checks every block's checksum as it reads, in C++;
* `index/<hash>`: a small entry (slot, parent hash, token ids) written *after* the data: a
  block becomes visible only once completely written. A read re-hashes (parent, tokens) and
  must get the key back, so the entry is verified too.

Slots are `writer_id << 24 | counter` with a random writer id per open store, so processes
writing one directory never collide and need no coordination. A block that is corrupt,
truncated or missing reads as a miss (never wrong bytes); `get_prefix` stops at the first one.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import json
import logging
import os
import struct
import threading

import numpy as np
import tensorstore as ts

from kvstore.hashing import BlockId, check_hash, hash_block
from kvstore.layout import BlockLayout

log = logging.getLogger(__name__)

MANIFEST = "dualjax_store.json"
_ENTRY_MAGIC = b"DJIX1"
_SLOT_BITS = 24


class StoreError(Exception):
    """A store that cannot be opened or written; the message says what to do."""


class FingerprintMismatch(StoreError):
    pass


def _zarr_metadata(layout: BlockLayout) -> dict:
    return {"shape": [1 << 54, *layout.full_shape], "data_type": layout.dtype,
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [1, *layout.full_shape]}},
            "chunk_key_encoding": {"name": "v2", "configuration": {"separator": "."}},
            "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}]}


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
                 context: ts.Context | None = None, read_threads: int = 8):
        self.layout, self.capacity_bytes = layout, capacity_bytes
        if capacity_bytes is not None and capacity_bytes < layout.block_bytes:
            raise StoreError(f"capacity {capacity_bytes} B is smaller than one block ({layout.block_bytes} B)")
        self.context = context or ts.Context({"file_io_sync": sync})
        try:
            self.kv = ts.KvStore.open(spec, context=self.context).result()
        except ValueError as e:
            raise StoreError(f"cannot open kvstore {spec!r}: {e}") from None
        base = self.kv.spec().to_json()
        self._open_manifest()
        self.index_kv = ts.KvStore.open(_sub(base, "index/"), context=self.context).result()
        self.array = ts.open({"driver": "zarr3", "kvstore": _sub(base, "data/"), "fill_missing_data_reads": False,
                              "store_data_equal_to_fill_value": True, "metadata": _zarr_metadata(layout)}, create=True, open=True,
                             context=self.context).result()
        self._lock = threading.Lock()
        self._entries: dict[str, int] = {}  # hash -> slot, for entries this process has seen
        self._lru: collections.OrderedDict[str, None] = collections.OrderedDict(
            (k.decode(), None) for k in self.index_kv.list().result())
        self._pins: collections.Counter[str] = collections.Counter()
        self._writer = int.from_bytes(os.urandom(4), "little") >> 2
        self._counter = 0
        self._pool = concurrent.futures.ThreadPoolExecutor(read_threads, thread_name_prefix="kvstore-read")
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
                                 f"{len(stray)} keys, e.g. {stray[0]!r}); point --store at an empty or dualjax directory")
            self.kv.write(MANIFEST, json.dumps(want, indent=1)).result()
            return
        try:
            manifest = json.loads(got.value)
            theirs = manifest["fingerprint"]
        except (ValueError, KeyError):
            raise StoreError(f"{MANIFEST} is not a dualjax store manifest") from None
        if theirs != want["fingerprint"]:
            raise FingerprintMismatch(
                f"store fingerprint {theirs} ({manifest.get('layout')}) does not match this run's {want['fingerprint']} "
                f"({want['layout']}); use another store directory or the store's model and layout")

    # -- writing -------------------------------------------------------------------------------
    def _next_slot(self) -> int:
        with self._lock:
            if self._counter >= 1 << _SLOT_BITS:
                self._writer, self._counter = int.from_bytes(os.urandom(4), "little") >> 2, 0
            self._counter += 1
            return (self._writer << _SLOT_BITS) | (self._counter - 1)

    def put(self, ids: list[BlockId], blocks) -> int:
        """Store Full Blocks `blocks` [n, L, T, 2, K, H] named by `ids`; returns how many were new.

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
            if not self.contains(bid.hash):
                todo.append((bid, np.asarray(block), self._next_slot()))
        if not todo:
            return 0
        self._evict_for(len(todo) * self.layout.block_bytes)
        try:
            for f in [self.array[slot].write(block) for _, block, slot in todo]:
                f.result()
            for f in [self.index_kv.write(bid.hash, self._entry(bid, slot)) for bid, _, slot in todo]:
                f.result()
        except ValueError as e:
            raise StoreError(f"writing {len(todo)} blocks failed: {e}") from None
        with self._lock:
            for bid, _, slot in todo:
                self._entries[bid.hash] = slot
                self._lru[bid.hash] = None
        self.counters["blocks_written"] += len(todo)
        self.counters["bytes_written"] += len(todo) * self.layout.block_bytes
        return len(todo)

    def _entry(self, bid: BlockId, slot: int) -> bytes:
        return _ENTRY_MAGIC + struct.pack("<q", slot) + bytes.fromhex(bid.parent) + \
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

    def match_prefix(self, hashes: list[str]) -> int:
        """Number of leading blocks of `hashes` present in the store."""
        for i, h in enumerate(hashes):
            if not self.contains(h):
                return i
        return len(hashes)

    def _slot_of(self, h: str) -> int | None:
        """The slot of a verified index entry, or None (missing or malformed entry)."""
        with self._lock:
            if h in self._entries:
                return self._entries[h]
        got = self.index_kv.read(h).result()
        raw = got.value
        T = self.layout.block_tokens
        if got.state != "value" or len(raw) != 5 + 8 + 16 + 4 * T or not raw.startswith(_ENTRY_MAGIC):
            return None
        slot = struct.unpack("<q", raw[5:13])[0]
        parent, tokens = raw[13:29].hex(), np.frombuffer(raw[29:], "<i4")
        if hash_block(parent, tokens, self.layout) != h:
            return None
        with self._lock:
            self._entries[h] = slot
        return slot

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

    def _read_one(self, h: str) -> np.ndarray | None:
        try:
            slot = self._slot_of(h)
            if slot is None:
                return None
            return self.array[slot].read().result()
        except ValueError as e:  # NOT_FOUND, DATA_LOSS (checksum), FAILED_PRECONDITION (truncated)
            log.warning("block %s unreadable, treated as a miss: %s", h, str(e).splitlines()[0][:200])
            self.counters["bad_blocks"] += 1
            return None
        finally:
            self._unpin(h)

    def get(self, hashes: list[str]) -> list[concurrent.futures.Future]:
        """Start reading blocks; one future per hash resolving to the verified Full Block or None
        (missing, corrupt or truncated). Blocks being read are pinned against eviction."""
        for h in hashes:
            check_hash(h)
        self._pin(hashes)
        return [self._pool.submit(self._read_one, h) for h in hashes]

    def get_prefix(self, hashes: list[str]) -> list[np.ndarray]:
        """The leading run of readable blocks: a bad block is a miss for it and every block after."""
        out = []
        for fut in self.get(hashes):
            block = fut.result()
            if block is None:
                break
            out.append(block)
        self.counters["blocks_read"] += len(out)
        self.counters["bytes_read"] += len(out) * self.layout.block_bytes
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
        for h, slot in victims:
            slot = slot if slot is not None else self._slot_of(h)
            self.index_kv.write(h, None).result()  # invisible first, then free the data
            if slot is not None:
                self.kv.write(f"data/{slot}" + ".0" * len(self.layout.full_shape), None).result()
        self.counters["evicted"] += len(victims)

    def stats(self) -> dict:
        with self._lock:
            blocks = len(self._lru)
        return {"blocks": blocks, "bytes": blocks * self.layout.block_bytes, "capacity_bytes": self.capacity_bytes,
                "block_bytes": self.layout.block_bytes, "fingerprint": self.layout.fingerprint(), **self.counters}

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


__all__ = ["BlockStore", "StoreError", "FingerprintMismatch", "local_spec", "MANIFEST"]
