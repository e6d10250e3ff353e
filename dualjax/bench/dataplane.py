"""The data plane end to end, uncapped: hit-KV bytes per second each read path delivers into the
prefill computation, against a raw read of the same bytes from the same disk in the same run.

    dualjax bench dataplane --json FILE [--quick] [--embedded-only]

No storage-NIC cap and no model compute (the "computation" takes each layer as a device array and
does nothing else), so what is measured is the runtime's own data movement:
* PE path: store -> PE buffer (a `StorageNIC` read, layer-major, checksums verified) -> each layer,
  as soon as it is in (a view of the layer-major buffer), -> device (`jax.device_put`);
* DE path: store -> DE buffer -> relay of each layer's slice (as it lies in the buffer) over the
  transport -> PE receive buffer -> device.
Both paths run embedded (one process, in-process transport) and under `mpiexec -n 2` (rank 1 the
DE, rank 0 the PE, `MpiTransport` over MPICH shared memory). Every stage is also timed alone on the
same bytes (`stages`, GB/s and seconds per request set; the device stages `h2d` and `d2h` apart) so
the shortfall of a path can be attributed. raw = the same bytes read from one file on the same disk
into a reused buffer (page cache warm, as the store's files are).
"""

from __future__ import annotations

import argparse
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
from dualjax.bench.common import emit, machine, parser
from dualjax.runtime.buffers import RequestKV
from dualjax.runtime.messages import LayerKV
from dualjax.runtime.store import layout_for


def _gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9


class Data:
    """The requests' hit blocks in a store on disk, and the same bytes as one raw file."""

    def __init__(self, workdir: str, requests: int, hit_tokens: int, create: bool):
        self.layout = layout_for(models.get_config("small"))
        self.T, self.L = self.layout.block_tokens, self.layout.n_layers
        self.nb, self.requests = hit_tokens // self.T, requests
        self.nbytes = requests * self.nb * self.layout.block_bytes
        self.store = kv.BlockStore(kv.local_spec(os.path.join(workdir, "store")), self.layout)
        self.raw_path = os.path.join(workdir, "raw.bin")
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
        self.raw_buf = np.empty(os.path.getsize(self.raw_path), np.uint8)

    def raw_read(self) -> float:
        t0 = time.perf_counter()
        with open(self.raw_path, "rb", buffering=0) as f:
            view, got = memoryview(self.raw_buf), 0
            while got < view.nbytes:
                got += f.readinto(view[got:])
        return time.perf_counter() - t0

    def buffers(self) -> list[RequestKV]:
        return [RequestKV(self.layout, self.nb * self.T) for _ in range(self.requests)]


def _deliver(dev: list, host: np.ndarray) -> None:
    """Hand one layer to the computation: onto the device; the previous layer must have arrived."""
    if dev:
        dev.pop().block_until_ready()
    dev.append(jax.device_put(host))


def pe_path(d: Data, nic: kv.StorageNIC, rkvs: list[RequestKV]) -> float:
    """Store -> PE buffer -> device, layer by layer as each arrives (reads queued per request)."""
    t0 = time.perf_counter()
    tickets = [nic.read(d.store, hashes, out=rkv.blocks, layer_major=True) for hashes, rkv in zip(d.hashes, rkvs)]
    dev: list = []
    for ticket, rkv in zip(tickets, rkvs):
        for layer in range(d.L):
            assert ticket.wait_layer(layer) == d.nb, "a block read failed"
            _deliver(dev, rkv.layer(layer, d.nb * d.T))
    dev.pop().block_until_ready()
    return time.perf_counter() - t0


def de_sender(d: Data, nic: kv.StorageNIC, rkvs: list[RequestKV], transport, pe: int) -> None:
    """The DE's side: read into the DE buffer, relay each layer's slice as soon as it is there."""
    tickets = [nic.read(d.store, hashes, out=rkv.blocks, layer_major=True) for hashes, rkv in zip(d.hashes, rkvs)]
    for r, (ticket, rkv) in enumerate(zip(tickets, rkvs)):
        for layer in range(d.L):
            valid = ticket.wait_layer(layer)
            transport.send(pe, LayerKV(r, layer, 0, rkv.layer_view(layer, d.nb), valid))


