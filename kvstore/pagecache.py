"""The page cache, asked and bypassed: whether a page of a file is in it (`page_cached`, which reads
nothing), reads that go past it (`set_direct`: `O_DIRECT` on a descriptor) and readahead advice
(`will_need`). Linux first; where the platform cannot, each says so and reads go through the
cache as before."""

from __future__ import annotations

import ctypes
import errno
import fcntl
import mmap
import os
import sys

DIRECT_ALIGN = 4096  # O_DIRECT offsets, lengths and buffer addresses: a multiple suits every device


class _CacheRange(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class _CacheStat(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in ("nr_cache", "nr_dirty", "nr_writeback", "nr_evicted",
                                                     "nr_recently_evicted")]


def _libc():
    """libc's syscall, mmap, mincore and munmap (ctypes), or None where the platform has not got them."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        calls = libc.syscall, libc.mmap, libc.mincore, libc.munmap
    except (OSError, AttributeError):
        return None
    calls[0].restype = ctypes.c_long
    calls[1].restype = ctypes.c_void_p
    calls[1].argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int64]
    calls[2].argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    calls[3].argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return calls


_LIBC = _libc()
_MAP_FAILED = ctypes.c_void_p(-1).value
# cachestat(2), Linux 6.5 on; new system calls share one number on every architecture but alpha.
_SYS_CACHESTAT = 451 if sys.platform.startswith("linux") and _LIBC is not None else None


def _cachestat(fd: int, start: int) -> bool | None:
    """Whether the page at `start` is cached, by `cachestat` (a few µs), or None where it
    cannot tell (no such call: then never asked again; a file it refuses)."""
    global _SYS_CACHESTAT
    nr = _SYS_CACHESTAT
    if nr is None:
        return None
    stat = _CacheStat()
    if _LIBC[0](ctypes.c_long(nr), ctypes.c_int(fd), ctypes.byref(_CacheRange(start, mmap.PAGESIZE)),
                ctypes.byref(stat), ctypes.c_uint(0)) == 0:
        return stat.nr_cache > 0
    if ctypes.get_errno() == errno.ENOSYS:
        _SYS_CACHESTAT = None
    return None


def _mincore(fd: int, start: int) -> bool | None:
    """Whether the page at `start` is cached, by mapping it and asking `mincore` (about 20 µs, and
    the unmapping interrupts every core the process runs on), or None where it cannot tell."""
    if _LIBC is None:
        return None
    _, mmap_, mincore, munmap = _LIBC
    addr = mmap_(None, mmap.PAGESIZE, mmap.PROT_READ, mmap.MAP_SHARED, fd, start)
    if addr in (None, _MAP_FAILED):
        return None
    try:
        vec = ctypes.create_string_buffer(1)
        return None if mincore(addr, mmap.PAGESIZE, vec) != 0 else bool(vec.raw[0] & 1)
    finally:
        munmap(addr, mmap.PAGESIZE)


def page_cached(fd: int, offset: int) -> bool:
    """Whether the page holding byte `offset` of `fd` is in the page cache, asked without reading
    it: `cachestat` says so cheaply; a miss (or no `cachestat`) is confirmed by `mincore`, since
    `cachestat` counts only the file's own mapping (an overlayfs file's pages live under the file
    beneath). Where neither can tell, and past the file's end (its read will find it short),
    cached. (Reading a byte with `RWF_NOWAIT` would start the kernel's readahead on a miss, and a
    disk that answers within the call, a virtual disk its host caches, would make a cold block
    look cached.)"""
    try:
        if offset >= os.fstat(fd).st_size:
            return True
    except OSError:
        return True
    start = offset - offset % mmap.PAGESIZE
    if _cachestat(fd, start):
        return True
    seen = _mincore(fd, start)
    return True if seen is None else seen


def set_direct(fd: int, on: bool = True) -> bool:
    """Turn `O_DIRECT` on (or off) for reads of `fd`: the disk's DMA then lands in the caller's
    buffer, no kernel copy and no page cache (offsets, lengths and buffer addresses aligned as the
    device needs: `DIRECT_ALIGN` suits every one). Returns whether it is on now: False where the
    platform or file system has none."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return False
    try:
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, flags | flag if on else flags & ~flag)
    except OSError:
        return False
    return on


def will_need(fd: int, ranges) -> None:
    """Tell the kernel every (offset, length) of `ranges` is about to be read
    (`posix_fadvise(WILLNEED)`): it starts reading them ahead at once (Linux: up to the larger of
    the device's readahead and its largest request per call), so the disk is not left idle between
    one `preadv` and the next. Only advice: where the platform or file cannot take it, nothing."""
    if hasattr(os, "posix_fadvise"):
        for offset, length in ranges:
            try:
                os.posix_fadvise(fd, offset, length, os.POSIX_FADV_WILLNEED)
            except OSError:
                return
