"""Run under mpiexec -n 2 by test_cluster: strided KV to a rank in `pack_to` (a rank on another host)
arrives bit-exact and in order with the bulk lane, as MpiTransport sends it without packing, and the
gather buffers are reused once sent (the pool's hits)."""

import numpy as np
from mpi4py import MPI

from dualjax.runtime.messages import LayerKV, PrefillDone
from dualjax.runtime.transport import MpiTransport

rank = MPI.COMM_WORLD.Get_rank()
t = MpiTransport(MPI.COMM_WORLD, chunk_bytes=64 << 10, pack_to=frozenset({0}))
blocks = np.random.default_rng(0).standard_normal((9, 4, 16, 2, 4, 8)).astype(np.float32)  # [n, L, T, 2, K, H]
layers = [blocks[:, layer % 4] for layer in range(12)]  # strided: one layer of 9 Full Blocks each
if rank == 1:
    for i, kv in enumerate(layers):
        t.wait_backlog(2)
        t.send(0, LayerKV(1, i, 0, kv))
    t.send(0, PrefillDone(1, 0, 1, {}))
    assert t.pool.hits > 0, "sent gather buffers were not reused"
else:
    got = [t.recv(timeout=30)[1] for _ in range(len(layers) + 1)]
    assert isinstance(got[-1], PrefillDone)
    for i, (m, kv) in enumerate(zip(got, layers)):
        assert m.layer == i and m.kv.shape == kv.shape and np.array_equal(m.kv, kv), i
t.close()
MPI.COMM_WORLD.Barrier()
if rank == 0:
    print("ok")
