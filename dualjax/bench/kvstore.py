"""KV block store throughput against plain NumPy file I/O of the same bytes, on the same disk.

    dualjax bench kvstore --json FILE [--dir DIR] [--quick] [--max-wall-s S]

Reads: Full Blocks fetched in random order through one `BlockStore.get` (and layer-major, one
`get` per layer; and layer-major as a layerwise prefill reads them, a request's blocks in order
through an uncapped `StorageNIC` into the runtime's layer-major buffer), every Layer Block
checksum-verified, versus a plain read of one file with the
same bytes by `preadv` into a reused buffer with as many threads as the store reads with (and, for
comparison, `numpy.fromfile`, and with XXH3 over each Layer Block as it lands: the checksum's own
cost); both from the page cache after a warm-up, and both cold (their files
dropped from the page cache before each read; the store's `get` and its storage NIC's layer-major
read, each against the same raw cold reads; the store reads cold Full Blocks past the page cache,
`O_DIRECT`, so they are also held against a raw `O_DIRECT` read of the same file), in
interleaved trials (median). Writes at equal
durability: `BlockStore.put` of 8 blocks at a time (one segment file per put, its index entry
inside; each block visible atomically, only once complete) versus `tofile` to a temp file and a
rename, with no fsync on either side, and with fsync on both. Cap: reads through a capped
`StorageNIC`. The store's TensorStore back end against its POSIX back end (the default on a
local directory), on the same disk. Also reads of alternative TensorStore formats (zarr3 chunk
per block, one `file` key per block, OCDBT) so the format choice is measured, not assumed.
`--max-wall-s` bounds the benchmark's wall time: each phase gets its share of the time left when it
starts (`PHASES`) and starts no new trial past it, after its least (two; one per other format).
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import resource
import shutil
import statistics
import tempfile
import time

import numpy as np
import tensorstore as ts

import kvstore as kv
import models
from dualjax.bench.common import (
    bench_args,
    drop_page_cache,
    emit,
    gbps,
    load_page_cache,
    raw_parallel_read,
    show_progress,
    trials_within,
)
from dualjax.core.config import number
from dualjax.outputs import output_dir
from dualjax.runtime.buffers import RequestKV
from dualjax.runtime.store import layout_for
from kvstore.pagecache import set_direct

log = logging.getLogger("dualjax.bench.kvstore")
# the phases that time trials and their weights in the wall time: the reads' cold trials take half
# of a phase more; the cap's single read is not bounded
PHASES = {"reads": 1.5, "writes": 1.0, "reads qwen2.5-32b": 1.5, "tensorstore": 1.0, "formats": 1.0,
          "formats qwen2.5-32b": 1.0}
MAX_WALL_S, QUICK_MAX_WALL_S = 180.0, 45.0  # --max-wall-s's defaults


class Shares:
    """Each phase's share of the wall time left before `deadline` (perf_counter seconds): its weight
    among the `PHASES` still to run."""

    def __init__(self, deadline: float, clock=time.perf_counter):
        self.deadline, self.left, self.clock = deadline, dict(PHASES), clock

    def __call__(self, phase: str) -> float:
        """Seconds of trials for `phase`, per unit of its weight (what the phase's function takes)."""
        total = sum(self.left.values())
        self.left.pop(phase)
        return max(0.0, self.deadline - self.clock()) / total


def _fill(store: kv.BlockStore, n: int, seed: int = 0):
    layout = store.layout
    ids = kv.block_chain(np.random.default_rng(seed).integers(0, 1 << 30, n * layout.block_tokens), layout)
    blocks = np.random.default_rng(seed).standard_normal((n, *layout.full_shape)).astype(layout.np_dtype)
    t0 = _now()
    for i in range(0, n, 8):  # a DE writes back a few blocks at a time
        store.put(ids[i:i + 8], blocks[i:i + 8])
    return ids, blocks, _since(t0)


def _now() -> tuple[float, float]:
    """(wall, CPU) seconds; CPU counts every thread of this process (TensorStore's too), so its
    ratios hold on a loaded machine where wall-clock ratios mostly measure the scheduler."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return time.perf_counter(), r.ru_utime + r.ru_stime


def _since(t0: tuple[float, float]) -> tuple[float, float]:
    t1 = _now()
    return t1[0] - t0[0], t1[1] - t0[1]


def _store_read(store, hashes, rng, out, layer_major: bool = False) -> tuple[float, float]:
    """A request's blocks in random order, as one `get` (whole Full Blocks) or one per layer
    (layer-major Layer Blocks); every piece is checksum-verified before the clock stops."""
    order = [hashes[i] for i in rng.permutation(len(hashes))]
    spans = [range(layer, layer + 1) for layer in range(store.layout.n_layers)] if layer_major else [None]
    t0 = _now()
    got = [r.result() for layers in spans for r in store.get(order, out, layers=layers)]
    dt = _since(t0)
    assert all(g is not None for g in got)
    return dt


def _nic_read(nic: kv.StorageNIC, store, hashes, rkv: RequestKV) -> tuple[float, float]:
    """A request's blocks in order, layer-major, through an uncapped `StorageNIC` into the runtime's
    layer-major buffer: the read a layerwise prefill makes."""
    t0 = _now()
    got = nic.read(store, hashes, out=rkv.blocks, layer_major=True).wait()
    dt = _since(t0)
    assert got == len(hashes)
    return dt


def _raw_read(path, buf: np.ndarray, threads: int, checksum_bytes: int = 0,
              direct: bool = False) -> tuple[float, float]:
    """The same bytes from one file into a reused buffer at the store's own parallelism, timed
    (with `checksum_bytes`, XXH3 over each Layer Block as it lands: the checksum's own cost;
    `direct`: past the page cache, `O_DIRECT`)."""
    t0 = _now()
    raw_parallel_read(path, buf, threads, checksum_bytes, direct)
    return _since(t0)


def _raw_fromfile(path) -> tuple[float, float]:
    """The benchmark's first raw read (kept for comparison): `numpy.fromfile` allocates a new buffer."""
    t0 = _now()
    np.fromfile(path, np.uint8)
    return _since(t0)


def _raw_write(path, data: np.ndarray, sync: bool) -> tuple[float, float]:
    """One file of the same bytes, made visible atomically (temp file + rename) as the store's blocks
    are; fsynced when `sync` (the store then fsyncs each of its files)."""
    t0 = _now()
    data.tofile(path + ".tmp")
    if sync:
        fd = os.open(path + ".tmp", os.O_RDONLY)
        os.fsync(fd)
        os.close(fd)
    os.replace(path + ".tmp", path)
    return _since(t0)


def read_figures(layout: kv.BlockLayout, n: int, workdir: str, trials: int, budget_s: float = math.inf) -> dict:
    """Interleaved store/raw read trials on `n` blocks of `layout` (page cache, after warm-up; then
    cold: a `get` and a storage NIC's layer-major read), no new warm trial once `budget_s` has
    passed nor cold one once half of it has (at least two of each)."""
    tag = layout.fingerprint()[:8]
    store_dir = os.path.join(workdir, f"read-{tag}")
    with kv.BlockStore(kv.local_spec(store_dir), layout) as store:
        ids, blocks, _ = _fill(store, n)
        raw = os.path.join(workdir, f"raw-{tag}.bin")
        blocks.tofile(raw)
        hashes = [b.hash for b in ids]
        rng = np.random.default_rng(1)
        # The buffers reads land in, allocated once and page-aligned as the runtime's are (a kernel
        # copy into NumPy's own, 16 bytes past a page, runs at a fraction of its speed on some CPUs).
        out, raw_buf = layout.empty(n), layout.empty(n)
        threads = kv.BlockStore.READER_THREADS
        rkv, nic = RequestKV(layout, n * layout.block_tokens), kv.StorageNIC("bench")
        _store_read(store, hashes, rng, out), _store_read(store, hashes, rng, out, True)  # warm-up
        _raw_read(raw, raw_buf, threads), _raw_fromfile(raw), _nic_read(nic, store, hashes, rkv)
        s, lm, r, f, rc, ln = [], [], [], [], [], []
        for _ in trials_within(trials, budget_s):
            s.append(_store_read(store, hashes, rng, out))
            r.append(_raw_read(raw, raw_buf, threads))
            rc.append(_raw_read(raw, raw_buf, threads, layout.layer_bytes))
            lm.append(_store_read(store, hashes, rng, out, layer_major=True))
            ln.append(_nic_read(nic, store, hashes, rkv))
            f.append(_raw_fromfile(raw))
        cold, raw_cold, raw_cold_direct, nic_cold = [], [], [], []
        fd = os.open(raw, os.O_RDONLY)
        direct = set_direct(fd)  # the file system reads past the page cache
        os.close(fd)
        for _ in trials_within(trials, budget_s / 2):
            drop_page_cache([raw, store_dir])
            cold.append(_store_read(store, hashes, rng, out))
            drop_page_cache([raw, store_dir])
            raw_cold.append(_raw_read(raw, raw_buf, threads))
            if direct:
                drop_page_cache([raw, store_dir])
                raw_cold_direct.append(_raw_read(raw, raw_buf, threads, direct=True))
            drop_page_cache([raw, store_dir])
            nic_cold.append(_nic_read(nic, store, hashes, rkv))
        nic.close()
    nbytes = n * layout.block_bytes
    read_cold, raw_read_cold, nic_read_cold = (gbps(nbytes, statistics.median(w for w, _ in x))
                                               for x in (cold, raw_cold, nic_cold))
    raw_read_cold_direct = gbps(nbytes, statistics.median(w for w, _ in raw_cold_direct)) if raw_cold_direct else None
    read, raw_read, layer, layer_nic, fromfile = (gbps(nbytes, statistics.median(w for w, _ in x))
                                                  for x in (s, r, lm, ln, f))
    checked = gbps(nbytes, statistics.median(w for w, _ in rc))
    cpu, raw_cpu, layer_cpu, nic_cpu, checked_cpu = (statistics.median(c for _, c in x) for x in (s, r, lm, ln, rc))
    return {"block_bytes": layout.block_bytes, "blocks": n, "read_gbps": read, "raw_read_gbps": raw_read,
            "read_vs_raw": read / raw_read, "read_layer_major_gbps": layer, "read_layer_major_vs_raw": layer / raw_read,
            "read_layer_major_nic_gbps": layer_nic, "read_layer_major_nic_vs_raw": layer_nic / raw_read,
            "read_layer_major_nic_cpu_vs_raw": raw_cpu / nic_cpu,
            "read_cpu_vs_raw": raw_cpu / cpu, "read_layer_major_cpu_vs_raw": raw_cpu / layer_cpu,
            "raw_read_checked_gbps": checked, "raw_checked_vs_raw": checked / raw_read,
            "raw_checked_cpu_vs_raw": raw_cpu / checked_cpu, "read_vs_raw_checked": read / checked,
            "raw_fromfile_gbps": fromfile, "read_vs_raw_fromfile": read / fromfile,
            "read_cold_gbps": read_cold, "raw_read_cold_gbps": raw_read_cold,
            "read_cold_vs_raw": read_cold / raw_read_cold, "raw_read_cold_direct_gbps": raw_read_cold_direct,
            "read_cold_vs_raw_direct": read_cold / raw_read_cold_direct if raw_read_cold_direct else None,
            "read_layer_major_nic_cold_gbps": nic_read_cold,
            "read_layer_major_nic_cold_vs_raw": nic_read_cold / raw_read_cold,
            "read_trials": len(s), "read_cold_trials": len(cold)}


def write_figures(layout: kv.BlockLayout, n: int, workdir: str, trials: int, budget_s: float = math.inf) -> dict:
    """Interleaved trials (disk writes here swing several-fold between runs) at equal durability:
    store puts of 8 blocks (each block visible atomically) into a fresh directory against one raw
    file of the same bytes made visible by rename; neither fsyncs (`write_vs_raw`), or both do
    (`write_fsync_vs_raw`: the store fsyncs every segment file, the raw write its one file); medians.
    No new trial once `budget_s` has passed (after two)."""
    times: dict[str, list[float]] = {"write_gbps": [], "write_fsync_gbps": [], "raw_write_gbps": [],
                                     "raw_write_fsync_gbps": []}
    for t in trials_within(trials, budget_s):
        for key, sync in (("write_gbps", False), ("write_fsync_gbps", True)):
            path = os.path.join(workdir, f"write-{t}-{sync}")
            with kv.BlockStore(kv.local_spec(path), layout, sync=sync) as store:
                _, blocks, dt = _fill(store, n, seed=t)
            times[key].append(dt)
            shutil.rmtree(path)
        for key, sync in (("raw_write_gbps", False), ("raw_write_fsync_gbps", True)):
            raw = os.path.join(workdir, "raw-write.bin")
            times[key].append(_raw_write(raw, blocks, sync))
            os.remove(raw)
    out = {k: gbps(n * layout.block_bytes, statistics.median(w for w, _ in v)) for k, v in times.items()}
    cpu = {k: statistics.median(c for _, c in v) for k, v in times.items()}
    out["write_vs_raw"] = out["write_gbps"] / out["raw_write_gbps"]
    out["write_cpu_vs_raw"] = cpu["raw_write_gbps"] / cpu["write_gbps"]
    out["write_fsync_vs_raw"] = out["write_fsync_gbps"] / out["raw_write_fsync_gbps"]
    out["write_fsync_cpu_vs_raw"] = cpu["raw_write_fsync_gbps"] / cpu["write_fsync_gbps"]
    out["write_trials"] = len(times["write_gbps"])
    return out


def cap_figures(layout: kv.BlockLayout, n: int, workdir: str, cap_mbps: float) -> dict:
    """A read through a capped storage NIC, from the page cache (the read figures' store, left cold
    by their cold trials, read through it first), so the cap, not the disk, sets its pace."""
    store_dir = os.path.join(workdir, "read-" + layout.fingerprint()[:8])
    load_page_cache([store_dir])
    with kv.BlockStore(kv.local_spec(store_dir), layout) as store:
        hashes = store.hashes()[:n]
        nic = kv.StorageNIC("bench", cap_bytes_per_s=cap_mbps * 1e6)
        t0 = time.perf_counter()
        valid = nic.read(store, hashes).wait()
        dt = time.perf_counter() - t0
        nic.close()
    assert valid == len(hashes)
    return {"cap_target_mbps": cap_mbps, "cap_measured_mbps": (len(hashes) - 1) * layout.block_bytes / dt / 1e6,
            "cap_blocks": len(hashes)}


def _zarr3_spec(layout: kv.BlockLayout, path: str, checksum: bool, sharded: bool) -> dict:
    md = kv.segments.zarr_metadata(layout, 1)
    inner = [{"name": "bytes", "configuration": {"endian": "little"}}] + ([{"name": "crc32c"}] if checksum else [])
    if sharded:  # the block is a shard; its inner chunks are Layer Blocks, each with its own checksum
        inner = [{"name": "sharding_indexed", "configuration": {
            "chunk_shape": [1, 1, *layout.layer_shape], "codecs": inner,
            "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}]}}]
    md["codecs"] = inner
    return {"driver": "zarr3", "kvstore": {"driver": "file", "path": path}, "metadata": md}


def format_figures(layout: kv.BlockLayout, n: int, workdir: str, trials: int, budget_s: float = math.inf) -> dict:
    """Random-order read GB/s of the same blocks under other TensorStore formats (each: a warm-up
    read, then timed reads, none new once its share of `budget_s` has passed, at least one)."""
    blocks = np.random.default_rng(3).standard_normal((n, *layout.full_shape)).astype(layout.np_dtype)
    ctx = ts.Context({"file_io_sync": False})
    out, buf = {}, layout.empty(n)
    zarr3 = {"zarr3_no_checksum": (False, False), "zarr3_crc32c": (True, False),
             "zarr3_sharded_layer_chunks_crc32c": (True, True)}
    tag = os.path.join(workdir, f"fmt-{layout.fingerprint()[:8]}")
    kvstores = {"file_key_per_block": {"driver": "file", "path": tag + "-file/"},
                "ocdbt": {"driver": "ocdbt", "base": {"driver": "file", "path": tag + "-ocdbt/"}}}
    share = budget_s / (len(zarr3) + len(kvstores))
    for name, (checksum, sharded) in zarr3.items():
        path = f"{tag}-{name}/"
        arr = ts.open(_zarr3_spec(layout, path, checksum, sharded), create=True, context=ctx).result()
        for i in range(n):
            arr[i].write(blocks[i]).result()
        dst, times = ts.array(buf, copy=False), []
        for t in trials_within(trials + 1, share):
            t0 = time.perf_counter()
            for f in [dst[j].write(arr[int(i)]) for j, i in enumerate(np.random.default_rng(t).permutation(n))]:
                f.result()
            times.append(time.perf_counter() - t0)
        out[name] = gbps(blocks.nbytes, statistics.median(times[1:]))
    for name, spec in kvstores.items():
        store = ts.KvStore.open(spec, context=ctx).result()
        for f in [store.write(f"{i:08d}", blocks[i].tobytes()) for i in range(n)]:
            f.result()
        times = []
        for t in trials_within(trials + 1, share):
            order = np.random.default_rng(t).permutation(n)
            t0 = time.perf_counter()
            vals = [np.frombuffer(f.result().value, layout.np_dtype) for f in [store.read(f"{i:08d}") for i in order]]
            times.append(time.perf_counter() - t0)
        assert len(vals) == n
        out[name] = gbps(blocks.nbytes, statistics.median(times[1:]))
    return out


def backend_figures(layout: kv.BlockLayout, n: int, workdir: str, trials: int, budget_s: float = math.inf) -> dict:
    """The TensorStore back end (`io="tensorstore"`: TensorStore's kvstore and zarr3 driver do the
    I/O) against the POSIX back end on the same disk, interleaved: puts of 8 blocks into a fresh
    directory each, then a `get` of every block in random order, checked."""
    times: dict[str, list] = {io: [] for io in ("posix_write", "tensorstore_write", "posix_read", "tensorstore_read")}
    rng = np.random.default_rng(2)
    for t in trials_within(trials, budget_s):
        for io in ("posix", "tensorstore"):
            path = os.path.join(workdir, f"io-{t}-{io}")
            with kv.BlockStore(kv.local_spec(path), layout, io=io) as store:
                ids, _, dt = _fill(store, n, seed=t)
                times[f"{io}_write"].append(dt)
                hashes = [b.hash for b in ids]
                _store_read(store, hashes, rng, layout.empty(n))  # warm-up: the page cache and the entries
                times[f"{io}_read"].append(_store_read(store, hashes, rng, layout.empty(n)))
            shutil.rmtree(path)
    rate = {k: gbps(n * layout.block_bytes, statistics.median(w for w, _ in v)) for k, v in times.items()}
    return {"tensorstore_read_gbps": rate["tensorstore_read"], "tensorstore_write_gbps": rate["tensorstore_write"],
            "tensorstore_read_vs_posix": rate["tensorstore_read"] / rate["posix_read"],
            "tensorstore_write_vs_posix": rate["tensorstore_write"] / rate["posix_write"],
            "tensorstore_trials": len(times["posix_read"])}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dir", type=output_dir,
                   help="directory on the disk to measure (default: a temp dir under the cwd)")
    p.add_argument("--max-wall-s", type=number(low_ok=True), default=None,
                   help="wall-time bound: no new trial starts past it, each phase (reads, writes, back ends, "
                        "formats) taking its share of the time left, at least two trials each (default "
                        f"{MAX_WALL_S:g}, {QUICK_MAX_WALL_S:g} with --quick)")


def main(argv=None, args=None) -> dict:
    args = bench_args("kvstore", __doc__, add_arguments, argv, args)
    t_start = time.perf_counter()
    show_progress()
    small, big = layout_for(models.get_config("small")), layout_for(models.get_config("qwen2.5-32b"))
    n_small, n_big, trials, max_wall_s = (64, 4, 3, QUICK_MAX_WALL_S) if args.quick else (256, 16, 7, MAX_WALL_S)
    if args.max_wall_s is not None:
        max_wall_s = args.max_wall_s
    share = Shares(t_start + max_wall_s)
    with tempfile.TemporaryDirectory(dir=args.dir or os.getcwd(), prefix=".bench-kvstore-") as workdir:
        log.info("reads: %d x %d KiB blocks (small)", n_small, small.block_bytes // 1024)
        result = {"benchmark": "kvstore", "format": f"store format {kv.FORMAT_VERSION}: segment files (zarr3 shards "
                  "of up to S blocks, Layer Block chunks), one per put, ending in the segment's entry (XXH3-64 per "
                  "Layer Block, parent and tokens per block); index/<hash> a hard link to the segment file",
                  "io": "posix (the local back end: pwritev / preadv; TensorStore only opens the store)",
                  **read_figures(small, n_small, workdir, trials, share("reads"))}
        log.info("writes")
        result.update(write_figures(small, n_small, workdir, trials, share("writes")))
        log.info("capped reads")
        result.update(cap_figures(small, n_small, workdir, cap_mbps=100.0))
        log.info("reads: %d x %d MiB blocks (qwen2.5-32b)", n_big, big.block_bytes >> 20)
        result["qwen2.5-32b"] = read_figures(big, n_big, workdir, trials, share("reads qwen2.5-32b"))
        log.info("the TensorStore back end")
        result.update(backend_figures(small, n_small, workdir, trials, share("tensorstore")))
        log.info("alternative formats")
        result["other_formats_read_gbps"] = format_figures(small, n_small, workdir, trials, share("formats"))
        big_formats = format_figures(big, n_big, workdir, trials, share("formats qwen2.5-32b"))
        result["qwen2.5-32b"]["other_formats_read_gbps"] = big_formats
    result["notes"] = (
        "Same disk, same run, page cache warm (read_cold_* and read_layer_major_nic_cold_*: every file of both sides "
        "dropped from the page cache with posix_fadvise(DONTNEED) before each read, so both read the disk, against "
        "the same raw cold reads, buffered preadv; the store reads cold Full Blocks O_DIRECT, past the page cache, "
        "so read_cold_vs_raw_direct holds them against a raw O_DIRECT read of the same file, one preadv per thread; "
        "null where the file system has no O_DIRECT); medians of interleaved trials. "
        "Store reads: one get per request "
        "(read_*) or per layer (read_layer_major_*), or layer-major through an uncapped StorageNIC as a layerwise "
        "prefill reads (read_layer_major_nic_*: one RequestReads per request, one outcome per batch, not a "
        "BlockRead per block and layer; cold, the storage NIC reads such a request block by "
        "block, so read_layer_major_nic_cold_* is that read); preads of each segment's consecutive blocks on reader "
        "threads "
        "straight into a preallocated host buffer as the runtime's PE/DE buffers, checked as they land: every Layer "
        "Block's XXH3 checksum and every index entry (its XXH3 and the hash of parent and tokens) verified; "
        "raw: the same bytes from one file, preadv by as many threads as the store's readers into a reused buffer "
        "(raw_fromfile_gbps / read_vs_raw_fromfile: np.fromfile, which allocates a new buffer per read and so "
        "counts page faults against raw); raw_read_checked: the raw read in 1 MiB "
        "preadvs with XXH3 over each Layer Block as it lands (the checksum's own cost, no store), so "
        "raw_checked_vs_raw is what verification alone leaves of the raw read and read_vs_raw_checked what the "
        "store's own work leaves of that. "
        "Writes at equal durability: each store block and the raw file become "
        "visible atomically (rename; a block only once its segment file is complete); write_vs_raw with no fsync "
        "on either side, write_fsync_vs_raw with fsync on both (the store fsyncs every segment file, its index entry "
        "inside, before its blocks' index links appear; links are not fsynced: one lost to a power cut is a miss). "
        "tensorstore_*: the same store format read and written by the TensorStore back end (TensorStore's file "
        "kvstore and zarr3 driver; the runtime's default on any kvstore but a local directory) against the POSIX "
        "back end (pwritev / preadv), puts of 8 blocks and one get of them all, interleaved. "
        "other_formats_read_gbps: TensorStore formats read into the same buffer; zarr3 variants with one chunk per "
        "block; file/ocdbt values are plain reads to bytes, unchecked. The cap emulates one host's storage NIC; "
        "nothing else is emulated. *_cpu_vs_raw: the same ratios in CPU seconds of this process (all threads), "
        "which a loaded machine distorts far less than wall time. "
        f"Each phase runs up to {trials} trials, none new once its share of max_wall_s ({max_wall_s:g} s from the "
        "start; of the time left when it starts, by its weight: reads 1.5, the cold half included, the others 1; "
        "the other formats share theirs, at least one timed read each) has passed, at least two (*_trials: how "
        "many ran).")
    result["wall_s"] = time.perf_counter() - t_start
    emit(result, args.json)
    return result


if __name__ == "__main__":
    main()