def de_receiver(d: Data, transport) -> None:
    """The PE's side of the DE path: each relayed layer onto the device, in arrival order."""
    dev: list = []
    for _ in range(d.requests * d.L):
        got = transport.recv(timeout=120)
        if got is None:
            raise TimeoutError("dataplane: no relayed layer for 120 s")
        msg = got[1]
        assert msg.valid == d.nb, "a block read failed"
        _deliver(dev, msg.kv.reshape(-1, *d.layout.record_shape))
    dev.pop().block_until_ready()


def de_path_embedded(d: Data, nic: kv.StorageNIC, rkvs: list[RequestKV]) -> float:
    from dualjax.runtime.transport import InProcFabric
    fabric = InProcFabric(2)
    t0 = time.perf_counter()
    sender = threading.Thread(target=de_sender, args=(d, nic, rkvs, fabric.transport(1), 0), daemon=True)
    sender.start()
    de_receiver(d, fabric.transport(0))
    sender.join()
    return time.perf_counter() - t0


def stages(d: Data, nic: kv.StorageNIC, rkvs: list[RequestKV]) -> dict:
    """Each stage alone on the same bytes (seconds for all requests)."""
    out = {}
    t0 = time.perf_counter()
    for t in [nic.read(d.store, h, out=rkv.blocks, layer_major=True) for h, rkv in zip(d.hashes, rkvs)]:
        assert t.wait() == d.nb
    out["store_read"] = time.perf_counter() - t0
    layers = [rkv.layer(layer, d.nb * d.T) for rkv in rkvs for layer in range(d.L)]  # views: no gather stage
    t0 = time.perf_counter()
    for host in layers:
        jax.device_put(host).block_until_ready()
    out["h2d"] = time.perf_counter() - t0
    dev = [jax.device_put(host) for host in layers]
    jax.block_until_ready(dev)
    t0 = time.perf_counter()
    for x in dev:
        np.asarray(x)
    out["d2h"] = time.perf_counter() - t0
    return out


def _summary(d: Data, raw: list, paths: dict, stage_runs: list[dict]) -> dict:
    raw_s = statistics.median(raw)
    res = {"bytes": d.nbytes, "raw_read_gbps": _gbps(d.nbytes, raw_s)}
    for name, times in paths.items():
        res[f"{name}_gbps"] = _gbps(d.nbytes, statistics.median(times))
        res[f"{name}_vs_raw"] = raw_s / statistics.median(times)
    med = {k: statistics.median(s[k] for s in stage_runs) for k in stage_runs[0]}
    res["stage_gbps"] = {k: _gbps(d.nbytes, v) for k, v in med.items()}
    res["stage_s"] = med
    return res


def measure_embedded(d: Data, trials: int) -> dict:
    nic, pe_bufs, de_bufs = kv.StorageNIC("pe"), d.buffers(), d.buffers()
    d.raw_read(), pe_path(d, nic, pe_bufs), de_path_embedded(d, nic, de_bufs)  # warm-up: page cache, compiles
    raw, paths, runs = [], {"pe": [], "de": []}, []
    for _ in range(trials):  # interleaved, so load from other jobs hits every figure alike
        raw.append(d.raw_read())
        paths["pe"].append(pe_path(d, nic, pe_bufs))
        paths["de"].append(de_path_embedded(d, nic, de_bufs))
        runs.append(stages(d, nic, pe_bufs))
    nic.close()
    res = _summary(d, raw, paths, runs)
    res["stages"] = _path_stages(res, relay_gbps=None)
    return res


def _path_stages(res: dict, relay_gbps: float | None) -> dict:
    """Per path, the stages it chains (GB/s of each alone); device stages listed apart."""
    g = res["stage_gbps"]
    pe = {"store_read": g["store_read"], "device": {"h2d": g["h2d"], "d2h": g["d2h"]}}
    de = {"store_read": g["store_read"], "relay": relay_gbps if relay_gbps else "in-process copy (see de_gbps)",
          "device": {"h2d": g["h2d"], "d2h": g["d2h"]}}
    return {"pe": pe, "de": de}


def _barrier(comm) -> None:
    """A barrier that sleeps while it waits (MPICH's blocking one spins a core the other rank needs)."""
    req = comm.Ibarrier()
    while not req.Test():
        time.sleep(0.0005)


