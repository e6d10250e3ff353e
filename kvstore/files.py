"""Where a block store's bytes live: segment files under `data/`, index entries under `index/`.

`SegmentFiles` does the I/O of `BlockStore` and nothing else: it writes a put's segment files and
makes their blocks visible, reads index entries and blocks, and deletes. On a local directory it
uses plain file I/O (a temp file allocated at its final size and written with one `pwritev`
while a writer thread checksums the blocks, renamed into place; `index/<hash>` a hard link to
it; blocks `preadv`ed straight into the caller's buffer on reader threads that verify each Layer
Block as it lands); on any
other TensorStore kvstore, TensorStore reads and writes. What names mean, which blocks are
recent, pinned or over budget is `BlockStore`'s (kvstore/store.py).
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import ctypes
import logging
import os
import threading

import numpy as np
import tensorstore as ts

from kvstore.hashing import check_hash
from kvstore.layout import BlockLayout
from kvstore.pagecache import page_cached
from kvstore.reads import pread_rows
from kvstore.segments import (
    SegmentFile,
    data_parts,
    encode_entry,
    entry_bytes,
    joined,
    layer_sums,
    read_tail,
    shard_index,
    shard_index_bytes,
    zarr_metadata,
)

log = logging.getLogger("kvstore.store")  # the store's logger: one place to watch (and capture)


_pinned: collections.Counter = collections.Counter()  # CPU -> reader threads of this process pinned to it
_pinned_lock = threading.Lock()
_thread_pin = threading.local()  # a reader thread's `_Pin`: released when the thread ends


class _Pin:
    def __init__(self, cpu: int, pool: collections.Counter):
        self.cpu, self.pool = cpu, pool

    def __del__(self):
        with _pinned_lock:
            _pinned[self.cpu] -= 1
            self.pool[self.cpu] -= 1


def _current_cpu() -> int | None:
    try:
        cpu = ctypes.CDLL(None).sched_getcpu()
    except (OSError, AttributeError):
        return None
    return cpu if cpu >= 0 else None


class ReaderPins:
    """The initializer of a pool of reader threads: it pins each new thread to one CPU of those it
    may run on, one the pool's other readers do not have where it can, then the one with the fewest
    of this process's readers, then the one the thread is running on (the scheduler starts a new
    thread on an idle CPU, which spreads the readers of several processes). Left unpinned, two
    readers woken together after an idle spell were put on one CPU and stayed there for the whole
    read, on a 2-vCPU VM: 256 MiB took 55-59 ms instead of 40-42, at the same CPU time
    (docs/store.md). Nothing happens where the thread may use one CPU only, or where the platform
    cannot pin (not Linux)."""

    def __init__(self):
        self.pool: collections.Counter = collections.Counter()

    def __call__(self) -> None:
        if not hasattr(os, "sched_setaffinity"):
            return
        allowed = sorted(os.sched_getaffinity(0))
        if len(allowed) < 2:
            return
        here = _current_cpu()
        with _pinned_lock:
            cpu = min(allowed, key=lambda c: (self.pool[c], _pinned[c], c != here))
            _pinned[cpu] += 1
            self.pool[cpu] += 1
        _thread_pin.pin = _Pin(cpu, self.pool)
        os.sched_setaffinity(0, {cpu})


def _sub(spec: dict, path: str, **resources) -> dict:
    """`spec` under `path`; file-driver context resources (`file_io_sync`, ...) set when it is one."""
    spec = dict(spec, **(resources if spec.get("driver") == "file" else {}))
    spec["path"] = spec.get("path", "") + path
    return spec


class SegmentFiles:
    """The segment files and index entries of one store (`base`: its TensorStore kvstore spec).
    Raises ValueError (TensorStore's) when they cannot be opened."""

    READER_THREADS = 2  # threads reading segment files of a local store into callers' buffers
    PIN_READERS = True  # each reader thread on a CPU of its own (`ReaderPins`)

    def __init__(self, base: dict, layout: BlockLayout, slots_per_segment: int, sync: bool, context: ts.Context):
        self.layout, self.S, self.sync = layout, slots_per_segment, sync
        self.index_kv = ts.KvStore.open(_sub(base, "index/", file_io_sync=False), context=context).result()
        data = _sub(base, "data/")
        self.data_kv = ts.KvStore.open(data, context=context).result()
        self.array = ts.open({"driver": "zarr3", "kvstore": data, "fill_missing_data_reads": False,
                              "metadata": zarr_metadata(layout, slots_per_segment)},
                             create=True, open=True, context=context).result()
        self.root = base["path"] if base.get("driver") == "file" else None  # a local directory: plain file I/O
        self._writer_pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="kvstore-write")
        self._reader_pool = concurrent.futures.ThreadPoolExecutor(
            self.READER_THREADS, thread_name_prefix="kvstore-read",
            initializer=ReaderPins() if self.PIN_READERS else None)

    def keys(self) -> list[str]:
        """Every key under `index/`."""
        return [k.decode() for k in self.index_kv.list().result()]

    def segment_key(self, segment: int) -> str:
        """The data/ key of a segment's file."""
        return ".".join([str(segment)] + ["0"] * len(self.layout.full_shape))

    def _segment_path(self, segment: int) -> str:
        return os.path.join(self.root, "data", self.segment_key(segment))

    # -- writing -------------------------------------------------------------------------------
    def write(self, todo) -> dict[str, tuple[int, np.ndarray, tuple[str, ...]]]:
        """Write blocks `todo` [(BlockId, block, slot)]: each segment's file written and put in place
        (`_write_segment`); the index links appear only once every segment file of the call is in
        place, so a block is visible only once complete. On failure nothing of this call is
        visible. Returns hash -> (slot, layer checksums, segment members). The seam where tests
        inject write faults."""
        segments = collections.defaultdict(list)
        for item in todo:
            segments[item[2] // self.S].append(item)
        entries, done, linked = {}, [], []
        try:
            for seg, items in segments.items():
                sums, entry = self._write_segment(seg, items)
                members = tuple(bid.hash for bid, _, _ in items)
                entries.update((bid.hash, (slot, s, members)) for (bid, _, slot), s in zip(items, sums))
                done.append((seg, members, entry))
            for seg, members, entry in done:
                self._link(seg, members, entry, linked)
        except BaseException:  # a link that failed (index directory full, no hard links) frees its segment too
            if linked:
                self.drop(linked, None)
            for seg in segments:
                self.drop([], seg)
            raise
        return entries

    def _write_segment(self, seg: int, items: list) -> tuple[np.ndarray, bytes]:
        """A segment's file, in place but not yet linked: its zarr3 shard index, its blocks (Layer
        Blocks in layer, slot order, from the callers' arrays) and its entry, fsynced when `sync`.
        Returns the blocks' layer checksums [n, L] and the entry. On a local directory this thread
        creates the file and writes the index and blocks with one pwritev while the writer thread
        checksums the blocks and encodes the entry (the shorter of the two, so the hand-over to
        the writer thread is not on a put's path; until 2026-12-02 the roles were the other way
        round: docs/store.md has what that changed, within this machine's noise); on two free
        cores a put takes about as long as the copy. Elsewhere one TensorStore write."""
        S, layout = self.S, self.layout
        bids, blocks, slots = ([item[k] for item in items] for k in range(3))
        index, sums = shard_index(layout, S, slots[0] % S, len(items)), np.empty((len(items), layout.n_layers), "<u8")
        if self.root is None:
            sums[:] = [layer_sums(b) for b in blocks]
            entry = encode_entry(bids, slots, sums)
            self.data_kv.write(self.segment_key(seg), joined([index, *data_parts(blocks), entry])).result()
            return sums, entry
        end = len(index) + len(blocks) * layout.block_bytes
        size = end + entry_bytes(layout, len(blocks))
        def checksummed() -> bytes:
            sums[:] = [layer_sums(b) for b in blocks]
            return encode_entry(bids, slots, sums)
        hashed = self._writer_pool.submit(checksummed)
        try:
            f = SegmentFile(self._segment_path(seg), size, [index, *data_parts(blocks)])
        except BaseException:
            hashed.exception()  # the checksums are done with `blocks` before the caller gets them back
            raise
        try:
            entry = hashed.result()
            f.write([entry], end)
        except BaseException:
            f.discard()
            raise
        f.finish(self.sync)
        return sums, entry

    def _link(self, seg: int, hashes: tuple[str, ...], entry: bytes, linked: list[str]) -> None:
        """Make a finished segment's blocks visible: `index/<hash>` a hard link to its file (each
        appears atomically; one already there, another writer's equal block, stays), or on
        kvstores without links a copy of its entry. Appends to `linked` each key it makes (before
        making it), so a caller can take them back when a later one fails."""
        if self.root is None:
            linked.extend(hashes)
            for f in [self.index_kv.write(h, entry) for h in hashes]:
                f.result()
            return
        path, index = self._segment_path(seg), os.path.join(self.root, "index", "")
        for h in hashes:
            try:
                os.link(path, index + h)
                linked.append(h)
            except FileExistsError:
                pass

    def drop(self, members, segment: int | None) -> None:
        """Delete index entries (invisible first), then the segment's file. A block not freed is
        still a correct block: failures are logged, not raised."""
        try:
            for f in [self.index_kv.write(m, None) for m in members]:
                f.result()
            if segment is not None:
                self.data_kv.write(self.segment_key(segment), None).result()
        except ValueError as e:
            log.warning("dropping blocks %s failed: %s", ", ".join(members), e)

    def empty(self, h: str) -> None:
        """Empty the local segment file that `index/<h>` links to (its entry is unreadable, so none of
        its blocks can be served): its space returns at once."""
        if self.root is not None:
            with contextlib.suppress(OSError):
                os.truncate(os.path.join(self.root, "index", h), 0)

    # -- index ---------------------------------------------------------------------------------
    def present(self, hashes: list[str]) -> list[bool]:
        """Whether each block has an index entry now (a stat per block on a local directory, else
        one concurrent index read per block)."""
        if self.root is None:
            futs = [self.index_kv.read(check_hash(h)) for h in hashes]
            return [f.result().state == "value" for f in futs]
        index = os.path.join(self.root, "index", "")
        return [os.path.isfile(index + check_hash(h)) for h in hashes]

    def raw_entries(self, hashes: list[str]) -> dict[str, bytes | None]:
        """Each block's raw entry (None: missing): the end of its index file on a local directory
        (as many bytes as an entry can take), else its index value, read concurrently."""
        if self.root is None:
            pending = {h: self.index_kv.read(h) for h in hashes}
            return {h: (got.value if got.state == "value" else None) for h, f in pending.items()
                    for got in [f.result()]}
        limit, index = entry_bytes(self.layout, self.S), os.path.join(self.root, "index")
        return {h: read_tail(os.path.join(index, h), limit) for h in hashes}

    # -- reading -------------------------------------------------------------------------------
    def read_rows(self, out: np.ndarray, rows: list[int], entries: list, sel: slice):
        """Start reading the blocks of `entries` [(slot, layer checksums, (k, n))] (layers `sel`) into rows
        `rows` of `out`: on a local directory, when `out`'s Layer Blocks are contiguous (its rows
        need not be: a layer-major buffer's are not), a reader thread copies them straight into
        `out` by `preadv` (whole blocks not in the page cache read past it, `O_DIRECT`) and checks
        their checksums (its future gives {slot: why} for blocks that failed); elsewhere one
        TensorStore read (its future raises when any block failed; the caller checks checksums)."""
        if not self.preads(out):
            dst = ts.array(out, copy=False)
            dst = dst[rows[0]:rows[-1] + 1, sel] if rows[-1] - rows[0] + 1 == len(rows) else dst[np.array(rows), sel]
            return dst.write(self.array[np.array([e[0] for e in entries], np.int64), sel])
        return self._reader_pool.submit(pread_rows, self._segment_path, self.layout, self.S,
                                        shard_index_bytes(self.layout, self.S), out, rows, entries, sel)

    def in_page_cache(self, entry: tuple) -> bool:
        """Whether the first byte of the block of `entry` (slot, checksums, (k, n)) is in the page
        cache: a local directory's segment file probed without waiting for the disk; elsewhere (and
        for a file that cannot be opened: its read will say why) True."""
        if self.root is None:
            return True
        slot, _, (k, _) = entry
        try:
            fd = os.open(self._segment_path(slot // self.S), os.O_RDONLY)
        except OSError:
            return True
        try:
            return page_cached(fd, shard_index_bytes(self.layout, self.S) + k * self.layout.layer_bytes)
        finally:
            os.close(fd)

    def preads(self, out: np.ndarray) -> bool:
        """Whether reads into `out` take the local `preadv` path (else TensorStore's)."""
        return self.root is not None and (out.size == 0 or out[0, 0].flags.c_contiguous)

    def close(self) -> None:
        """Stop the writer and reader threads."""
        self._writer_pool.shutdown()
        self._reader_pool.shutdown()
