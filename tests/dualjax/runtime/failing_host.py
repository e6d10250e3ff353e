"""A test double for a host whose code fails: `failing(handle)` wraps a host class's `handle` so
that it raises on the first request the host is assigned. Run as a script under mpiexec
(`test_runtime`), this is `dualjax.runtime.cluster.rank` with the prefill host failing:
`mpiexec -n 3 python -m mpi4py tests/dualjax/runtime/failing_host.py --cluster 1p1d ...`."""

import sys

from dualjax.runtime.messages import Assign


def failing(handle):
    """`handle`, raising `RuntimeError("injected failure on rank R")` on an `Assign` instead."""
    def wrapped(self, src, msg):
        if isinstance(msg, Assign):
            raise RuntimeError(f"injected failure on rank {self.rank}")
        return handle(self, src, msg)
    return wrapped


if __name__ == "__main__":
    from dualjax.runtime.cluster import rank
    from dualjax.runtime.prefill_host import PrefillHost
    PrefillHost.handle = failing(PrefillHost.handle)
    sys.exit(rank.main())
