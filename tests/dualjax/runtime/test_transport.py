"""Transport invariants: both transports deliver every array bit-exact and count control traffic in
bytes; control overtakes KV, bulk messages stay in order; the receiver keeps at most its window
posted per source and delivers in order; a relay's backlog counts KV, not control messages."""

import collections
import os
import pickle
import queue
import subprocess
import sys

import numpy as np
import pytest

from dualjax.runtime.buffers import BufferPool
from dualjax.runtime.cluster.runner import mpiexec
from dualjax.runtime.messages import LayerKV, PrefillDone, Ready
from dualjax.runtime.transport import InProcFabric
from dualjax.runtime.transport.receiver import Receiver
from dualjax.runtime.transport.sender import KV_AHEAD, Sender
from dualjax.runtime.transport.wire import TAG_BELL, TAG_CTRL, TAG_KV_DATA, TAG_KV_HEAD, KVShape

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


class FakeMPI:
    """What the sender and receiver call of mpi4py, recording each send and receive posted."""

    BYTE = "BYTE"

    def __init__(self):
        self.calls: list[tuple] = []

    def Isend(self, spec, dest, tag):
        self.calls.append(("send", dest, tag, bytes(spec[0]) if tag != TAG_KV_DATA else len(spec[0])))
        return object()

    def Irecv(self, spec, source, tag):
        self.calls.append(("recv", source, tag, len(spec[0])))
        return object()


