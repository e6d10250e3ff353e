"""MPI entry point for your own mpirun: `mpirun -n 1+P+D python -m mpi4py -m launch.main FLAGS`.

Takes the flags of `dualjax run` (`--policy pkg.module:ClassName` included: the module must be
importable on every rank). The same entry point as `dualjax.runtime.rank`, which `dualjax run`
starts under mpiexec itself.
"""

from __future__ import annotations

import sys

from dualjax.runtime.rank import main as rank_main


def main(argv: list[str] | None = None) -> int:
    return rank_main(argv, prog="launch.main")


if __name__ == "__main__":
    sys.exit(main())
