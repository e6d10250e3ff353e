"""The POSIX back end's reads: a read task copies Layer Blocks out of local segment files with
`preadv`, straight into the caller's buffer, and checks each against its checksum as it lands
(`pread_rows`), on reader threads pinned each to a CPU of its own (`ReaderPins`).

A segment file holds its n blocks layer-major: the k-th block's Layer Block l lies at
`data_offset + (l * n + k) * layer_bytes`, so one layer of a segment's consecutive blocks is one
run of the file, and so are whole blocks of a whole segment. A task reads each segment's Layer
Blocks in file order, each run of adjacent ones in calls of at most `VERIFY_BYTES` (each checked
right after its call, while it is still in the core's cache); whole blocks not in the page cache
are read past it (`O_DIRECT`, `DIRECT_BYTES` a call) or, where that cannot be, announced to the
kernel first.
"""

from __future__ import annotations

import collections
import ctypes
import errno
import os
import threading
from typing import NamedTuple

import numpy as np
import xxhash

from kvstore.layout import BlockLayout
from kvstore.pagecache import DIRECT_ALIGN, page_cached, set_direct, will_need
from kvstore.segments import Entry

VERIFY_BYTES = 1 << 20  # bytes per preadv, verified before the next: they fit a core's L2 cache
DIRECT_BYTES = 4 << 20  # bytes per preadv of a cold read that bypasses the page cache (O_DIRECT)
IOV_MAX = 1024  # buffers per preadv / pwritev call (Linux's IOV_MAX)


class Piece(NamedTuple):
    """One Layer Block a read task copies: its position in its segment file's data (in Layer
    Blocks), its block's slot, the row and layer of the caller's buffer it lands in, and its
    block's checksums."""

    at: int
    slot: int
    row: int
    layer: int
    sums: np.ndarray


def pread_rows(segment_path, layout: BlockLayout, S: int, data_offset: int, out: np.ndarray, rows: list[int],
               entries: list[Entry], sel: slice) -> dict[int, str]:
    """Read blocks `entries` (in slot order; layers `sel`) from their segment files
    (`segment_path(segment)`, S blocks a segment) into rows `rows` of `out` with `preadv`, each Layer Block checked
    against its checksum as it lands. Returns {slot: why} for blocks that failed (missing file,
    short file, I/O error, checksum mismatch)."""
    failed: dict[int, str] = {}
    by_segment = collections.defaultdict(list)
    for entry, row in zip(entries, rows):
        by_segment[entry.slot // S].append((entry, row))
    lb, whole = layout.layer_bytes, sel.stop - sel.start == layout.n_layers
    u8 = out.view(np.uint8)  # Layer Blocks as bytes (bfloat16 has no buffer format)
    for segment, items in by_segment.items():
        path = segment_path(segment)
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as e:
            failed.update((entry.slot, f"{path}: {e.strerror}") for entry, _ in items)
            continue
        try:
            n = len(items[0][0].members)  # the items are in slot order, so the pieces in file order
            pieces = [Piece(layer * n + e.k, e.slot, row, layer, e.sums) for layer in range(sel.start, sel.stop)
                      for e, row in items]
            runs = _runs(pieces)
            direct = False
            if whole and not page_cached(fd, data_offset + pieces[0].at * lb):
                # cold: straight from the disk where the file system and the alignment allow, else announced
                direct = _aligned(out, data_offset, lb) and set_direct(fd)
                if not direct:
                    will_need(fd, [(data_offset + pieces[i].at * lb, (j - i) * lb) for i, j in runs])
            failed.update(_pread_pieces(fd, path, lb, data_offset, u8, pieces, runs, direct))
        finally:
            os.close(fd)
    return failed


def _runs(pieces: list[Piece]) -> list[tuple[int, int]]:
    """[i, j) of each run of `pieces` (in file order) whose file positions are adjacent."""
    starts = [i for i in range(len(pieces)) if i == 0 or pieces[i].at != pieces[i - 1].at + 1]
    return list(zip(starts, starts[1:] + [len(pieces)]))


def _aligned(out: np.ndarray, *offsets: int) -> bool:
    """Whether every Layer Block of `out` (its rows and layers) and every file offset in `offsets`
    lie on `DIRECT_ALIGN` boundaries, as an `O_DIRECT` read needs."""
    return all(x % DIRECT_ALIGN == 0 for x in (out.ctypes.data, *out.strides[:2], *offsets))


def _pread_pieces(fd: int, path: str, lb: int, data_offset: int, u8: np.ndarray, pieces: list[Piece], runs: list,
                  direct: bool) -> dict[int, str]:
    """`pieces` (in file order) into `u8[row, layer]` (a caller's buffer as bytes; each Layer Block
    contiguous, the rows need not be): each run of adjacent positions (`runs`, from `_runs`) in
    `preadv`s of at most `VERIFY_BYTES` (one Layer Block if larger), their iovecs the Layer Blocks,
    each checked right after the call, while the bytes are still in this core's cache (a checksum
    pass over memory costs half a copy; over cache, a fraction). `direct`: `fd` reads `O_DIRECT`
    (a cold read), `DIRECT_BYTES` per call; should the device refuse a call all the same
    (`EINVAL`: it needs a coarser alignment), `O_DIRECT` is turned off and that call and the rest
    go through the page cache. A mismatch fails its block; a short read (a file cut short) or an
    I/O error every block with a piece from there on."""
    failed: dict[int, str] = {}
    per = max(1, min((DIRECT_BYTES if direct else VERIFY_BYTES) // lb, IOV_MAX))
    for i, j in ((i, min(i + per, end)) for start, end in runs for i in range(start, end, per)):
        iov = [u8[p.row, p.layer] for p in pieces[i:j]]
        offset = data_offset + pieces[i].at * lb
        try:
            try:
                got = os.preadv(fd, iov, offset)
            except OSError as e:
                if not direct or e.errno != errno.EINVAL:
                    raise
                direct = set_direct(fd, False)
                got = os.preadv(fd, iov, offset)
        except OSError as e:
            return failed | {p.slot: f"{path}: {e.strerror}" for p in pieces[i:] if p.slot not in failed}
        landed = i + got // lb
        for p, piece in zip(pieces[i:landed], iov):
            if p.slot not in failed and xxhash.xxh3_64_intdigest(piece) != p.sums[p.layer]:
                failed[p.slot] = f"checksum mismatch in layer {p.layer}"
        if landed < j:
            return failed | {p.slot: f"{path} is truncated" for p in pieces[landed:] if p.slot not in failed}
    return failed


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
    readers woken together after an idle spell can be put on one CPU and kept there for the whole
    read. Nothing happens where the thread may use one CPU only, or where the platform cannot pin
    (not Linux)."""

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
