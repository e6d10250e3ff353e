"""DE->PE relay over MPI: layer-block throughput through `MpiTransport` versus a plain mpi4py
`Send` of the same bytes in the same run, and the p99 latency of control messages while a relay
saturates the link, with the priority lanes and with one FIFO lane.

    python -m dualjax.bench.relay --json FILE [--quick] [--hostfile FILE]   (starts mpiexec -n 2 itself)

Rank 1 plays the DE (sender), rank 0 the PE (receiver). Both ranks share this machine, so the
"link" is MPICH's shared-memory transport; nothing is emulated. With `--hostfile`, rank 0 runs on
its first host and rank 1 on its second, and the link is the network between them (two namespaced
hosts: `python -m dualjax.cli.hosts 2 -- dualjax bench relay --hostfile {hostfile}`; the strided
relay then packs, as a host's transport does for another host); `hosts` and `shared_memory` say
where the ranks ran and whether MPI gave them shared memory. The receive memory outlives the
runs (one raw receive buffer, one transport pool), as a host's does for its whole life: memory
allocated per run of ~25 ms was measured faulting in, 2-16 ms per 8 MiB on a VM (inside the MPI
call that holds the progress thread and every control message behind it), for both the raw
`Send` and the relay. `relay_vs_raw_fresh_pool` is the relay into a fresh pool per run.
The relay's pool keeps a few buffers in rotation, and a `Send` can slow when its bytes land in more
buffers (out of cache); `relay_vs_raw_same_buffers` holds the relay against a `Send` into as many.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

from dualjax.bench.common import bench_args, emit
from dualjax.core.config import ConfigError, number


@dataclasses.dataclass(frozen=True)
class Ping:
    t_sent: float  # time.monotonic() of the sender (system-wide on Linux)


@dataclasses.dataclass(frozen=True)
class Stop:
    bulk = True  # ends the KV stream: must not overtake it


LATENCY_S = 0.3  # each control-latency run relays about this long (a few hundred pings)
LATENCY_ROUNDS = 3  # latency runs per lane, the lanes alternating; the p99s pool every round's pings


def _layer_blocks(n_layers: int, tokens: int):
    """Layer slices of a `small`-model request: [tokens, 2, K=8, H=32] float32 each."""
    return [np.full((tokens, 2, 8, 32), layer, np.float32) for layer in range(n_layers)]


def _full_block_layers(n_layers: int, tokens: int, block_tokens: int = 64):
    """The same bytes as the DE relays them: layer l of a request's Full Blocks [n, L, T, 2, K, H],
    a strided view [n, T, 2, K, H] of its buffer (sent without a gather copy)."""
    blocks = np.empty((tokens // block_tokens, n_layers, block_tokens, 2, 8, 32), np.float32)
    for layer in range(n_layers):
        blocks[:, layer] = layer
    return [blocks[:, layer] for layer in range(n_layers)]


def _raw(comm, layers, repeats: int, into: list[np.ndarray]) -> float:
    """Plain `Send`/`Recv` of each layer, one message each, received into the buffers `into` in
    turn (one: at its best, the buffer stays in cache)."""
    from mpi4py import MPI
    comm.Barrier()
    t0 = time.perf_counter()
    for r in range(repeats):
        for i, kv in enumerate(layers):
            if comm.rank == 1:
                comm.Send([kv, MPI.BYTE], dest=0, tag=5)
            else:
                comm.Recv([into[(r * len(layers) + i) % len(into)], MPI.BYTE], source=1, tag=5)
    comm.Barrier()
    return time.perf_counter() - t0


def _relay(comm, layers, repeats: int, priority: bool, ping_every: float | None, chunk: int, pool=None,
           pack_to=frozenset()):
    """Send the layers through MpiTransport, receiving into `pool` (None: a fresh one); returns
    (seconds, control latencies in ms at rank 0). `pack_to`: the transport's (the other rank, on
    another host)."""
    from dualjax.runtime.messages import LayerKV
    from dualjax.runtime.transport import MpiTransport
    t = MpiTransport(comm, priority=priority, chunk_bytes=chunk, pool=pool, pack_to=pack_to)
    comm.Barrier()
    t0, lat = time.perf_counter(), []
    if comm.rank == 1:
        done, pings = threading.Event(), None
        if ping_every:
            def pinger():
                while not done.is_set():
                    t.send(0, Ping(time.monotonic()))
                    time.sleep(ping_every)
            pings = threading.Thread(target=pinger, daemon=True)
            pings.start()
        for r in range(repeats):
            for i, kv in enumerate(layers):
                t.wait_backlog(2)  # a relay sends layers as they become ready, not all at once
                t.send(0, LayerKV(r, i, 0, kv))
        done.set()
        if pings is not None:
            pings.join()  # no ping after Stop: the next run's receiver would take it
        t.send(0, Stop())
    else:
        got = 0
        while True:
            _, msg = t.recv(timeout=60)
            if isinstance(msg, Ping):
                lat.append(1e3 * (time.monotonic() - msg.t_sent))
            elif isinstance(msg, Stop):
                break
            else:
                got += msg.kv.nbytes
                assert msg.kv.reshape(-1)[-1] == msg.layer  # the bytes really arrived (strided or not)
        assert got == repeats * sum(kv.nbytes for kv in layers)
    elapsed = time.perf_counter() - t0
    t.close()
    comm.Barrier()
    return elapsed, lat


def under_mpi(out_path: str, quick: bool, chunk: int) -> None:
    from dualjax.runtime.buffers import BufferPool
    from dualjax.runtime.transport import MpiTransport, comm_world
    from dualjax.runtime.transport.receiver import DEFAULT_WINDOW
    comm = comm_world()
    from mpi4py import MPI  # initialized by comm_world, with its settings
    shared = comm.Split_type(MPI.COMM_TYPE_SHARED).Get_size() > 1
    pack_to = frozenset() if shared else frozenset({1 - comm.rank})  # on two hosts: as a host's transport
    tokens = 2048 if quick else 4096
    layers, strided = _layer_blocks(4, tokens), _full_block_layers(4, tokens)
    repeats = 3 if quick else 8
    nbytes = repeats * sum(kv.nbytes for kv in layers)
    # the receive memory outlives the runs, as a host's does: the raw buffers, one transport pool
    pool = BufferPool()
    for kvs in (layers, strided):  # warm-up: the pool grows to the buffers the relay keeps in rotation
        _relay(comm, kvs, repeats, True, None, chunk, pool, pack_to)
    # raw into one buffer, and into as many as the pool holds, in turn: where the relay's bytes land
    into = [np.ones_like(layers[0]) for _ in range(comm.bcast(pool.misses, root=0))]
    _raw(comm, layers, 1, into)
    runs: dict[str, list[float]] = collections.defaultdict(list)
    for _ in range(5):  # interleaved, so load from other jobs on the machine hits both alike
        runs["raw"].append(_raw(comm, layers, repeats, into[:1]))
        runs["raw_same_buffers"].append(_raw(comm, layers, repeats, into))
        runs["relay"].append(_relay(comm, layers, repeats, True, None, chunk, pool)[0])
        runs["strided"].append(_relay(comm, strided, repeats, True, None, chunk, pool, pack_to)[0])
        runs["fresh"].append(_relay(comm, layers, repeats, True, None, chunk)[0])
    raw_s, same_s, relay_s, strided_s, fresh_s = (min(runs[k]) for k in
                                                  ("raw", "raw_same_buffers", "relay", "strided", "fresh"))
    # a p99 needs a few hundred samples: each latency run relays for about LATENCY_S, pinging every ms
    lat_repeats = comm.bcast(max(1, math.ceil(LATENCY_S / relay_s * repeats)), root=0)
    # the lanes alternate, so a stall of the machine (a woken thread waiting a scheduler slice for a
    # core, ~5 ms: five pings in a row) falls on either alike rather than deciding one run's p99
    rounds: dict[bool, list[list[float]]] = {True: [], False: []}
    for _ in range(LATENCY_ROUNDS):
        for priority in (True, False):
            rounds[priority].append(_relay(comm, layers, lat_repeats, priority, 0.001, chunk, pool)[1])
    lat_prio, lat_fifo = ([x for r in rounds[p] for x in r] for p in (True, False))
    waited = comm.gather(MpiTransport.waits_inside_mpi)
    hosts = comm.gather(socket.gethostname())
    if comm.rank == 0:
        link = ("MPICH shared memory" if shared else "the network") + f", ranks on {', '.join(dict.fromkeys(hosts))}"
        result = {
            "benchmark": "relay", "hosts": hosts, "shared_memory": shared, "bytes": nbytes,
            "layer_bytes": layers[0].nbytes,
            "raw_gbps": nbytes / raw_s / 1e9, "relay_gbps": nbytes / relay_s / 1e9,
            "relay_vs_raw": raw_s / relay_s,
            "raw_same_buffers_gbps": nbytes / same_s / 1e9, "relay_vs_raw_same_buffers": same_s / relay_s,
            "raw_same_buffers": len(into),
            "relay_strided_gbps": nbytes / strided_s / 1e9, "relay_strided_vs_raw": raw_s / strided_s,
            "relay_fresh_pool_gbps": nbytes / fresh_s / 1e9, "relay_vs_raw_fresh_pool": raw_s / fresh_s,
            "pool_buffers": pool.misses, "pool_reuses": pool.hits,
            "control_p99_ms_priority": float(np.percentile(lat_prio, 99)),
            "control_p99_ms_fifo": float(np.percentile(lat_fifo, 99)),
            "control_p50_ms_priority": float(np.percentile(lat_prio, 50)),
            "control_p50_ms_fifo": float(np.percentile(lat_fifo, 50)),
            "control_p99_ms_priority_rounds": [float(np.percentile(r, 99)) for r in rounds[True]],
            "control_p99_ms_fifo_rounds": [float(np.percentile(r, 99)) for r in rounds[False]],
            "control_messages": [len(lat_prio), len(lat_fifo)], "chunk_bytes": chunk, "window": DEFAULT_WINDOW,
            "waits_inside_mpi": any(waited), "waits_inside_mpi_ranks": waited,
            "notes": f"2 MPI ranks ({link}); raw = comm.Send/Recv of each layer into one "
                     "reused buffer; raw_same_buffers_gbps = the same into as many buffers as the relay's pool held "
                     "after a warm-up (raw_same_buffers), in turn, as the relay's pieces land "
                     "(relay_vs_raw_same_buffers: the transport's own cost, without that of landing in memory the "
                     "receiver keeps); relay = LayerKV through MpiTransport (pieces of chunk_bytes, at most window in "
                     "flight), each run's transport receiving into one pool kept across the runs, as a host's "
                     "transport keeps its pool (pool_buffers: how many it allocated, pool_reuses: layers received "
                     "into one it had; relay_vs_raw_fresh_pool: a fresh pool per run, memory new to the "
                     "process); relay_strided = the same bytes as layer slices of Full Blocks (the DE's form, sent "
                     "with an MPI datatype on one host, gathered into one buffer first between hosts); best of 5, "
                     "interleaved. Control: a ping every 1 ms while the relay "
                     f"keeps 2 layers queued (the sender blocks in wait_backlog), for about {LATENCY_S} s per run, "
                     f"{LATENCY_ROUNDS} runs per lane alternating the lanes; control_p*_ms_* pool every run's pings "
                     "(control_messages: pings received per lane), control_p99_ms_*_rounds give each run's own p99; "
                     "FIFO = one lane in submission order.",
        }
        with open(out_path, "w") as f:
            json.dump(result, f)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--chunk-kib", type=number(kind=int), default=None, help="KV chunk size (default: the transport's)")
    p.add_argument("--hostfile", metavar="FILE", help="run across hosts: a file of one HOST[:N] per line, or 'slurm' "
                   "for SLURM_JOB_NODELIST; rank 0 (the PE) runs on its first host, rank 1 (the DE) on its second")
    p.add_argument("--under-mpi", metavar="OUT", help=argparse.SUPPRESS)


def main(argv=None, args=None) -> dict:
    args = bench_args("relay", __doc__, add_arguments, argv, args)
    if args.under_mpi:
        from dualjax.runtime.transport.sender import DEFAULT_CHUNK_BYTES
        under_mpi(args.under_mpi, args.quick, args.chunk_kib * 1024 if args.chunk_kib else DEFAULT_CHUNK_BYTES)
        return {}
    from dualjax.runtime.cluster.runner import mpiexec
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "relay.json")
        hosts = []
        if args.hostfile:
            from dualjax.runtime.cluster.placement import read_nodes
            nodes, source = read_nodes(args.hostfile)
            if len(nodes) < 2:
                raise ConfigError(f"{source} lists {len(nodes)} host; the relay needs two")
            hosts = ["-hosts", f"{nodes[0].name}:1,{nodes[1].name}:1"]
        cmd = [mpiexec(), *hosts, "-n", "2", sys.executable, "-m", "mpi4py", "-m", "dualjax.bench.relay", "--under-mpi",
               out]
        extra = (["--quick"] if args.quick else []) + (["--chunk-kib", str(args.chunk_kib)] if args.chunk_kib else [])
        subprocess.run(cmd + extra, check=True)
        result = json.load(open(out))
    emit(result, args.json)
    return result


if __name__ == "__main__":
    main()
