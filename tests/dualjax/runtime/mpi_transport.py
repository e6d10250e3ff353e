"""Run under mpiexec -n 2 by test_transport: MpiTransport delivers every KV array bit-exact
(contiguous, strided layer slices of Full Blocks, sizes around the chunk size, empty), in order
with the bulk lane, both ways at once, and counts control traffic in bytes; with `wait`, its
progress threads wait inside MPI while KV is in flight; with `late`, rank 0 starts its transport
late, so rank 1's pieces wait long for their receives, and one stalled piece would switch a rank
to waiting: only a received piece's wait may (a sent one waits for its receiver to post it)."""

import pickle
import sys
import time

import numpy as np
from mpi4py import MPI

from dualjax.runtime.messages import LayerKV, PrefillDone, Ready
from dualjax.runtime.transport import MpiTransport, mpi

CHUNK = 1 << 20 if sys.argv[1:] == ["late"] else 64 << 10  # late: pieces MPICH sends by rendezvous


def arrays():
    rng = np.random.default_rng(0)
    blocks = rng.standard_normal((7, 3, 16, 2, 4, 8)).astype(np.float32)  # [n, L, T, 2, K, H]: 16 KiB layer blocks
    yield blocks[:, 1]  # strided: one layer of 7 Full Blocks
    yield blocks[:5, 2]
    for n in (0, 1, CHUNK // 4 - 1, CHUNK // 4, CHUNK // 4 + 1, 3 * CHUNK // 4 + 5):
        yield rng.standard_normal(n).astype(np.float32)
    yield np.asfortranarray(rng.standard_normal((33, 9)))  # not row-contiguous: sent as a copy


if sys.argv[1:] == ["wait"]:  # as where MPI moves KV only inside its calls (found at run time otherwise)
    MpiTransport.waits_inside_mpi = True
if sys.argv[1:] == ["late"]:
    mpi.STALLS_TO_WAIT = 1
    if MPI.COMM_WORLD.Get_rank() == 0:
        time.sleep(0.3)
t = MpiTransport(MPI.COMM_WORLD, chunk_bytes=CHUNK, window=2)
sent, peer = list(arrays()), 1 - MPI.COMM_WORLD.Get_rank()
for i, a in enumerate(sent):  # both ways at once: each rank's KV waits for receives the other posts
    t.send(peer, LayerKV(1, i, 0, a))
t.send(peer, PrefillDone(1, 0, 1, {}))
t.send(peer, Ready(1))
got = [t.recv(timeout=30)[1] for _ in range(len(sent) + 2)]
kinds = [type(m).__name__ for m in got]
assert kinds.index("Ready") < kinds.index("PrefillDone") and kinds[-1] in ("PrefillDone", "Ready"), kinds
kv = [m for m in got if isinstance(m, LayerKV)]
assert [m.layer for m in kv] == list(range(len(sent)))  # bulk lane in order
for m, a in zip(kv, sent):
    assert m.kv.shape == a.shape and m.kv.dtype == a.dtype and np.array_equal(m.kv, a), m.layer
t.close()
want = sum(len(pickle.dumps(m, protocol=pickle.HIGHEST_PROTOCOL)) for m in (PrefillDone(1, 0, 1, {}), Ready(1)))
assert t.sent_bytes["control"] > want, t.sent_bytes  # headers count too, and bytes, not messages
assert t.sent_bytes["kv"] == sum(a.nbytes for a in sent)
assert MpiTransport.waits_inside_mpi == (sys.argv[1:] == ["wait"])  # these small pieces never stall
MPI.COMM_WORLD.Barrier()
if MPI.COMM_WORLD.Get_rank() == 0:
    print("ok", flush=True)
