"""Start-up of an MPI run across hosts, before any work: placement, devices, and three checks.

Every rank runs `join` collectively, in this order:

1. **Placement.** Each rank says its hostname; rank 0 plans the placement (`--hostfile`, or the
   launched ranks' hosts in order of their first rank) and matches every rank to its seat
   (`dualjax.runtime.cluster.placement`). The run's communicator is then renumbered in placement order.
2. **Devices.** Each rank sets its device environment (`dualjax.runtime.cluster.devices`) before JAX starts.
3. **Same software and model.** Each rank reports its dualjax version, the fingerprint of its model
   and KV layout (a checkpoint's digest included: a host whose copy of the weights differs is
   caught here) and its settings; all must equal rank 0's.
4. **The same store.** Rank 0 writes a probe block, named by a random nonce, into the store; every
   other host opens the store and reads it back; rank 0 then drops it. Only the store's public
   put / get / invalidate are used, so this holds for any kvstore the store opens (a directory or
   a URL), and a host that reaches another store (a local directory of the same name, a mount
   missing) or none (a network store it cannot reach) is caught here, not later as a silent zero
   hit rate. A `memory://` store, which separate processes cannot share, is refused before.

A check that fails ends every rank with the same one line, printed by rank 0, naming the host and
what differs (`Refused`; the CLI's exit code 2), before any host loads weights or compiles.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import socket

import numpy as np

from dualjax.core.config import ConfigError, RunConfig, to_argv
from dualjax.outputs import OutputError, unwritable_dir
from dualjax.runtime.cluster.devices import use_devices
from dualjax.runtime.cluster.placement import Node, Placement, PlacementError, read_nodes

REFUSED = 2  # exit code of a run refused at start-up


class Refused(Exception):
    """The run cannot start: the message is one line naming the host and what is wrong."""


def _bad_input() -> tuple[type[Exception], ...]:
    """Errors a host reports as a refusal (bad input on that host), not as a crash."""
    from kvstore import StoreError
    from models.checkpoint import CheckpointError
    from models.config import ModelConfigError
    return ConfigError, OutputError, StoreError, CheckpointError, ModelConfigError, OSError


def hostname() -> str:
    return socket.gethostname()


def dualjax_version() -> str:
    try:
        return importlib.metadata.version("dualjax")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def _agree(comm, problem: str | None) -> None:
    """Collective: every rank raises Refused with the first problem in rank order, or none does."""
    first = next((p for p in comm.allgather(problem) if p), None)
    if first:
        raise Refused(first)


def plan(cfg: RunConfig, hostnames: list[str], environ=None) -> Placement:
    """The run's placement: from `cfg.hostfile`, else the hosts the ranks were launched on (in order of
    their first rank, each with as many slots as it runs ranks)."""
    if cfg.hostfile:
        nodes, source = read_nodes(cfg.hostfile, environ)
        return Placement.plan(cfg.cluster, nodes, source)
    counts = {h: hostnames.count(h) for h in hostnames}  # dicts keep first-seen order
    return Placement.plan(cfg.cluster, [Node(h, n) for h, n in counts.items()], "the launched ranks' hosts")


def place(world, cfg: RunConfig) -> tuple[Placement, int]:
    """Collective over `world`: (the placement, this rank's seat). Raises Refused on every rank."""
    names = world.allgather(hostname())
    placement = order = problem = None
    if world.Get_rank() == 0:
        try:
            placement = plan(cfg, names)
            order = placement.assign(names)
        except PlacementError as e:
            problem = str(e)
    placement, order, problem = world.bcast((placement, order, problem), root=0)
    if problem:
        raise Refused(problem)
    return placement, order[world.Get_rank()]


def _where(seat) -> str:
    return f"host {seat.host} (rank {seat.rank}, {seat.role})"


def identity(cfg: RunConfig) -> dict:
    """What must be equal on every host: software, model and layout, settings."""
    from dualjax.runtime.store import run_layout, run_model
    return {"dualjax": dualjax_version(), "fingerprint": run_layout(cfg).fingerprint(),
            "model": run_model(cfg).describe, "settings": to_argv(cfg)}


def differs(seat, mine: dict, seat0, theirs: dict) -> str | None:
    """One line saying how `mine` (host `seat`) differs from rank 0's `theirs`, or None."""
    if mine["dualjax"] != theirs["dualjax"]:
        return f"{_where(seat)} runs dualjax {mine['dualjax']}, rank 0 on {seat0.host} runs {theirs['dualjax']}"
    if mine["fingerprint"] != theirs["fingerprint"]:
        return (f"{_where(seat)} has model fingerprint {mine['fingerprint']} (model {mine['model']}); rank 0 on "
                f"{seat0.host} has {theirs['fingerprint']} (model {theirs['model']})")
    if mine["settings"] != theirs["settings"]:
        return f"{_where(seat)} runs with {' '.join(mine['settings'])!r}, rank 0 with {' '.join(theirs['settings'])!r}"
    return None


def check_identity(comm, cfg: RunConfig, placement: Placement) -> None:
    """Collective: every host's dualjax, model fingerprint and settings equal rank 0's."""
    seat = placement.seats[comm.Get_rank()]
    try:
        mine, problem = identity(cfg), None
    except _bad_input() as e:
        mine, problem = None, f"{_where(seat)}: {e}"
    _agree(comm, problem)
    theirs = comm.bcast(mine, root=0)
    _agree(comm, differs(seat, mine, placement.seats[0], theirs))


def _probe_block(layout, nonce: bytes):
    """(block id, Full Block) of a probe: tokens and bytes drawn from `nonce`, so no prompt names it."""
    from dualjax.runtime.store import random_ids
    block = np.zeros((1, *layout.full_shape), layout.np_dtype)
    raw = block.view(np.uint8).reshape(-1)
    raw[:len(nonce)] = np.frombuffer(nonce, np.uint8)
    return random_ids(layout, 1, nonce)[0], block


def _cannot(where, e: Exception) -> str:
    """Why this host cannot open the store `where`, naming it once."""
    return str(e) if where.name in str(e) else f"cannot open the store {where.name}: {e}"


def _read_probe(cfg: RunConfig, where, block_id, block) -> tuple[object, str | None]:
    """(the store, None) if this host opens it and reads the probe back, else (store or None, why not).
    A host that finds no store there says so without making one."""
    from dualjax.runtime.store import open_store
    from kvstore import MANIFEST, store_exists
    store = None
    try:
        if not store_exists(where):
            return None, f"has no store at {where.name} (no {MANIFEST})"
        store = open_store(cfg)
        got = store.get([block_id.hash])[0].result()
    except _bad_input() as e:
        return store, _cannot(where, e)
    if got is None or not np.array_equal(got.view(np.uint8), block[0].view(np.uint8)):
        return store, f"does not see the store at {where.name}: the probe rank 0 wrote there is not in it"
    return store, None


def check_store(comm, cfg: RunConfig, placement: Placement) -> None:
    """Collective: rank 0 writes a probe block into the store, then every other host reads it back.
    A bad `--store`, or one that processes cannot share (`memory://`), is refused first, alike on
    every rank."""
    from dualjax.runtime.store import open_store, run_location
    rank, seat = comm.Get_rank(), placement.seats[comm.Get_rank()]
    store = block_id = block = problem = None
    try:
        where = run_location(cfg, processes=True)
    except _bad_input() as e:
        raise Refused(str(e)) from None
    if rank == 0:
        try:
            store = open_store(cfg)
            block_id, block = _probe_block(store.layout, os.urandom(16))
            store.put([block_id], block)
        except _bad_input() as e:
            problem = f"{_where(seat)} {_cannot(where, e)}"
    _agree(comm, problem)
    block_id, block = comm.bcast((block_id, block), root=0)
    try:
        if rank != 0:
            store, why = _read_probe(cfg, where, block_id, block)
            shared = "a directory that every host shares" if where.io == "posix" else "a store that every host reaches"
            problem = why and f"{_where(seat)} {why}; rank 0 runs on {placement.seats[0].host}: give --store {shared}"
        _agree(comm, problem)
    finally:
        if rank == 0:
            store.invalidate(block_id.hash)
        if store is not None:
            store.close()


def report_devices(comm, placement: Placement) -> list[dict]:
    """Every rank's host, role and JAX devices (rank order), and which ranks MPI gives shared memory
    with it: ranks on different hosts must not share it (MPI sees them as different nodes)."""
    import jax
    from mpi4py import MPI
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    peers = node.allgather(comm.Get_rank())
    node.Free()
    seat, devices = placement.seats[comm.Get_rank()], jax.local_devices()
    mine = dataclasses.asdict(seat) | {"platform": devices[0].platform, "devices": len(devices),
                                       "shared_memory_with": sorted(peers)}
    return comm.allgather(mine)


def join(world, cfg: RunConfig) -> tuple[object, Placement, list[dict]]:
    """Collective over `world` (MPI not yet renumbered, JAX not yet imported): rank 0 makes `--out`
    (only it writes outputs); place the ranks, give
    each its devices, renumber them in placement order, check software, model and store. Returns
    (the run's communicator, the placement, every rank's devices). Raises Refused on every rank."""
    why = unwritable_dir(cfg.out) if world.Get_rank() == 0 else None
    _agree(world, why and f"--out: {why}")
    placement, rank = place(world, cfg)
    use_devices(placement.seats[rank])
    comm = world.Split(0, rank)
    check_identity(comm, cfg, placement)
    if cfg.use_store:
        check_store(comm, cfg, placement)
    return comm, placement, report_devices(comm, placement)
