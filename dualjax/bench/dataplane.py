"""The data plane end to end, uncapped: hit-KV bytes per second each read path delivers into the
prefill computation, against a raw read of the same bytes from the same disk in the same run.

    dualjax bench dataplane --json FILE [--plot FILE] [--quick] [--embedded-only] [--max-wall-s S]

No storage-NIC cap and no model compute (the "computation" takes each layer as a device array and
does nothing else), so what is measured is the runtime's own data movement:
* PE path: store -> PE buffer (a `StorageNIC` read, layer-major, checksums verified) -> each layer,
  as soon as it is in (a view of the layer-major buffer), -> device (`jax.device_put`);
* DE path: store -> DE buffer -> relay of each layer's slice (as it lies in the buffer) over the
  transport -> PE receive buffer -> device.
Both paths run embedded (one process, in-process transport) and under `mpiexec -n 2` (rank 1 the
DE, rank 0 the PE, `MpiTransport` over MPICH shared memory), from the page cache; then embedded
again from the disk (`embedded_cold`), last, since a store block read cold stays cold. Every
stage is also timed alone on the same bytes (`stage_gbps`, `stage_s`, `cpu_s`; the device stages
`h2d` and `d2h` apart), and `stages` says per path where its time goes against the raw read: the
store's own shortfall (`store_over_raw_s`), what the data plane adds beyond the store read
(`dataplane_over_store_s`), the least time its stages allow on this machine (`bound_s`) and its
fill (`first_layer_s`). The embedded warm run also times the store read into buffers new to the
process (`store_read_fresh`, `store_fresh_vs_raw`): what a host pays per request without a
buffer pool, every page faulted in as the read lands. raw = the same bytes read from one file on
the same disk into a reused buffer by one process alone (page cache warm, as the store's files
are; cold in `embedded_cold`); raw_parallel (`*_vs_raw_parallel`) = the same read by as many
threads as the store reads with (`bench kvstore`'s yardstick, the stricter one).
Trials interleave every figure, so load from other jobs hits them alike; GB/s are medians over
trials, ratios medians of each trial's ratio. `--max-wall-s` bounds the benchmark's wall time: each
of the three runs (embedded, mpiexec, embedded cold) gets an equal share of the time left when it
starts and starts no new trial past it (after three: `MIN_TRIALS`, so a spent bound still gives
every figure), so a slow machine or disk bounds its own wall time; `trials` says how many ran.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import jax
import numpy as np

import kvstore as kv
import models
from dualjax.bench.common import (
    bench_args,
    drop_page_cache,
    emit,
    gbps,
    load_page_cache,
    machine,
    raw_parallel_read,
    timed,
    trials_within,
)
from dualjax.core.config import number
from dualjax.outputs import output_file
from dualjax.runtime.buffers import RequestKV, aligned_empty
from dualjax.runtime.messages import LayerKV
from dualjax.runtime.store import layout_for
from dualjax.runtime.transport.mpi import BUSY_POLL_S, IDLE_MAX_S

# Ratios are medians of each trial's ratio: of two that is their mean, so one stage stalled once (a VM's
# stolen time can make a relay stage of 11-16 ms take 65 ms) would decide `de_vs_bound`; of three, one
# stall cannot.
MIN_TRIALS = 3
MAX_WALL_S, QUICK_MAX_WALL_S = 120.0, 40.0  # --max-wall-s's defaults


def _trial(fn, *args) -> tuple:
    """(wall seconds, this process's CPU seconds, all threads) of `fn(*args)` (`common.timed`); and when
    `fn` returns the `perf_counter` time its first layer reached the computation, the seconds until then."""
    t = timed(fn, *args)
    return (t.wall_s, t.cpu_s, t.result - t.start) if isinstance(t.result, float) else (t.wall_s, t.cpu_s)


class Data:
    """The requests' hit blocks in a store on disk, and the same bytes as one raw file."""

    def __init__(self, workdir: str, requests: int, hit_tokens: int, create: bool):
        self.layout = layout_for(models.get_config("small"))
        self.T, self.L = self.layout.block_tokens, self.layout.n_layers
        self.nb, self.requests = hit_tokens // self.T, requests
        self.nbytes = requests * self.nb * self.layout.block_bytes
        self.store_dir = os.path.join(workdir, "store")
        self.store = kv.BlockStore(kv.local_spec(self.store_dir), self.layout)
        self.raw_path = os.path.join(workdir, "raw.bin")
        self.files = [self.raw_path, self.store_dir]  # what the cold run drops from the page cache, the warm ones load
        rng, token_rng = np.random.default_rng(0), np.random.default_rng(1)  # every rank derives the same ids
        self.hashes = []
        for r in range(requests):
            tokens = token_rng.integers(0, 1000, hit_tokens).astype(np.int32) + r * 1000
            ids = kv.block_chain(tokens, self.layout)
            if create:
                blocks = rng.standard_normal((self.nb, *self.layout.full_shape)).astype(self.layout.np_dtype)
                self.store.put(ids, blocks)
                with open(self.raw_path, "ab") as f:
                    blocks.tofile(f)
            self.hashes.append([b.hash for b in ids])
        self.raw_buf = aligned_empty(os.path.getsize(self.raw_path))

    def raw_read(self) -> None:
        with open(self.raw_path, "rb", buffering=0) as f:
            view, got = memoryview(self.raw_buf), 0
            while got < view.nbytes:
                got += f.readinto(view[got:])

    def raw_parallel_read(self) -> None:
        """The same bytes with as many threads as the store reads with (the stricter yardstick)."""
        raw_parallel_read(self.raw_path, self.raw_buf, kv.BlockStore.READER_THREADS)

    def buffers(self) -> list[RequestKV]:
        return [RequestKV(self.layout, self.nb * self.T) for _ in range(self.requests)]

    def read_all(self, nic: kv.StorageNIC, rkvs: list[RequestKV]) -> list:
        """Queue every request's read, layer-major, into its buffer; the tickets."""
        return [nic.read(self.store, h, out=rkv.blocks, layer_major=True) for h, rkv in zip(self.hashes, rkvs)]


class Device:
    """The stand-in for the prefill computation: takes each layer onto the device as it comes. A
    layer's transfer is dispatched at once and waited for only when the layer after next arrives,
    so it overlaps the read (or relay) of the next layer, as a layerwise prefill's would."""

    def __init__(self):
        self.inflight: collections.deque = collections.deque()
        self.first: float | None = None  # perf_counter() when the first layer came

    def take(self, host: np.ndarray) -> None:
        if self.first is None:
            self.first = time.perf_counter()
        self.inflight.append(jax.device_put(host))
        if len(self.inflight) > 2:
            self.inflight.popleft().block_until_ready()

    def finish(self) -> None:
        jax.block_until_ready(list(self.inflight))
        self.inflight.clear()


def pe_path(d: Data, nic: kv.StorageNIC, rkvs: list[RequestKV]) -> float:
    """Store -> PE buffer -> device, each layer as soon as it is in (reads queued per request);
    returns when the first layer came."""
    dev = Device()
    for ticket, rkv in zip(d.read_all(nic, rkvs), rkvs):
        for layer in range(d.L):
            assert ticket.wait_layer(layer) == d.nb, "a block read failed"
            dev.take(rkv.layer(layer, d.nb * d.T))
    dev.finish()
    return dev.first


def de_sender(d: Data, nic: kv.StorageNIC, rkvs: list[RequestKV], transport, pe: int) -> None:
    """The DE's side: read into the DE buffer, relay each layer's slice as soon as it is there."""
    for r, (ticket, rkv) in enumerate(zip(d.read_all(nic, rkvs), rkvs)):
        for layer in range(d.L):
            valid = ticket.wait_layer(layer)
            transport.send(pe, LayerKV(r, layer, 0, rkv.layer_view(layer, d.nb), valid))


def relay_sender(d: Data, rkvs: list[RequestKV], transport, pe: int) -> None:
    """The relay stage alone: every layer of the (already filled) buffers."""
    for r, rkv in enumerate(rkvs):
        for layer in range(d.L):
            transport.send(pe, LayerKV(r, layer, 0, rkv.layer_view(layer, d.nb), d.nb))


def receiver(d: Data, transport, device: bool = True) -> float | None:
    """The PE's side of the DE path: each relayed layer onto the device (`device`), in arrival order;
    returns when the first layer came (with `device`)."""
    dev = Device()
    for _ in range(d.requests * d.L):
        got = transport.recv(timeout=120)
        if got is None:
            raise TimeoutError("dataplane: no relayed layer for 120 s")
        msg = got[1]
        assert msg.valid == d.nb, "a block read failed"
        if device:
            dev.take(msg.kv.reshape(-1, *d.layout.record_shape))
    dev.finish()
    return dev.first


def _embedded_pair(fabric, sender, *args) -> float | None:
    """Rank 1 (`sender`, a thread) relays to rank 0 (this thread, the receiver); the receiver's result."""
    t = threading.Thread(target=sender, args=(*args, fabric.transport(1), 0), daemon=True)
    t.start()
    first = receiver(args[0], fabric.transport(0), device=sender is de_sender)
    t.join()
    return first


def store_read(d: Data, nic: kv.StorageNIC, rkvs: list[RequestKV]) -> None:
    for t in d.read_all(nic, rkvs):
        assert t.wait() == d.nb, "a block read failed"


def device_stages(d: Data, rkvs: list[RequestKV]) -> dict:
    """h2d and d2h alone, every layer (wall seconds, CPU seconds)."""
    layers = [rkv.layer(layer, d.nb * d.T) for rkv in rkvs for layer in range(d.L)]  # views: no gather stage
    h2d = _trial(lambda: [jax.device_put(x).block_until_ready() for x in layers])
    dev = [jax.device_put(np.array(x)) for x in layers]  # device-owned copies (not aliases of the host buffer)
    jax.block_until_ready(dev)
    d2h = _trial(lambda: [np.asarray(x) for x in dev])
    return {"h2d": h2d, "d2h": d2h}


PATH_STAGES = {"pe": ("store_read", "h2d"), "de": ("store_read", "relay", "h2d")}


def _bound(run: dict, path: str, cores: int) -> float:
    """An estimate of the least wall time `path` could take on this machine, from its stages timed
    alone in the same trial: its stages overlapped perfectly, so no less than its slowest stage,
    nor than all their CPU seconds spread over the `cores` the path's processes may use. (Not a
    strict floor: noise, or polling counted in a stage's CPU time, can let a path beat it.)"""
    stages = PATH_STAGES[path]
    return max(max(run[s][0] for s in stages), sum(run[s][1] for s in stages) / cores)


def _summary(d: Data, runs: list[dict], cores: dict[str, int]) -> dict:
    """Medians over trials of {stage or path: (wall s, CPU s)}; ratios, GB/s and the breakdown
    (`cores[path]`: how many cores the path's processes may use between them)."""
    wall = {k: statistics.median(r[k][0] for r in runs) for k in runs[0]}
    cpu = {k: statistics.median(r[k][1] for r in runs) for k in runs[0]}

    def ratio(base: str, path: str) -> float:  # paired within a trial (its figures ran back to back), then median
        return statistics.median(r[base][0] / r[path][0] for r in runs)

    res = {"bytes": d.nbytes, "trials": len(runs), "raw_read_gbps": gbps(d.nbytes, wall["raw"]),
           "raw_parallel_read_gbps": gbps(d.nbytes, wall["raw_parallel"]),
           "store_vs_raw": ratio("raw", "store_read"), "store_vs_raw_parallel": ratio("raw_parallel", "store_read")}
    if "store_read_fresh" in wall:
        res["store_fresh_vs_raw"] = ratio("raw", "store_read_fresh")
    bound_s = {}
    for name in ("pe", "de"):
        res[f"{name}_gbps"] = gbps(d.nbytes, wall[name])
        res[f"{name}_vs_raw"] = ratio("raw", name)
        res[f"{name}_vs_raw_parallel"] = ratio("raw_parallel", name)
        res[f"{name}_vs_store"] = ratio("store_read", name)
        bounds = [_bound(r, name, cores[name]) for r in runs]
        bound_s[name] = statistics.median(bounds)
        res[f"{name}_bound_vs_raw"] = statistics.median(r["raw"][0] / b for r, b in zip(runs, bounds))
        res[f"{name}_vs_bound"] = statistics.median(b / r[name][0] for r, b in zip(runs, bounds))
    res["stage_gbps"] = {k: gbps(d.nbytes, v) for k, v in wall.items()}
    res["stage_s"], res["cpu_s"] = wall, cpu
    device = {"h2d": res["stage_gbps"]["h2d"], "d2h": res["stage_gbps"]["d2h"]}
    res["stages"] = {
        name: {"store_read": res["stage_gbps"]["store_read"], **({"relay": res["stage_gbps"]["relay"]} if name == "de"
                                                                 else {}),
               "device": device, "path": res[f"{name}_gbps"],
               "raw_read_s": wall["raw"], "store_over_raw_s": wall["store_read"] - wall["raw"],
               "dataplane_over_store_s": wall[name] - wall["store_read"], "bound_s": bound_s[name],
               "first_layer_s": statistics.median(r[name][2] for r in runs)}
        for name in ("pe", "de")}
    return res


def measure_embedded(d: Data, trials: int, budget_s: float, cold: bool = False) -> dict:
    """Every figure in one process, from the page cache (every file read through it first: a store
    block read cold goes past it and would stay cold), or with `cold` from the disk (the store's
    and the raw file's pages dropped before each figure, untimed); no new trial once `budget_s`
    has passed (after `MIN_TRIALS`)."""
    from dualjax.runtime.transport import InProcFabric
    nic, pe_bufs, de_bufs, fabric = kv.StorageNIC("pe"), d.buffers(), d.buffers(), InProcFabric(2)
    run = {"raw": d.raw_read, "raw_parallel": d.raw_parallel_read, "store_read": lambda: store_read(d, nic, pe_bufs),
           "pe": lambda: pe_path(d, nic, pe_bufs), "de": lambda: _embedded_pair(fabric, de_sender, d, nic, de_bufs),
           "relay": lambda: _embedded_pair(fabric, relay_sender, d, de_bufs)}
    if not cold:  # the store read into memory new to the process, what a host without a buffer pool would read into
        run["store_read_fresh"] = lambda: store_read(d, nic, d.buffers())

    def trial(fn):
        if cold:
            drop_page_cache(d.files)
        return _trial(fn)
    if not cold:
        load_page_cache(d.files)
    for fn in run.values():  # warm-up: compiles, pools (and the page cache's metadata)
        fn()
    runs = []
    for _ in trials_within(trials, budget_s, MIN_TRIALS):  # interleaved: load from other jobs hits every figure alike
        runs.append({k: trial(fn) for k, fn in run.items()} | device_stages(d, pe_bufs))
    nic.close()
    cores = len(os.sched_getaffinity(0))
    return _summary(d, runs, {"pe": cores, "de": cores})


def _barrier(comm) -> None:
    """A barrier that sleeps while it waits (MPICH's blocking one spins a core the other rank needs),
    the longer the longer it waits, with the transport's idle back-off (20 us up to 5 ms between
    tests). A rank waiting out the other's single-rank stage took 55-58 ms of CPU a second testing
    every 0.5 ms, 6-8 ms so (measured), CPU taken from the stage timed on the other rank, from the
    store's two reader threads more than from the one-thread raw read."""
    req, pause = comm.Ibarrier(), BUSY_POLL_S
    while not req.Test():
        time.sleep(pause)
        pause = min(2 * pause, IDLE_MAX_S)


def under_mpi(out_path: str, workdir: str, requests: int, hit_tokens: int, trials: int, budget_s: float) -> None:
    """Rank 1 = DE (reads, relays), rank 0 = PE (receives, delivers). Single-rank stages (raw,
    store read, PE path, device) run on rank 0 while rank 1 waits; CPU seconds add both ranks. The
    PE path's bound counts rank 0's cores, the DE path's those of both ranks. Rank 0's clock
    decides whether another trial starts (`budget_s`), and both ranks follow it."""
    from dualjax.runtime.transport import MpiTransport, comm_world
    comm = comm_world()
    d = Data(workdir, requests, hit_tokens, create=False)
    nic, bufs = kv.StorageNIC(f"r{comm.rank}"), d.buffers()
    t = MpiTransport(comm)

    def both(sender, *args):
        return lambda: sender(*args, t, 0) if comm.rank == 1 else receiver(d, t, device=sender is de_sender)

    def alone(fn):
        return lambda: fn() if comm.rank == 0 else None

    run = {"raw": alone(d.raw_read), "raw_parallel": alone(d.raw_parallel_read),
           "store_read": alone(lambda: store_read(d, nic, bufs)),
           "pe": alone(lambda: pe_path(d, nic, bufs)), "de": both(de_sender, d, nic, bufs),
           "relay": both(relay_sender, d, bufs)}

    def trial(fn):
        _barrier(comm)
        got = _trial(fn)
        _barrier(comm)
        return got

    for fn in run.values():
        trial(fn)
    runs = []
    go = trials_within(trials, budget_s, MIN_TRIALS)
    while comm.bcast(next(go, None) is not None if comm.rank == 0 else None):
        got = {k: trial(fn) for k, fn in run.items()}
        got |= device_stages(d, bufs) if comm.rank == 0 else {}
        _barrier(comm)  # rank 1 sleeps here while rank 0 times the device stages (a bcast would spin a core)
        runs.append(got)
    _barrier(comm)
    t.close()
    nic.close()
    every, cpus = comm.gather(runs), comm.gather(os.sched_getaffinity(0))  # an mpiexec may bind each rank
    waited = comm.gather(MpiTransport.waits_inside_mpi)
    if comm.rank == 0:  # wall from rank 0 (both ranks are inside a barrier pair), CPU of both ranks
        for r0, r1 in zip(*every):
            for k, (_, cpu) in r1.items():
                r0[k] = (r0[k][0], r0[k][1] + cpu, *r0[k][2:])
        summary = _summary(d, every[0], {"pe": len(cpus[0]), "de": len(cpus[0] | cpus[1])})
        with open(out_path, "w") as f:
            json.dump(summary | {"waits_inside_mpi": any(waited), "waits_inside_mpi_ranks": waited}, f)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--embedded-only", action="store_true", help="skip the mpiexec run")
    p.add_argument("--plot", metavar="FILE", type=output_file,
                   help="also draw where each path's time goes (per run and path) to FILE (PNG)")
    p.add_argument("--max-wall-s", type=number(low_ok=True), default=None,
                   help="wall-time bound: no new trial starts past it, each run (embedded, mpiexec, embedded cold) "
                        "taking an equal share of the time left, at least three trials each (default "
                        f"{MAX_WALL_S:g}, {QUICK_MAX_WALL_S:g} with --quick)")
    p.add_argument("--under-mpi", nargs=2, metavar=("OUT", "DIR"), help=argparse.SUPPRESS)


def main(argv=None, args=None) -> dict:
    args = bench_args("dataplane", __doc__, add_arguments, argv, args)
    requests, hit_tokens, trials, max_wall_s = (2, 4096, 5, QUICK_MAX_WALL_S) if args.quick else \
        (4, 8192, 9, MAX_WALL_S)
    if args.max_wall_s is not None:
        max_wall_s = args.max_wall_s
    if args.under_mpi:  # its share, from the run that started it
        under_mpi(*args.under_mpi, requests, hit_tokens, trials, max_wall_s)
        return {}
    t_start = time.perf_counter()
    runs_left = [2 if args.embedded_only else 3]

    def share() -> float:
        """The next run's share of the wall time left: an equal part of it among the runs still to run."""
        runs_left[0] -= 1
        return max(0.0, t_start + max_wall_s - time.perf_counter()) / (runs_left[0] + 1)
    with tempfile.TemporaryDirectory(dir=os.getcwd(), prefix=".bench-dataplane-") as workdir:
        d = Data(workdir, requests, hit_tokens, create=True)
        with d.store:  # closed however the run ends
            result = {"benchmark": "dataplane", "machine": machine(), "layout": d.layout.describe(),
                      "requests": requests, "hit_tokens_per_request": hit_tokens}
            result["embedded"] = measure_embedded(d, trials, share())
            if not args.embedded_only:
                from dualjax.runtime.cluster.runner import mpiexec
                load_page_cache(d.files)  # the page cache is the machine's: both ranks read warm
                out = os.path.join(workdir, "mpi.json")
                cmd = [mpiexec(), "-n", "2", sys.executable, "-m", "mpi4py", "-m", "dualjax.bench.dataplane",
                       "--under-mpi", out, workdir, "--max-wall-s", repr(share())] + (["--quick"] if args.quick else [])
                subprocess.run(cmd, check=True, timeout=900)
                result["mpi"] = json.load(open(out))
            result["embedded_cold"] = measure_embedded(d, trials, share(), cold=True)  # last: the store stays cold
    top = result.get("mpi", result["embedded"])
    result["max_wall_s"] = max_wall_s
    result.update({k: top[k] for k in ("pe_vs_raw", "de_vs_raw", "raw_read_gbps", "store_vs_raw", "pe_vs_store",
                                       "de_vs_store", "pe_bound_vs_raw", "de_bound_vs_raw", "pe_vs_bound",
                                       "de_vs_bound", "pe_vs_raw_parallel", "de_vs_raw_parallel",
                                       "raw_parallel_read_gbps", "stages")}, wall_s=time.perf_counter() - t_start)
    result["notes"] = (
        "Uncapped; no model compute. Top-level figures from the mpiexec run (one process per host, as deployed) "
        "when it ran, else embedded. *_vs_raw = raw read seconds (one thread) / path seconds for the same bytes; "
        "*_vs_raw_parallel: against the raw read by as many threads as the store reads with; *_vs_store = "
        "store read seconds / path seconds (the data plane's own efficiency: a path cannot beat the store read it "
        "starts with); each the median over trials of the ratio within a trial (figures run back to back). "
        "stage_gbps/stage_s: each stage alone on the same bytes; "
        "cpu_s: CPU seconds of every thread (both ranks under mpiexec). stages[path]: where the path's time goes "
        "against the raw read; bound_s: an estimate of the least time the path could take here, its stages (each "
        "timed alone in the same trial) overlapped perfectly: no less than its slowest stage, nor than their CPU "
        "seconds over the cores its processes may use (noise, or polling counted in a stage's CPU, can let a path "
        "beat it a little); first_layer_s: from the start until the path's first layer reached the computation "
        "(a pipeline's fill: the rest of the path streams behind it); *_bound_vs_raw = raw / bound (about the "
        "most this machine allows the path), *_vs_bound = bound / path (how much of that the path reaches). "
        "store_read_fresh (embedded only): the store read into buffers allocated for it, as a host without a "
        "buffer pool would (page faults included); every other figure reads into buffers reused across trials. "
        "embedded and mpi read from the page cache (every file read through it before each run). "
        "embedded_cold: the embedded run again, last, with every file of the store and the raw file dropped from "
        "the page cache (posix_fadvise DONTNEED, untimed) before each figure, so both paths and both raw reads come "
        "from the disk: the storage-bound regime DualPath is for (the store reads such blocks O_DIRECT, block by "
        "block, past the page cache, so they stay cold; the raw reads stay buffered). Each run interleaves its "
        "trials and starts no new one once its share of max_wall_s (an equal part of the time left when it starts) "
        "has passed (at least three): trials says how many ran. "
        "CPU backend: page-aligned host buffers are aliased by jax.device_put (h2d free) and "
        "np.asarray of a device array is a view (d2h free); on an accelerator both are DMA copies.")
    if args.plot:
        from dualjax.plots import plot_dataplane
        plot_dataplane(args.plot, result)
    emit(result, args.json)
    return result


if __name__ == "__main__":
    main()
