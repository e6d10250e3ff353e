"""MPI entry point: every rank runs this under `mpirun -n 1+P+D python -m mpi4py -m launch.main ...`.

Takes the same flags as `dualjax run`. Rank 0 drives the workload and writes the outputs; the
other ranks serve as prefill or decode hosts. Running through `python -m mpi4py` makes an
uncaught exception on any rank abort the whole job instead of hanging it.
"""

from __future__ import annotations

import argparse
import sys

from dualjax.cli import add_run_flags, config_from_args, summary_line


def main(argv: list[str] | None = None) -> int:
    from mpi4py import MPI

    from dualjax.runtime import run_rank
    from dualjax.transport import MpiTransport

    parser = argparse.ArgumentParser(prog="launch.main", description=__doc__)
    add_run_flags(parser)
    parser.add_argument("--embedded", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    cfg = config_from_args(args)
    comm = MPI.COMM_WORLD
    if comm.Get_size() != cfg.cluster.size:
        raise SystemExit(f"cluster {cfg.cluster.name} needs {cfg.cluster.size} ranks, mpirun started {comm.Get_size()}")
    transport = MpiTransport(comm)
    report = run_rank(transport, cfg, progress=comm.Get_rank() == 0 and not args.quiet)
    transport.close()
    comm.Barrier()
    if report is not None and not args.quiet:
        print(summary_line(report), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