def _mpi_script(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([mpiexec(), "-n", "2", sys.executable, "-m", "mpi4py", *argv],
                          capture_output=True, text=True, timeout=120, cwd=REPO)


def test_inproc_copies_kv():
    """Control counted at the bytes MPI would send; KV copied, as a network would."""
    fabric = InProcFabric(2)
    t, kv = fabric.transport(0), np.arange(5 * 2 * 2 * 4, dtype=np.float32).reshape(5, 2, 2, 4)
    t.send(1, Ready(3))
    t.send(1, LayerKV(3, 0, 0, kv[:, ::-1]))  # not contiguous
    assert t.sent_bytes["control"] == len(pickle.dumps(Ready(3), protocol=pickle.HIGHEST_PROTOCOL))
    assert t.sent_bytes["kv"] == 5 * 2 * 2 * 4 * 4
    got = [fabric.transport(1).recv(timeout=1)[1] for _ in range(2)]
    assert np.array_equal(got[1].kv, kv[:, ::-1]) and not np.shares_memory(got[1].kv, kv)


@pytest.mark.parametrize("priority", [True, False])
def test_backlog_counts_kv_only(priority):
    """`wait_backlog` (a relay keeping N layers queued) counts bulk messages only, queued or with KV
    in flight: on the FIFO lane too, where control and KV share one queue, a queued ping must not
    hold the next layer back."""
    s = Sender(None, None, priority, 1 << 20, None)  # the lanes alone: no MPI
    s.queue(1, LayerKV(7, 0, 0, np.zeros((4, 2, 2, 16), np.float32)))
    for i in range(3):
        s.queue(1, Ready(i))
    s.queue(1, PrefillDone(7, 0, 1, {}))
    assert s.backlog() == 2
    s.outstanding = 1  # a layer handed to MPI whose pieces are not all through counts too
    assert s.backlog() == 3


def test_control_overtakes_queued_kv():
    """With priority, a push sends every control message and at most KV_AHEAD KV messages; the
    rest of the KV waits for a piece to go through, the control message queued after it does not."""
    mpi = FakeMPI()
    s = Sender(mpi, mpi, True, 64 << 10, collections.Counter())
    kv = np.arange(3 * (64 << 10) // 4, dtype=np.float32).reshape(3, -1)  # three pieces
    for layer in range(KV_AHEAD + 1):
        s.queue(1, LayerKV(7, layer, 0, kv))
    s.queue(1, Ready(7))
    s.push()
    s.push()
    s.push()
    heads = [pickle.loads(c[3]) for c in mpi.calls if c[2] in (TAG_CTRL, TAG_KV_HEAD)]
    assert isinstance(heads[0], Ready) and [h.layer for h in heads[1:]] == list(range(KV_AHEAD))
    assert all(isinstance(h.kv, KVShape) and h.kv.chunk == 64 << 10 for h in heads[1:])
    assert [c[3] for c in mpi.calls if c[2] == TAG_KV_DATA] == [64 << 10] * 3 * KV_AHEAD
    assert sum(c[2] == TAG_BELL for c in mpi.calls) == len(heads)  # a bell after every pickled message
    assert s.outstanding == KV_AHEAD and len(s.kv) == 1 and s.backlog() == KV_AHEAD + 1
    s.completed(list(range(len(s.sends.requests))))  # everything through: the last layer may go
    assert s.outstanding == 0 and s.push() and s.outstanding == 1


def test_receiver_keeps_window():
    """At most `window` receives posted per source; each completion posts the next; messages are
    delivered once complete, in the order their source sent them."""
    mpi = FakeMPI()
    r = Receiver(mpi, mpi, 2, BufferPool())
    r.expect(1, LayerKV(7, 0, 0, KVShape((3, 4), np.dtype(np.float32), 16)))  # 48 bytes: pieces of 16
    r.expect(1, PrefillDone(7, 0, 1, {}))  # bulk without KV: in order behind the layer
    r.expect(2, LayerKV(8, 0, 0, KVShape((1, 4), np.dtype(np.float32), 16)))
    assert r.post() and [(c[1], c[3]) for c in mpi.calls] == [(1, 16), (1, 16), (2, 16)]
    inbox = queue.Queue()
    assert not r.post() and not r.deliver(inbox)
    assert r.completed([2]) and r.deliver(inbox) and inbox.get_nowait()[0] == 2  # source 2's layer is complete
    assert r.completed([0]) and mpi.calls[-1][:2] == ("recv", 1) and len(r.receives.requests) == 2
    assert r.completed([0, 1]) and r.deliver(inbox)
    got = [inbox.get_nowait() for _ in range(2)]
    assert [(src, type(m).__name__) for src, m in got] == [(1, "LayerKV"), (1, "PrefillDone")]
    assert got[0][1].kv.shape == (3, 4) and got[0][1].kv.dtype == np.float32


@pytest.mark.parametrize("mode", ["poll", "wait", "late"])
def test_mpi_bit_exact(mode):
    """Both ways at once, with the progress threads polling, or waiting inside MPI (where the bell
    after every header is what lets a waiting rank post the receives its peer's KV needs), or with
    one rank late to take its peer's KV, which must not make the peer think MPI stalls (with CMA:
    without it, a rank may rightly find its received pieces stalled)."""
    if mode == "late" and not _cma():
        pytest.skip("MPICH has no single-copy transfers here: pieces may stall")
    proc = _mpi_script("tests/dualjax/runtime/mpi_transport.py", mode)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "ok"


def test_mpi_lanes():
    """Priority lanes: control overtakes the KV, bulk stays in order. One FIFO lane (the relay
    benchmark's baseline) sends in submission order; a receiver delivers control as it comes and
    bulk once complete, so there only the bulk order is fixed."""
    proc = _mpi_script("tests/dualjax/runtime/mpi_lanes.py")
    assert proc.returncode == 0, proc.stderr
    priority, fifo = proc.stdout.split()
    assert priority == "Ready,Ready,LayerKV,PrefillDone"
    assert [m for m in fifo.split(",") if m != "Ready"] == ["LayerKV", "PrefillDone"] and fifo.count("Ready") == 2


@pytest.mark.timing
def test_mpi_idle_wakeup():
    """A message to a rank whose progress thread sleeps its longest pause is taken in when that
    thread next wakes, not one pause later (MPICH's double probe)."""
    proc = _mpi_script("tests/dualjax/runtime/mpi_idle_wakeup.py")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "ok"


def _cma() -> bool:
    """Whether MPICH moves a large same-host message in one copy here (CMA): it does unless told
    not to or Yama's ptrace_scope is set."""
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            scope = int(f.read())
    except OSError:
        scope = 0
    return scope == 0 and os.environ.get("MPIR_CVAR_CH4_CMA_ENABLE") != "0"
