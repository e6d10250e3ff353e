"""The in-process transport: threads and queues in one process (embedded runs, tests, notebooks).

A `LayerKV` is copied, as a network would, into a pooled page-aligned buffer: no page faults, and
the receiver can hand it to a CPU device uncopied. Control messages are delivered as objects but
counted at the bytes the MPI transport would send.
"""

from __future__ import annotations

import dataclasses
import queue

from dualjax.runtime.buffers import BufferPool
from dualjax.runtime.messages import LayerKV
from dualjax.runtime.transport.lanes import HostFailure, Transport, pickled


class InProcFabric:
    """The shared medium of an in-process cluster: one inbox per rank."""

    def __init__(self, size: int):
        self.inboxes = [queue.Queue() for _ in range(size)]
        self.failure: str | None = None
        self.pool = BufferPool()  # what KV messages are copied into

    def transport(self, rank: int) -> InProcTransport:
        return InProcTransport(self, rank)


class InProcTransport(Transport):
    def __init__(self, fabric: InProcFabric, rank: int):
        super().__init__()
        self.fabric, self.rank, self.size = fabric, rank, len(fabric.inboxes)

    def send(self, dst: int, msg) -> None:
        if isinstance(msg, LayerKV):  # a copy, as a network would make: the sender may reuse its buffer
            msg = dataclasses.replace(msg, kv=self.fabric.pool.copy(msg.kv))
            self.sent_bytes["kv"] += msg.kv.nbytes
        else:
            self.sent_bytes["control"] += len(pickled(msg))
        self.fabric.inboxes[dst].put((self.rank, msg))

    def recv(self, timeout: float | None = None):
        if self.fabric.failure:
            raise HostFailure(self.fabric.failure)
        try:
            got = self.fabric.inboxes[self.rank].get(timeout=timeout)
        except queue.Empty:
            return None
        if isinstance(got[1], _Abort):
            raise HostFailure(got[1].text)
        return got

    def abort(self, text: str) -> None:
        self.fabric.failure = text
        for inbox in self.fabric.inboxes:
            inbox.put((self.rank, _Abort(text)))


@dataclasses.dataclass(frozen=True)
class _Abort:
    text: str
