"""Reading blocks: `get` (`BlockStore.get`: a few large reads in flight, one `BlockRead` per block,
checked against its index entry's per-layer checksums), a storage NIC's reads of one request
(`RequestReads`), and local segment files read with `preadv` straight into the caller's buffer and
checked as they land (`pread_rows`). Uses only the store's public methods."""

from __future__ import annotations

import collections
import errno
import os

import numpy as np
import tensorstore as ts
import xxhash

from kvstore.hashing import check_hash
from kvstore.pagecache import DIRECT_ALIGN, page_cached, set_direct, will_need
from kvstore.segments import IOV_MAX

VERIFY_BYTES = 1 << 20  # bytes per preadv, verified before the next: they fit a core's L2 cache
DIRECT_BYTES = 4 << 20  # bytes per preadv of a cold read that bypasses the page cache (O_DIRECT)
READ_GROUP_BYTES = 8 << 20  # one read task covers up to this many bytes of a get


def _mismatch(block: np.ndarray, sums, layers: range) -> str | None:
    """Why Full Block `block` (a row of a caller's buffer) is bad: its first Layer Block among
    `layers` that does not match its checksum in `sums`; None when all do."""
    for layer in layers:
        if xxhash.xxh3_64_intdigest(block[layer]) != sums[layer]:
            return f"checksum mismatch in layer {layer}"
    return None


