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
    """Read blocks (layers `sel`) from their segment files (`segment_path(segment)`; slot s's
    Layer Block l at `data_offset + (s % S * L + l) * layer_bytes`) into rows `rows` of `out` with
    `preadv`, and check each Layer Block read against its checksum as it lands: whole blocks of
    consecutive slots as one run (when not in the page cache, read past it with `O_DIRECT`, or
    where that cannot be, announced to the kernel first), some
    of a block's layers as a run of their own, one layer one Layer Block per block. `entries`:
    (slot, per-layer checksums) in slot order. Returns {slot: why} for blocks that failed (missing
    file, short file, I/O error, checksum mismatch)."""
    failed: dict[int, str] = {}
    by_segment = collections.defaultdict(list)
    for (slot, sums), row in zip(entries, rows):
        by_segment[slot // S].append((slot, row, sums))
    whole = sel.stop - sel.start == layout.n_layers
    for segment, items in by_segment.items():
        path = segment_path(segment)
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as e:
            failed.update((slot, f"{path}: {e.strerror}") for slot, _, _ in items)
            continue
        try:
            if sel.stop - sel.start == 1:  # a layer-major read: one Layer Block per block, not adjacent in the file
                failed.update(_pread_layer(fd, path, layout, S, data_offset, out, items, sel.start))
                continue
            runs = [[items[0]]]
            for item in items[1:]:  # whole blocks of consecutive slots lie back to back: one read
                if whole and item[0] == runs[-1][-1][0] + 1:
                    runs[-1].append(item)
                else:
                    runs.append([item])
            direct = False
            if whole and not page_cached(fd, data_offset + items[0][0] % S * layout.block_bytes):
                # cold: straight from the disk where the file system and the alignment allow, else announced
                direct = _aligned(out, data_offset, layout.layer_bytes) and set_direct(fd)
                if not direct:
                    will_need(fd, [(data_offset + run[0][0] % S * layout.block_bytes, len(run) * layout.block_bytes)
                                   for run in runs])
            lean = whole and not direct and layout.block_bytes <= VERIFY_BYTES and out[items[0][1]].flags.c_contiguous
            for run in runs:
                failed.update(_pread_blocks(fd, path, layout, S, data_offset, out, run) if lean else
                              _pread_run(fd, path, layout, S, data_offset, out, run, sel, direct))
        finally:
            os.close(fd)
    return failed


def _aligned(out: np.ndarray, *offsets: int) -> bool:
    """Whether every Layer Block of `out` (its rows and layers) and every file offset in `offsets`
    lie on `DIRECT_ALIGN` boundaries, as an `O_DIRECT` read needs."""
    return all(x % DIRECT_ALIGN == 0 for x in (out.ctypes.data, *out.strides[:2], *offsets))


def _pread_layer(fd: int, path: str, layout, S: int, data_offset: int, out: np.ndarray, items: list,
                 layer: int) -> dict[int, str]:
    """Layer `layer` of each block of `items` into its row, one `preadv` and one checksum per block:
    the per-block work of `_pread_run` without its generality, since a layer-major read makes one
    call per Layer Block (Python per call was most of such a read's cost beyond the copy)."""
    failed: dict[int, str] = {}
    rows, L, lb = out[:, layer].view(np.uint8), layout.n_layers, layout.layer_bytes  # rows: contiguous Layer Blocks
    for slot, row, sums in items:
        dst = rows[row]
        try:
            got = os.preadv(fd, [dst], data_offset + (slot % S * L + layer) * lb)
        except OSError as e:
            failed[slot] = f"{path}: {e.strerror}"
            continue
        if got < lb:
            failed[slot] = f"{path} is truncated"
        elif xxhash.xxh3_64_intdigest(dst) != sums[layer]:
            failed[slot] = f"checksum mismatch in layer {layer}"
    return failed


def _pread_blocks(fd: int, path: str, layout, S: int, data_offset: int, out: np.ndarray, run: list) -> dict[int, str]:
    """Consecutive whole blocks into their rows, each row contiguous and a block at most
    `VERIFY_BYTES`: as many whole blocks per `preadv` as fit `VERIFY_BYTES`, each Layer Block checked
    right after it lands: `_pread_run`'s warm read without its generality, whose Python per chunk,
    run under one GIL, made two reader threads 25% slower than two processes doing the same reads;
    this path makes a `get` 3-5% faster (docs/store.md)."""
    lb, bb = layout.layer_bytes, layout.block_bytes
    per = max(1, min(VERIFY_BYTES // bb, IOV_MAX))
    rows = [memoryview(out[row]).cast("B") for _, row, _ in run]
    offset = data_offset + run[0][0] % S * bb
    failed: dict[int, str] = {}
    for k0 in range(0, len(run), per):
        k1 = min(k0 + per, len(run))
        try:
            got = os.preadv(fd, rows[k0:k1], offset + k0 * bb)
        except OSError as e:
            return failed | {slot: f"{path}: {e.strerror}" for slot, _, _ in run[k0:]}
        for k in range(k0, k1):
            slot, _, sums = run[k]
            if (k - k0 + 1) * bb > got:
                return failed | {slot: f"{path} is truncated" for slot, _, _ in run[k:]}
            row = rows[k]
            for layer, want in enumerate(sums.tolist()):
                if xxhash.xxh3_64_intdigest(row[layer * lb:(layer + 1) * lb]) != want:
                    failed[slot] = f"checksum mismatch in layer {layer}"
                    break
    return failed


def _pread_run(fd: int, path: str, layout, S: int, data_offset: int, out: np.ndarray, run: list,
               sel: slice, direct: bool = False) -> dict[int, str]:
    """Consecutive blocks (layers `sel`) into their rows, at most `VERIFY_BYTES` (or one Layer Block,
    if larger) per `preadv`, so a block larger than that takes several; each chunk's Layer Blocks
    checked against their checksums right after it lands, while they are still in this core's
    cache (a checksum pass over memory costs half a copy; over cache, a fraction). Each Layer Block
    of `out` is contiguous; the rows need not be (a layer-major buffer's are not), so the iovecs
    are then Layer Blocks. `direct`: `fd` reads `O_DIRECT` (a cold read), `DIRECT_BYTES` per call
    (the checks then read memory, not cache, but no kernel copy went before them); should the
    device refuse a call all the same (`EINVAL`: it needs a coarser alignment), `O_DIRECT` is
    turned off and the call and the rest of the run go through the page cache."""
    n, lb = sel.stop - sel.start, layout.layer_bytes
    contiguous = out[run[0][1]].flags.c_contiguous  # one iovec per block's share of a chunk
    per = max(1, min((DIRECT_BYTES if direct else VERIFY_BYTES) // lb, IOV_MAX))  # Layer Blocks per preadv
    offset = data_offset + (run[0][0] % S * layout.n_layers + sel.start) * lb
    failed: dict[int, str] = {}
    for c in range(0, len(run) * n, per):
        end = min(c + per, len(run) * n)
        spans = [(k, max(c, k * n) - k * n + sel.start, min(end, k * n + n) - k * n + sel.start)
                 for k in range(c // n, -(-end // n))]  # (block of the run, its first layer, stop)
        iov = [out[run[k][1], a:b].reshape(-1).view(np.uint8) for k, a, b in spans] if contiguous \
            else [out[run[k][1], layer].reshape(-1).view(np.uint8) for k, a, b in spans for layer in range(a, b)]
        try:
            try:
                got = os.preadv(fd, iov, offset + c * lb)
            except OSError as e:
                if not direct or e.errno != errno.EINVAL:
                    raise
                direct = set_direct(fd, False)
                got = os.preadv(fd, iov, offset + c * lb)
            landed = c + got // lb  # Layer Blocks of the run read so far
        except OSError as e:
            return failed | {slot: f"{path}: {e.strerror}" for slot, _, _ in run[c // n:] if slot not in failed}
        for k, a, b in spans:
            slot, row, sums = run[k]
            if k * n + b - sel.start > landed:
                return failed | {slot: f"{path} is truncated" for slot, _, _ in run[k:] if slot not in failed}
            why = None if slot in failed else _mismatch(out[row], sums, range(a, b))
            if why:
                failed[slot] = why
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
        return first is not None and not self.store.files.in_page_cache(first[0])

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
        why = _mismatch(self.row, sums, self.layers) if failed is None else None
        if why:
            return self._bad(why)
        counters["layer_blocks_read"] += len(self.layers)
        counters["bytes_read"] += self.row[0].nbytes * len(self.layers)
        if self.layers.stop == self.store.layout.n_layers:  # a block counts once, at its last layer
            counters["blocks_read"] += 1
        return self.row
