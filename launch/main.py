"""MPI entry point for your own launcher: `mpirun -n 1+P+D python -m mpi4py -m launch.main FLAGS`,
or `srun --mpi=pmi2 ... python -m mpi4py -m launch.main FLAGS` inside a SLURM allocation.

Takes the flags of `dualjax run` (`--policy pkg.module:ClassName` included: the module must be
importable on every rank). Roles follow the hosts, not your launcher's rank order: with
`--hostfile FILE` (or `--hostfile slurm`, the allocation's nodes) the PEs run on the first nodes
listed, the DEs on the next, the scheduler on the first; without it, on the hosts the ranks run on,
in the order of their first rank (docs/cluster.md). The same entry point as
`dualjax.runtime.cluster.rank`, which `dualjax run` starts under mpiexec itself.
"""

from __future__ import annotations

import sys

from dualjax.runtime.cluster.rank import main as rank_main


def main(argv: list[str] | None = None) -> int:
    return rank_main(argv, prog="launch.main")


if __name__ == "__main__":
    sys.exit(main())