def pread_rows(segment_path, layout, S: int, data_offset: int, out: np.ndarray, rows: list[int], entries: list,
               sel: slice) -> dict[int, str]:
    """Read blocks (layers `sel`) from their segment files (`segment_path(segment)`) into rows `rows`
    of `out` with `preadv`, and check each Layer Block read against its checksum as it lands. A
    segment file holds its n blocks layer-major: the k-th block's Layer Block l at `data_offset +
    (l * n + k) * layer_bytes`, so one layer of a segment's consecutive blocks is one run of the
    file, and so are whole blocks of a whole segment. Each segment's Layer Blocks are read in file
    order, adjacent ones together (`_pread_pieces`); whole blocks not in the page cache are read
    past it with `O_DIRECT`, or where that cannot be, announced to the kernel first. `entries`:
    (slot, per-layer checksums, (k, n)) in slot order. Returns {slot: why} for blocks that failed
    (missing file, short file, I/O error, checksum mismatch)."""
    failed: dict[int, str] = {}
    by_segment = collections.defaultdict(list)
    for (slot, sums, (k, n)), row in zip(entries, rows):
        by_segment[slot // S].append((k, n, slot, row, sums))
    lb, whole = layout.layer_bytes, sel.stop - sel.start == layout.n_layers
    u8 = out.view(np.uint8)  # Layer Blocks as bytes (bfloat16 has no buffer format)
    for segment, items in by_segment.items():
        path = segment_path(segment)
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as e:
            failed.update((slot, f"{path}: {e.strerror}") for _, _, slot, _, _ in items)
            continue
        try:
            n = items[0][1]  # the items are in slot order, so the pieces in file order
            pieces = [(layer * n + k, slot, row, layer, sums) for layer in range(sel.start, sel.stop)
                      for k, _, slot, row, sums in items]
            runs = _runs(pieces)
            direct = False
            if whole and not page_cached(fd, data_offset + pieces[0][0] * lb):
                # cold: straight from the disk where the file system and the alignment allow, else announced
                direct = _aligned(out, data_offset, lb) and set_direct(fd)
                if not direct:
                    will_need(fd, [(data_offset + pieces[i][0] * lb, (j - i) * lb) for i, j in runs])
            failed.update(_pread_pieces(fd, path, lb, data_offset, u8, pieces, runs, direct))
        finally:
            os.close(fd)
    return failed


def _runs(pieces: list) -> list[tuple[int, int]]:
    """[i, j) of each run of `pieces` (in file order) whose file positions are adjacent."""
    starts = [i for i in range(len(pieces)) if i == 0 or pieces[i][0] != pieces[i - 1][0] + 1]
    return list(zip(starts, starts[1:] + [len(pieces)]))


def _aligned(out: np.ndarray, *offsets: int) -> bool:
    """Whether every Layer Block of `out` (its rows and layers) and every file offset in `offsets`
    lie on `DIRECT_ALIGN` boundaries, as an `O_DIRECT` read needs."""
    return all(x % DIRECT_ALIGN == 0 for x in (out.ctypes.data, *out.strides[:2], *offsets))


def _pread_pieces(fd: int, path: str, lb: int, data_offset: int, u8: np.ndarray, pieces: list, runs: list,
                  direct: bool) -> dict[int, str]:
    """Layer Blocks `pieces` [(position in the file's data, slot, row, layer, checksums)], in file
    order, into `u8[row, layer]` (a caller's buffer as bytes; each Layer Block contiguous, the rows
    need not be): each run of adjacent positions (`runs`, from `_runs`) in `preadv`s of at most
    `VERIFY_BYTES` (one Layer Block if larger), their iovecs the Layer Blocks, each checked right
    after the call, while the bytes are still in this core's cache (a checksum pass over memory
    costs half a copy; over cache, a fraction). `direct`: `fd` reads
    `O_DIRECT` (a cold read), `DIRECT_BYTES` per call; should the device refuse a call all the same
    (`EINVAL`: it needs a coarser alignment), `O_DIRECT` is turned off and that call and the rest go
    through the page cache. A mismatch fails its block; a short read (a file cut short) or an I/O
    error every block with a piece from there on."""
    failed: dict[int, str] = {}
    per = max(1, min((DIRECT_BYTES if direct else VERIFY_BYTES) // lb, IOV_MAX))
    for i, j in ((i, min(i + per, end)) for start, end in runs for i in range(start, end, per)):
        iov = [u8[row, layer] for _, _, row, layer, _ in pieces[i:j]]
        offset = data_offset + pieces[i][0] * lb
        try:
            try:
                got = os.preadv(fd, iov, offset)
            except OSError as e:
                if not direct or e.errno != errno.EINVAL:
                    raise
                direct = set_direct(fd, False)
                got = os.preadv(fd, iov, offset)
        except OSError as e:
            return failed | {slot: f"{path}: {e.strerror}" for _, slot, _, _, _ in pieces[i:] if slot not in failed}
        landed = i + got // lb
        for (_, slot, _, layer, sums), piece in zip(pieces[i:landed], iov):
            if slot not in failed and xxhash.xxh3_64_intdigest(piece) != sums[layer]:
                failed[slot] = f"checksum mismatch in layer {layer}"
        if landed < j:
            return failed | {slot: f"{path} is truncated" for _, slot, _, _, _ in pieces[landed:] if slot not in failed}
    return failed


def get(store, hashes: list[str], out: np.ndarray | None, layers: range | None) -> list["BlockRead"]:
    """`BlockStore.get`: pin, look the entries up, then a few large reads, all in flight (the first
    verifies while the rest land), in slot order so a read covers runs of consecutive blocks of few
    segment files whatever the request's order (a cold read then streams instead of seeking)."""
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
    rows = sorted((i for i, e in enumerate(entries) if e is not None), key=lambda i: entries[i][0])
    futs: list = [None] * len(hashes)
    per = max(1, min(READ_GROUP_BYTES // (layout.layer_bytes * len(layers)),  # every reader thread busy
                     -(-len(rows) // store.files.READER_THREADS)))
    for g in range(0, len(rows), per):
        group = rows[g:g + per]
        fut = store.files.read_rows(out, group, [entries[i] for i in group], slice(layers.start, layers.stop))
        for i in group:
            futs[i] = fut
    return [BlockRead(store, h, out[i], futs[i], layers, e) for i, (h, e) in enumerate(zip(hashes, entries))]


class RequestReads:
    """A storage NIC's reads of one request's blocks, batch by batch (blocks [b0, b1), a layer of
    them or all): the blocks are pinned and their index entries looked up once per request, not
    per batch as `get` would, and a batch is one read task with one outcome per block (read and
    verified, or not). Where `get` would go through TensorStore (not a local directory, or a buffer
    whose Layer Blocks are not contiguous), a batch is a `get`."""

    def __init__(self, store, hashes: list[str], out: np.ndarray):
        self.store, self.hashes, self.out = store, hashes, out
        self.local = store.files.preads(out)
        for h in hashes if self.local else ():  # `get` checks them itself; these become file names
            check_hash(h)
        if self.local:
            store.pin(hashes)
            self.entries = store.entries(hashes)

    def cold(self) -> bool:
        """Whether the request's first stored block is not in the page cache, so its read goes to
        the disk (local reads only; elsewhere, or with no block stored, False)."""
        first = next((e for e in self.entries if e is not None), None) if self.local else None
        return first is not None and not self.store.files.in_page_cache(first)

    def submit(self, b0: int, b1: int, layers: range):
        """Start reading blocks [b0, b1), layers `layers`, into their rows of `out`."""
        if not self.local:
            return self.store.get(self.hashes[b0:b1], self.out[b0:b1], layers=layers)
        rows = sorted((i for i in range(b0, b1) if self.entries[i] is not None), key=lambda i: self.entries[i][0])
        fut = self.store.files.read_rows(self.out, rows, [self.entries[i] for i in rows],
                                         slice(layers.start, layers.stop)) if rows else None
        return b0, b1, layers, fut

    def done(self, batch) -> bool:
        if not self.local:
            return all(r.done() for r in batch)
        return batch[3] is None or batch[3].done()

    def collect(self, batch) -> list[bool]:
        """Per block of the batch: whether it was read and verified (a bad one is dropped, as `get`
        drops it)."""
        if not self.local:
            return [r.result() is not None for r in batch]
        b0, b1, layers, fut = batch
        failed = fut.result() if fut is not None else {}
        ok = []
        for h, entry in zip(self.hashes[b0:b1], self.entries[b0:b1]):
            if entry is None:
                self.store.counters["misses"] += 1
            elif entry[0] in failed:
                self.store.block_failed(h, failed[entry[0]])
            ok.append(entry is not None and entry[0] not in failed)
        counters, n = self.store.counters, sum(ok)
        counters["layer_blocks_read"] += n * len(layers)
        counters["bytes_read"] += n * len(layers) * self.store.layout.layer_bytes
        if layers.stop == self.store.layout.n_layers:  # a block counts once, at its last layer
            counters["blocks_read"] += n
        return ok

    def close(self) -> None:
        """Release the request's pins (after its last batch is collected)."""
        if self.local:
            for h in self.hashes:
                self.store.unpin(h)


class BlockRead:
    """One block read in flight: `done()`, and `result()` -> the verified block or None.

    The block stays pinned against eviction until `result()` or `release()` is called (or the
    BlockRead is garbage-collected); no Python callback runs on TensorStore's threads.
    """

    def __init__(self, store, h: str, row: np.ndarray, fut, layers: range, entry: tuple | None):
        """`fut`: the read that fills `row` (shared by a group of blocks of one `get`), None for a
        miss: a local read's future gives {slot: why} for its blocks that failed, checksums
        included; a TensorStore read's raises when any of its blocks failed. `entry`: (slot,
        per-layer checksums, (k, n)) from the block's index entry."""
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

    def _bad(self, why: str) -> None:
        self.store.block_failed(self.hash, why)

    def __del__(self):
        if self._outcome is False:
            self.store.unpin(self.hash)

    def _collect(self) -> np.ndarray | None:
        counters = self.store.counters
        if self.fut is None:
            counters["misses"] += 1
            return None
        slot, sums, _ = self.entry
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
        why = _mismatch(self.row, sums, self.layers) if failed is None else None
        if why:
            return self._bad(why)
        counters["layer_blocks_read"] += len(self.layers)
        counters["bytes_read"] += self.row[0].nbytes * len(self.layers)
        if self.layers.stop == self.store.layout.n_layers:  # a block counts once, at its last layer
            counters["blocks_read"] += 1
        return self.row
