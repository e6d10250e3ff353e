"""`dualjax sim sweep`: a grid of simulations on every local core, or across MPI ranks; resumable.

    dualjax sim sweep --policies A,B [--regimes NAME,...|all] [--workloads W,...] [--clusters PpDd,...]
                      [--snic-mbps R,...] [--hardware H,...] [--seeds 0,1] [--agents N] [--turns N]
                      [--out DIR] [--plot FILE] [--json FILE] [--jobs N] [--hostfile FILE] [--quiet]

Every combination of the lists is one point (docs/sweep.md): `OUT/<point-id>/` holds its requests.parquet,
report.json and plots as `dualjax sim --out` writes them, and point.json; OUT/summary.parquet one row per
point (JCT, TTFT p50/p99, storage-NIC max/avg, recomputed tokens, hit rate, wall, and the policy's JCT
relative to the best of its regime). A regime (`--regimes`) fixes the hardware, model, cluster and storage
rate: compute-starved, balanced, storage-starved (`dualjax/sim/sweep.py` says how each is made). A point
whose directory exists is skipped and its row read back, so a sweep stopped midway resumes where it was.

Points run in `--jobs` processes (default: every core this process may use). Started under `mpiexec` (or
`srun`), the ranks split the points and each runs its share on its host's cores (`--jobs` default: the
cores over the ranks on that host); `--hostfile FILE` (one HOST[:N] per line, or `slurm`) starts that
itself, N ranks per host, through the same mpiexec as `dualjax run`. OUT must then be on a file system
every host shares.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from dualjax.core.config import SimConfig, add_flags, from_args, number, to_argv
from dualjax.outputs import output_dir, output_file, write_json
from dualjax.sim.sweep import REGIMES, SweepError

AXES = ("cluster", "workload", "hardware", "policy", "snic_mbps", "workload_seed")  # SimConfig fields that are lists
# the list flags: (dest, flag, the name `grid` gives it in its errors)
LISTS = (("policies", "--policies", "policies"), ("regimes", "--regimes", "regimes"),
         ("workloads", "--workloads", "workloads"), ("clusters", "--clusters", "clusters"),
         ("snic_list", "--snic-mbps", "snic_mbps"), ("hardware_list", "--hardware", "hardware"),
         ("seeds", "--seeds", "seeds"))


def add_arguments(p: argparse.ArgumentParser) -> None:
    regimes = "; ".join(f"{r.name}: {r.how}" for r in REGIMES.values())
    p.add_argument("--policies", required=True, metavar="P,...",
                   help="policies to compare, comma-separated: built-in names or pkg.module:ClassName, each with "
                   "its arguments if any (NAME:arg=value,arg=value)")
    p.add_argument("--regimes", metavar="R,...", help=f"named settings (all: every one): {regimes}. A regime "
                   "sets hardware, model, cluster and storage rate: not with --clusters, --snic-mbps, --hardware, "
                   "--model")
    p.add_argument("--workloads", metavar="W,...", help="workloads (default: a regime's hit-rate workloads, else "
                   "paper-64k)")
    p.add_argument("--clusters", metavar="PpDd,...", help="clusters (default 2p4d)")
    p.add_argument("--snic-mbps", dest="snic_list", metavar="R,...",
                   help="storage read rates per node, MB/s; `profile`: the hardware profile's (default)")
    p.add_argument("--hardware", dest="hardware_list", metavar="H,...",
                   help="hardware profiles (default paper-h800)")
    p.add_argument("--seeds", default="0", metavar="S,...", help="workload seeds (default 0)")
    add_flags(p, SimConfig, skip=AXES)
    p.add_argument("--out", metavar="DIR", default="runs/sweep", type=output_dir,
                   help="one directory per point and summary.parquet (default runs/sweep)")
    p.add_argument("--plot", metavar="FILE", type=output_file,
                   help="draw the best policy per regime and each policy's JCT relative to it to FILE (PNG)")
    p.add_argument("--json", metavar="FILE", type=output_file, help="write the summary rows and regimes as JSON")
    p.add_argument("--jobs", type=number(kind=int), metavar="N",
                   help="processes on this host (default: its cores; under MPI, its cores over its ranks)")
    p.add_argument("--hostfile", metavar="FILE", help="run across hosts under mpiexec: one HOST[:N] per line "
                   "(N ranks there), or `slurm` for the allocation's nodes")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def _items(flag: str, text: str | None) -> list[str] | None:
    if text is None:
        return None
    items = [t.strip() for t in text.split(",")]
    if not all(items):
        raise SweepError(f"{flag}: an empty name in {text!r}")
    return items


def _policies(text: str) -> list[str]:
    """`--policies`: comma-separated, where a policy's own arguments (`NAME:arg=value,arg=value`) keep
    their commas: a piece `arg=value` belongs to the policy before it."""
    out: list[str] = []
    for piece in _items("--policies", text):
        key = piece.partition("=")[0]
        if "=" in piece and ":" not in piece and key.strip().isidentifier() and out:
            out[-1] += "," + piece
        else:
            out.append(piece)
    return out


def _rates(text: str | None) -> list[float | None] | None:
    items = _items("--snic-mbps", text)
    if items is None:
        return None
    try:
        rates = [None if t == "profile" else float(t) for t in items]
    except ValueError:
        raise SweepError(f"--snic-mbps: expected MB/s numbers or `profile`, got {text!r}") from None
    bad = [r for r in rates if r is not None and not r > 0]
    if bad:
        raise SweepError(f"--snic-mbps: {bad[0]:g} is not a rate > 0 (MB/s per node)")
    return rates


def _seeds(text: str) -> list[int]:
    items = _items("--seeds", text)
    if not all(t.isdigit() for t in items):
        raise SweepError(f"--seeds: expected integers >= 0, got {text!r}")
    return [int(t) for t in items]


def points_of(args):
    """The grid the flags give, checked: a bad one raises before anything runs."""
    from dualjax.sim.sweep import check, grid
    base = from_args(SimConfig, args)
    regimes = _items("--regimes", args.regimes)
    if regimes is not None and base.model != SimConfig.model:
        raise SweepError("--model: a regime sets its own (docs/sweep.md); give regimes or these, not both")
    try:
        points = grid(_policies(args.policies), workloads=_items("--workloads", args.workloads),
                      clusters=_items("--clusters", args.clusters), snic_mbps=_rates(args.snic_list),
                      seeds=_seeds(args.seeds), hardware=_items("--hardware", args.hardware_list), regimes=regimes,
                      base=base)
    except SweepError as e:  # the library names its arguments (`policies: ...`); the command, its flags
        head, sep, rest = str(e).partition(": ")
        flags = {name: flag for _, flag, name in LISTS} | {"model": "--model"}
        names = head.split(", ")
        if sep and all(n in flags for n in names):
            raise SweepError(", ".join(flags[n] for n in names) + sep + rest) from None
        raise
    check(points)
    return points


def _mpi_size(environ=None) -> int:
    """Ranks of the MPI job this process was started in (MPICH/Hydra, Open MPI, SLURM's PMI), 1 if none."""
    environ = os.environ if environ is None else environ
    for key in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "PMIX_SIZE"):
        if environ.get(key, "").isdigit():
            return int(environ[key])
    return 1