def under_mpi(out_path: str, workdir: str, requests: int, hit_tokens: int, trials: int) -> None:
    """Rank 1 = DE (reads, relays), rank 0 = PE (receives, delivers; also runs the PE path)."""
    from mpi4py import MPI

    from dualjax.runtime.transport import MpiTransport
    comm = MPI.COMM_WORLD
    d = Data(workdir, requests, hit_tokens, create=False)
    nic, bufs = kv.StorageNIC(f"r{comm.rank}"), d.buffers()
    t = MpiTransport(comm)

    def de_once() -> float:
        _barrier(comm)
        t0 = time.perf_counter()
        if comm.rank == 1:
            de_sender(d, nic, bufs, t, 0)
        else:
            de_receiver(d, t)
        _barrier(comm)
        return time.perf_counter() - t0

    def relay_only() -> float:  # the relay stage alone: buffers already filled, no device
        _barrier(comm)
        t0 = time.perf_counter()
        if comm.rank == 1:
            for r, rkv in enumerate(bufs):
                for layer in range(d.L):
                    t.send(0, LayerKV(r, layer, 0, rkv.layer_view(layer, d.nb), d.nb))
        else:
            for _ in range(d.requests * d.L):
                t.recv(timeout=120)
        _barrier(comm)
        return time.perf_counter() - t0

    de_once(), relay_only()
    raw, paths, runs, relay = [], {"pe": [], "de": []}, [], []
    for _ in range(trials):
        raw.append(d.raw_read())
        paths["de"].append(de_once())
        relay.append(relay_only())
        _barrier(comm)
        if comm.rank == 0:
            paths["pe"].append(pe_path(d, nic, bufs))
            runs.append(stages(d, nic, bufs))
        _barrier(comm)
    t.close()
    nic.close()
    if comm.rank == 0:
        res = _summary(d, raw, paths, runs)
        res["stage_gbps"]["relay"] = _gbps(d.nbytes, statistics.median(relay))
        res["stage_s"]["relay"] = statistics.median(relay)
        res["stages"] = _path_stages(res, relay_gbps=res["stage_gbps"]["relay"])
        with open(out_path, "w") as f:
            json.dump(res, f)


def main(argv=None) -> dict:
    p = parser(__doc__)
    p.add_argument("--embedded-only", action="store_true", help="skip the mpiexec run")
    p.add_argument("--under-mpi", nargs=2, metavar=("OUT", "DIR"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    requests, hit_tokens, trials = (2, 4096, 3) if args.quick else (4, 8192, 5)
    if args.under_mpi:
        under_mpi(*args.under_mpi, requests, hit_tokens, trials)
        return {}
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=os.getcwd(), prefix=".bench-dataplane-") as workdir:
        d = Data(workdir, requests, hit_tokens, create=True)
        result = {"benchmark": "dataplane", "machine": machine(), "layout": d.layout.describe(),
                  "requests": requests, "hit_tokens_per_request": hit_tokens}
        result["embedded"] = measure_embedded(d, trials)
        d.store.close()
        if not args.embedded_only:
            from dualjax.runtime.launch import mpiexec
            out = os.path.join(workdir, "mpi.json")
            cmd = [mpiexec(), "-n", "2", sys.executable, "-m", "mpi4py", "-m", "dualjax.bench.dataplane",
                   "--under-mpi", out, workdir] + (["--quick"] if args.quick else [])
            subprocess.run(cmd, check=True, timeout=900)
            result["mpi"] = json.load(open(out))
    top = result.get("mpi", result["embedded"])
    result.update(pe_vs_raw=top["pe_vs_raw"], de_vs_raw=top["de_vs_raw"], raw_read_gbps=top["raw_read_gbps"],
                  stages=top["stages"], wall_s=time.perf_counter() - t_start)
    result["notes"] = (
        "Uncapped; no model compute. Top-level figures from the mpiexec run (one process per host, as deployed) "
        "when it ran, else embedded. *_vs_raw = raw read seconds / path seconds for the same bytes, medians of "
        "interleaved trials. stages: GB/s of each stage alone on the same bytes; a path chains them (pipelined "
        "layer by layer), so it cannot beat its slowest stage. CPU backend: h2d/d2h are host memory copies.")
    emit(result, args.json)
    return result


if __name__ == "__main__":
    main()
