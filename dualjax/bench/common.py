"""Shared benchmark helpers: robust timing and the one-JSON-object output convention."""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import logging
import os
import platform
import statistics
import sys
import time
from typing import Any, NamedTuple

import jax
import numpy as np
import xxhash

from dualjax.outputs import output_file, write_json
from kvstore.pagecache import DIRECT_ALIGN, set_direct
from kvstore.preads import VERIFY_BYTES


def show_progress() -> None:
    """A long run's progress on stderr: dualjax's INFO lines as plain messages, while other
    libraries stay at WARNING (JAX reports at INFO each accelerator backend it could not start)."""
    logging.basicConfig(level=logging.WARNING, format="%(message)s", force=True)
    if logging.getLogger("dualjax").level == logging.NOTSET:  # unless --log-level set it
        logging.getLogger("dualjax").setLevel(logging.INFO)


class Timed(NamedTuple):
    """One timed call: when it started (`time.perf_counter`), its wall seconds, this process's CPU
    seconds meanwhile (every thread), and what it returned."""

    start: float
    wall_s: float
    cpu_s: float
    result: Any


def timed(fn, *args, **kwargs) -> Timed:
    """`fn(*args, **kwargs)`, timed (`Timed`)."""
    c0, t0 = time.process_time(), time.perf_counter()
    result = fn(*args, **kwargs)
    return Timed(t0, time.perf_counter() - t0, time.process_time() - c0, result)


def gbps(nbytes: int, seconds: float) -> float:
    """Decimal gigabytes per second of `nbytes` moved in `seconds`."""
    return nbytes / seconds / 1e9


def timeit(fn, repeats: int = 5, warmup: int = 1) -> float:
    """Median wall seconds of `fn()` (its result is blocked on, so async dispatch is counted)."""
    for _ in range(warmup):
        jax.block_until_ready(fn())
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def matmul_flops_per_s(n: int = 1024, dtype=np.float32) -> float:
    """This machine's dense matmul FLOP/s through XLA: the roofline the model is compared with."""
    a = jax.numpy.asarray(np.random.default_rng(0).standard_normal((n, n)), dtype)
    f = jax.jit(lambda x: x @ x)
    return 2 * n**3 / timeit(lambda: f(a), repeats=7, warmup=2)


def machine() -> dict:
    return {"platform": platform.platform(), "python": platform.python_version(), "jax": jax.__version__,
            "backend": jax.default_backend(), "devices": len(jax.devices())}


def add_common(p: argparse.ArgumentParser) -> None:
    """The flags every benchmark takes."""
    p.add_argument("--json", metavar="FILE", type=output_file, help="also write the JSON object to FILE")
    p.add_argument("--quick", action="store_true", help="smaller grid for CI smoke runs")


def bench_args(name: str, description: str, add_arguments, argv=None, args=None) -> argparse.Namespace:
    """`args` when the `dualjax` parser parsed them (`dualjax bench NAME`), else `argv` parsed by the
    benchmark's own parser (`python -m dualjax.bench.NAME`, tests): the common flags and `add_arguments`'."""
    if args is not None:
        return args
    p = argparse.ArgumentParser(prog=f"dualjax bench {name}", description=description)
    add_common(p)
    add_arguments(p)
    return p.parse_args(argv)


def emit(result: dict, path: str | None) -> None:
    """Print the one JSON object (stdout) and write it to `path` when given."""
    print(json.dumps(result, indent=1, sort_keys=False))
    if path:
        write_json(path, result)
    sys.stdout.flush()


def trials_within(trials: int, budget_s: float, least: int = 2):
    """Trial numbers 0, 1, ... up to `trials`, with no new one once `budget_s` seconds have passed
    since the first (but at least `least`): a slow machine bounds its own wall time."""
    t_end = time.perf_counter() + budget_s
    for t in range(trials):
        if t >= least and time.perf_counter() >= t_end:
            return
        yield t


def raw_parallel_read(path: str, buf: np.ndarray, threads: int, checksum_bytes: int = 0,
                      direct: bool = False) -> None:
    """`path` into `buf` (reused, as large as the file) by `threads` threads, each `preadv`ing its
    share: the machine's plain read at a given parallelism, with no format and no checks (the
    benchmarks' raw yardstick at the store's own parallelism). With `checksum_bytes`, each thread
    reads `VERIFY_BYTES` at a time and runs XXH3 over each `checksum_bytes` piece right after it
    lands, as the store verifies its reads: the least a checked read costs here when the kernel
    makes the copy (a copy with non-temporal stores can beat it).
    `direct`: the file opened `O_DIRECT` (past the page cache, as the store reads cold blocks; `buf`
    page-aligned, each share a whole number of pages)."""
    view = buf.reshape(-1).view(np.uint8)
    share = -(-view.nbytes // threads)
    fd = os.open(path, os.O_RDONLY)
    if direct:
        share = -(-share // DIRECT_ALIGN) * DIRECT_ALIGN
        if view.ctypes.data % DIRECT_ALIGN or not set_direct(fd):
            os.close(fd)
            raise ValueError(f"raw_parallel_read: no O_DIRECT read of {path} into this buffer")

    def read(i: int) -> None:
        mine = view[i * share:(i + 1) * share]
        if not checksum_bytes:
            if os.preadv(fd, [mine], i * share) != mine.nbytes:  # a short read would overstate GB/s
                raise OSError(f"short read of {path}")
            return
        for c in range(0, mine.size, VERIFY_BYTES):
            chunk = mine[c:c + VERIFY_BYTES]
            os.preadv(fd, [chunk], i * share + c)
            for p in range(0, chunk.size, checksum_bytes):
                xxhash.xxh3_64_intdigest(chunk[p:p + checksum_bytes])
    try:
        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            list(pool.map(read, range(threads)))
    finally:
        os.close(fd)


def _files(paths: list[str]) -> list[str]:
    """The files among `paths` and under its directories, each once (a store's index entries are
    hard links to its segment files)."""
    found = [p for p in paths if os.path.isfile(p)] + [
        os.path.join(d, f) for p in paths if os.path.isdir(p) for d, _, fs in os.walk(p) for f in fs]
    seen, out = set(), []
    for path in found:
        st = os.stat(path)
        if (st.st_dev, st.st_ino) not in seen:
            seen.add((st.st_dev, st.st_ino))
            out.append(path)
    return out


def drop_page_cache(paths: list[str]) -> None:
    """Evict the files under `paths` from the page cache (`posix_fadvise(DONTNEED)` on clean pages,
    no privileges needed), so the next read comes from the disk: a cold read."""
    for path in _files(paths):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)  # dirty pages cannot be dropped
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def load_page_cache(paths: list[str]) -> None:
    """Read the files under `paths` through the page cache, so the next read of them is warm. A
    warm figure needs it after a cold one: the store reads a block whose first page is not cached
    past the page cache (`O_DIRECT`), so a cold store stays cold however often it is read."""
    buf = bytearray(8 << 20)
    for path in _files(paths):
        with open(path, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass
