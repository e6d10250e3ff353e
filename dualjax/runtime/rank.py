"""One MPI rank of a run: `mpiexec -n 1+P+D python -m mpi4py -m dualjax.runtime.rank FLAGS`.

Takes the flags of `dualjax run` (derived from `RunConfig`). Rank 0 drives the workload and writes
the outputs; the other ranks serve as prefill or decode hosts. Running through `python -m mpi4py`
makes an uncaught exception on any rank abort the whole job instead of hanging it.
`launch.main` is the same entry point under the name users give their own `mpirun`.
"""

from __future__ import annotations

import argparse
import sys

from dualjax.core.config import RunConfig, add_flags, from_args, use_compile_cache


def parser(prog: str = "dualjax.runtime.rank") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_flags(p, RunConfig)
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def main(argv: list[str] | None = None, prog: str = "dualjax.runtime.rank") -> int:
    use_compile_cache()  # before JAX loads: a rank loads what another run (or rank) compiled
    from dualjax.outputs import unwritable_dir
    from dualjax.runtime.launch import run_rank, summary_line
    from dualjax.runtime.transport import MpiTransport, comm_world

    args = parser(prog).parse_args(argv)
    cfg = from_args(RunConfig, args)
    comm = comm_world()
    if comm.Get_size() != cfg.cluster.size:
        raise SystemExit(f"cluster {cfg.cluster.name} needs {cfg.cluster.size} ranks, mpirun started {comm.Get_size()}")
    if why := unwritable_dir(cfg.out):  # rank 0 writes the outputs at the end; every host opens the store in it
        raise SystemExit(f"--out: {why}")
    transport = MpiTransport(comm)
    report = run_rank(transport, cfg, progress=comm.Get_rank() == 0 and not args.quiet)
    transport.close()
    comm.Barrier()
    if report is not None and not args.quiet:
        print(summary_line(report), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
