"""Run under mpiexec -n 2 by test_transport: lane order of the MPI transport, with the priority lanes
and with one FIFO lane (`priority=False`, the relay benchmark's baseline)."""

import numpy as np
from mpi4py import MPI

from dualjax.runtime.messages import LayerKV, PrefillDone, Ready
from dualjax.runtime.transport import MpiTransport

for priority in (True, False):
    t = MpiTransport(MPI.COMM_WORLD, priority=priority, chunk_bytes=64 << 10)
    if t.rank == 0:
        t.send(1, LayerKV(7, 0, 0, np.arange(4_000_000, dtype=np.float32).reshape(-1, 2, 2, 16)))
        t.send(1, PrefillDone(7, 0, 1, {}))  # bulk lane: must arrive after the KV
        t.send(1, Ready(7))  # control lane: overtakes the KV (FIFO: sent after it)
        t.send(1, Ready(8))
    else:
        order = [type(t.recv(timeout=30)[1]).__name__ for _ in range(4)]
        print(",".join(order), flush=True)
    t.close()
    MPI.COMM_WORLD.Barrier()