def main(argv=None, args=None) -> int:
    """Run alone (`argv`) or from the `dualjax` parser (`args`)."""
    p = argparse.ArgumentParser(prog="dualjax sim sweep", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    args = args if args is not None else p.parse_args(argv)
    if _mpi_size() > 1:
        if args.hostfile:
            raise SweepError("--hostfile: this sweep already runs under mpiexec (its ranks are the hosts')")
        return _mpi_main(args)
    points = points_of(args)
    if args.hostfile:
        return _launch(args)
    from dualjax.sim.sweep import longest_first, run_tasks
    outcome = run_tasks(longest_first(points), args.out, args.jobs, progress=not args.quiet)
    return _finish(args, points, outcome)


def _finish(args, points, outcome) -> int:
    from dualjax.sim.sweep import default_jobs, finish, text_table
    result = finish(points, outcome, args.out, args.plot, log=lambda s: print(s, file=sys.stderr))
    print(text_table(result["rows"]))
    print(f"sweep: {len(points)} points ({result['ran']} run, {result['resumed']} read back, "
          f"{len(result['failed'])} failed) in {result['wall_s']:.1f} s on {args.jobs or default_jobs()} "
          f"process(es) -> {result['summary']}" + (f", {args.plot}" if args.plot else ""))
    if args.json:
        write_json(args.json, {k: result[k] for k in ("rows", "regimes", "ran", "resumed", "failed", "wall_s")})
    return 1 if result["failed"] else 0


def _launch(args) -> int:
    """`--hostfile`: the same sweep under mpiexec, N ranks on each listed host (HOST:N), through the launcher
    `dualjax run` uses; its ranks split the points (`_mpi_main`)."""
    from dualjax.runtime.cluster.placement import read_nodes
    from dualjax.runtime.cluster.runner import mpiexec
    nodes, _ = read_nodes(args.hostfile)
    argv = ["sim", "sweep", "--out", os.path.abspath(args.out)]
    for dest, flag, _ in LISTS:
        if (v := getattr(args, dest)) is not None:
            argv += [flag, v]
    for flag in ("plot", "json"):
        if (v := getattr(args, flag)) is not None:
            argv += [f"--{flag}", os.path.abspath(v)]
    argv += (["--jobs", str(args.jobs)] if args.jobs else []) + (["--quiet"] if args.quiet else [])
    argv += to_argv(from_args(SimConfig, args))
    cmd = [mpiexec(), "-hosts", ",".join(f"{n.name}:{n.slots}" for n in nodes), "-n",
           str(sum(n.slots for n in nodes)), sys.executable, "-m", "mpi4py", "-m", "dualjax.cli.main", *argv]
    return subprocess.run(cmd).returncode


def _mpi_main(args) -> int:
    """One rank of a sweep under MPI: every rank builds the same grid; rank 0 says which points are left,
    each rank runs its share (`share`: costliest first, balanced by cost) on its host's cores, and rank 0
    gathers the rows and writes the summary. Bad input: one line from rank 0, exit code 2 on every rank."""
    from dualjax.cli.errors import user_errors
    from dualjax.runtime.transport import comm_world
    from dualjax.sim.sweep import Outcome, default_jobs, run_tasks, share
    comm = comm_world()
    rank, size = comm.Get_rank(), comm.Get_size()
    try:
        points = points_of(args)
        error = None
    except user_errors() as e:
        points, error = None, e
    if any(comm.allgather(error is not None)):
        comm.Barrier()
        from mpi4py import MPI
        MPI.Finalize()
        if rank == 0 and error is not None:
            raise error
        return 2
    jobs = args.jobs or max(1, default_jobs() // _local_ranks(comm))
    pending = comm.bcast([i for i, pt in enumerate(points) if not pt.done(args.out)] if rank == 0 else None, root=0)
    mine = share([points[i] for i in pending], rank, size)
    outcome = run_tasks(mine, args.out, jobs, progress=rank == 0 and not args.quiet,
                        desc=f"rank 0 of {size}: its points")
    parts = comm.gather((outcome.results, outcome.ran, outcome.failed, outcome.wall_s), root=0)
    code = 0
    if rank == 0:
        total = Outcome()
        for results, ran, failed, wall in parts:
            total.results |= results
            total.ran += ran
            total.failed |= failed
            total.wall_s = max(total.wall_s, wall)
        todo = set(pending)
        for i, pt in enumerate(points):
            if i not in todo:
                total.results[pt.id] = pt.read(args.out)
                total.resumed.append(pt.id)
        args.jobs = args.jobs or jobs
        print(f"sweep under MPI: {size} ranks, {jobs} process(es) per rank on rank 0's host", file=sys.stderr)
        code = _finish(args, points, total)
    return comm.bcast(code, root=0)


def _local_ranks(comm) -> int:
    """Ranks of `comm` on this host (they share its cores)."""
    from mpi4py import MPI
    return comm.Split_type(MPI.COMM_TYPE_SHARED).Get_size()
