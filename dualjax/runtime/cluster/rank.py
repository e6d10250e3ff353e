"""One MPI rank of a run: `mpiexec -n 1+P+D python -m mpi4py -m dualjax.runtime.cluster.rank FLAGS`.

Takes the flags of `dualjax run` (derived from `RunConfig`). The ranks first place themselves
(`dualjax.runtime.cluster.preflight.join`: each rank's role follows its host, from `--hostfile` or the hosts
the launcher used, never the launcher's rank order), take their devices and check that every host
runs the same software and model and sees the same store; a refusal is one line from rank 0 and
exit code 2 on every rank. Then rank 0 drives the workload, writes the outputs and prints the
run's summary line on stdout (`--quiet` drops only the progress: the placement line and the bar,
on stderr); the other ranks serve as prefill or decode hosts. Running through `python -m mpi4py`
makes an uncaught exception on any rank abort the whole job instead of hanging it.
`launch.main` is the same entry point under the name users give their own `mpirun` or `srun`.
"""

from __future__ import annotations

import argparse
import sys

from dualjax.core.config import RunConfig, add_flags, from_args, use_compile_cache


def parser(prog: str = "dualjax.runtime.cluster.rank") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_flags(p, RunConfig)
    p.add_argument("--quiet", action="store_true", help="no progress (the placement line and the bar); the "
                   "summary line is printed as without it")
    return p


def refuse(message: str, rank: int) -> int:
    """Every rank: end MPI cleanly (no abort, so no launcher noise); rank 0 prints the one line."""
    from mpi4py import MPI
    if rank == 0:
        print(f"dualjax: error: {message}", file=sys.stderr, flush=True)
    MPI.COMM_WORLD.Barrier()
    MPI.Finalize()
    return 2


def main(argv: list[str] | None = None, prog: str = "dualjax.runtime.cluster.rank") -> int:
    use_compile_cache()  # before JAX loads: a rank loads what another run (or rank) compiled
    from dualjax.core.policies import PolicyError
    from dualjax.runtime.cluster.preflight import REFUSED, Refused, join
    from dualjax.runtime.transport import MpiTransport, comm_world

    args = parser(prog).parse_args(argv)
    cfg = from_args(RunConfig, args)
    world = comm_world()
    try:
        comm, placement, devices = join(world, cfg)
    except Refused as e:
        return refuse(str(e), world.Get_rank())
    from dualjax.runtime.cluster.runner import describe_placement, run_rank, summary_line
    progress = comm.Get_rank() == 0 and not args.quiet
    if progress:
        print(describe_placement(placement, devices), file=sys.stderr, flush=True)
    shared = devices[comm.Get_rank()]["shared_memory_with"]  # the ranks on this host
    transport = MpiTransport(comm, pack_to=frozenset(range(comm.Get_size())) - set(shared))
    try:
        report = run_rank(transport, cfg, progress=progress, placement={**placement.report(), "ranks": devices})
    except PolicyError as e:  # rank 0: the policy author's mistake, its traceback kept in failed-rank0.txt
        print(f"dualjax: error: {e}", file=sys.stderr, flush=True)
        comm.Abort(REFUSED)  # every rank ends; `dualjax run` prints no more for REFUSED
    transport.close()
    comm.Barrier()
    if report is not None:  # the run's result, on stdout as `dualjax run --embedded` prints it; --quiet or not
        print(summary_line(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
