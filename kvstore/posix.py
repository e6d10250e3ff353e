"""The POSIX back end: a store on a local directory, read and written with plain system calls.

TensorStore takes no part in this back end's I/O (it opens the store: kvstore/metadata.py). The
files it writes are the zarr3 array that `data/zarr.json` describes, so TensorStore can open and
read them; dualjax reads and writes them itself, with:

* a put: per segment, a temp file in `data/` allocated at its final size (`posix_fallocate`: a
  full disk fails at once, and the writes skip delayed allocation's per-page work), its shard
  index and the caller's blocks written with one `pwritev` (no copy) while a writer thread
  checksums the blocks and encodes the entry, then the entry after the blocks, an `fsync` when
  `sync`, a rename into place; and only then `index/<hash>`, a hard link to the file, per block;
* a lookup: a `stat` of `index/<hash>`, and the entry `pread` from the linked file's end;
* a read: `preadv` straight into the caller's buffer on reader threads (kvstore/preads.py);
* eviction and bad segments: `unlink` of the links, then of the file.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import errno
import os
import threading

import numpy as np

from kvstore.backend import Backend, BlockWrite, log
from kvstore.hashing import check_hash
from kvstore.layout import BlockLayout
from kvstore.pagecache import page_cached
from kvstore.preads import IOV_MAX, ReaderPins, pread_rows
from kvstore.segments import (
    Entry,
    bytes_of,
    data_parts,
    encode_entry,
    entry_bytes,
    layer_sums,
    segment_key,
    shard_index,
    shard_index_bytes,
)


class PosixBackend(Backend):
    """The segment files and index links of a store in local directory `root`."""

    READER_THREADS = 2  # threads reading segment files into callers' buffers
    PIN_READERS = True  # each reader thread on a CPU of its own (`ReaderPins`)

    def __init__(self, root: str, layout: BlockLayout, slots_per_segment: int, sync: bool):
        super().__init__(layout, slots_per_segment)
        self.root, self.sync, self.readers = root, sync, self.READER_THREADS
        self._index = os.path.join(root, "index", "")
        self._data_offset = shard_index_bytes(layout, slots_per_segment)
        self._writer_pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="kvstore-write")
        self._reader_pool = concurrent.futures.ThreadPoolExecutor(
            self.READER_THREADS, thread_name_prefix="kvstore-read",
            initializer=ReaderPins() if self.PIN_READERS else None)

    def segment_path(self, segment: int) -> str:
        return os.path.join(self.root, "data", segment_key(self.layout, segment))

    # -- writing -------------------------------------------------------------------------------
    def write_segment(self, seg: int, items: list[BlockWrite]) -> tuple[np.ndarray, bytes]:
        """This thread creates the file and writes the shard index and blocks with one `pwritev`
        while the writer thread checksums the blocks and encodes the entry (the shorter task, so
        the hand-over is not on a put's path); on two free cores a put takes about as long as the
        copy."""
        S, layout = self.S, self.layout
        blocks = [item.block for item in items]
        index = shard_index(layout, S, items[0].slot % S, len(items))
        sums = np.empty((len(items), layout.n_layers), "<u8")
        end = len(index) + len(blocks) * layout.block_bytes

        def checksummed() -> bytes:
            sums[:] = [layer_sums(b) for b in blocks]
            return encode_entry([item.bid for item in items], [item.slot for item in items], sums)
        hashed = self._writer_pool.submit(checksummed)
        try:
            f = SegmentFile(self.segment_path(seg), end + entry_bytes(layout, len(blocks)),
                            [index, *data_parts(blocks)])
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

    def link(self, seg: int, hashes: tuple[str, ...], entry: bytes, linked: list[str]) -> None:
        """`index/<hash>`: a hard link to the segment file (each appears atomically)."""
        path = self.segment_path(seg)
        for h in hashes:
            try:
                os.link(path, self._index + h)
                linked.append(h)
            except FileExistsError:
                pass

    def drop(self, members, segment: int | None) -> None:
        paths = [self._index + m for m in members] + ([self.segment_path(segment)] if segment is not None else [])
        for path in paths:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            except OSError as e:  # a link left in place keeps its segment file too: both stay correct
                log.warning("dropping blocks %s failed: %s: %s", ", ".join(members), path, e.strerror)
                return

    def discard_entry(self, h: str) -> None:
        """Empty the segment file `index/<h>` links to (its entry is unreadable, so none of its
        blocks can be served): its space returns at once."""
        with contextlib.suppress(OSError):
            os.truncate(self._index + h, 0)

    def take(self, prefix: str) -> int:
        directory = os.path.join(self.root, prefix)
        try:
            names = os.listdir(directory)
        except OSError:
            return 0
        taken = 0
        for name in names:
            with contextlib.suppress(FileNotFoundError):  # another process took it first
                os.unlink(os.path.join(directory, name))
                taken += 1
        return taken

    # -- index ---------------------------------------------------------------------------------
    def keys(self) -> list[str]:
        try:
            return os.listdir(self._index)
        except FileNotFoundError:
            return []

    def present(self, hashes: list[str]) -> list[bool]:
        """A `stat` per block."""
        return [os.path.isfile(self._index + check_hash(h)) for h in hashes]

    def raw_entries(self, hashes: list[str]) -> dict[str, bytes | None]:
        """The end of each block's index file, as many bytes as an entry can take."""
        limit = entry_bytes(self.layout, self.S)
        return {h: read_tail(self._index + h, limit) for h in hashes}

    # -- reading -------------------------------------------------------------------------------
    def read(self, out: np.ndarray, rows: list[int], entries: list[Entry], layers: slice):
        """On a reader thread, by `preadv` straight into `out` when its Layer Blocks are contiguous
        (its rows need not be: a layer-major buffer's are not), else into a buffer of whole blocks
        copied into `out` after."""
        if out.size == 0 or out[0, 0].flags.c_contiguous:
            return self._reader_pool.submit(pread_rows, self.segment_path, self.layout, self.S, self._data_offset,
                                            out, rows, entries, layers)
        return self._reader_pool.submit(self._read_copied, out, rows, entries, layers)

    def _read_copied(self, out: np.ndarray, rows: list[int], entries: list[Entry], layers: slice) -> dict[int, str]:
        whole = self.layout.empty(len(rows))
        failed = pread_rows(self.segment_path, self.layout, self.S, self._data_offset, whole, range(len(rows)),
                            entries, layers)
        out[np.array(rows), layers] = whole[:, layers]
        return failed

    def cold(self, entry: Entry) -> bool:
        """Whether the block's first byte is not in the page cache (asked without waiting for the
        disk; a file that cannot be opened is not cold: its read will say why)."""
        try:
            fd = os.open(self.segment_path(entry.slot // self.S), os.O_RDONLY)
        except OSError:
            return False
        try:
            return not page_cached(fd, self._data_offset + entry.k * self.layout.layer_bytes)
        finally:
            os.close(fd)

    def close(self) -> None:
        self._writer_pool.shutdown()
        self._reader_pool.shutdown()


def read_tail(path: str, limit: int) -> bytes | None:
    """The last `limit` bytes of a local file (all of a shorter one); None when it does not exist,
    b"" when it cannot be read (a lookup then finds no entry: a bad block, not a crash)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    except OSError:
        return b""
    try:
        size = os.fstat(fd).st_size
        return os.pread(fd, min(size, limit), max(0, size - limit))
    except OSError:
        return b""
    finally:
        os.close(fd)


def _pwrite_all(fd: int, parts: list, offset: int) -> int:
    """Write `parts` from `offset` on (writev's short writes resumed); returns the end offset."""
    views = [bytes_of(p) for p in parts]
    while views:
        done = os.pwritev(fd, views[:IOV_MAX], offset)
        offset += done
        while views and done >= len(views[0]):
            done -= len(views.pop(0))
        if views and done:
            views[0] = views[0][done:]
    return offset


def _preallocate(fd: int, size: int) -> None:
    """Allocate the file's blocks up front (fewer extent updates while it is written); where the
    platform or file system cannot (no `posix_fallocate`, EOPNOTSUPP, EINVAL), it is written
    without. A full disk still raises (ENOSPC)."""
    try:
        os.posix_fallocate(fd, 0, size)
    except AttributeError:
        pass
    except OSError as e:
        if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise


class SegmentFile:
    """A local segment file in the making, in a temp file beside `path` (unique to this process
    and thread) of `size` bytes, allocated up front, `parts` written from offset 0 in place from
    the caller's arrays, no copy; `write` adds more (from any thread); `finish(sync)` fsyncs when
    `sync` and renames the file into place (atomic); `discard()` removes the temp file. A failure
    while it is made leaves nothing behind."""

    def __init__(self, path: str, size: int, parts: list):
        self.path, self.tmp = path, f"{path}.{os.getpid()}-{threading.get_ident()}.tmp"
        self.fd: int | None = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _preallocate(self.fd, size)
            _pwrite_all(self.fd, parts, 0)
        except BaseException:  # an interrupt too: this runs on the caller's thread
            self.discard()
            raise

    def write(self, parts: list, offset: int) -> None:
        _pwrite_all(self.fd, parts, offset)

    def finish(self, sync: bool) -> None:
        try:
            if sync:
                os.fsync(self.fd)
            fd, self.fd = self.fd, None
            os.close(fd)
            os.replace(self.tmp, self.path)
        except BaseException:
            self.discard()
            raise

    def discard(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = None
        with contextlib.suppress(OSError):
            os.unlink(self.tmp)
