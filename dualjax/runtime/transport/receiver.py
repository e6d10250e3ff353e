"""The MPI transport's receiving side: bulk messages being assembled, per source, in order.

The receiver sets the pace of the KV lane. A header announces a message's pieces; the receiver
keeps at most `window` of them posted per source (`Irecv` into a buffer of a `BufferPool`, reused
memory: no page faults) and posts the next as each completes, so a control message from a source
waits behind at most `window * chunk_bytes` of its KV, never behind a backlog of layers (the
preemption points), and no piece waits for the sender's progress thread to wake up and post it.
A message is delivered once all its pieces are in, in the order its source sent it.
"""

from __future__ import annotations

import collections
import dataclasses

import numpy as np

from dualjax.runtime.buffers import BufferPool
from dualjax.runtime.transport.wire import TAG_KV_DATA, InFlight, KVShape

DEFAULT_WINDOW = 2  # data receives a receiver keeps posted per source


@dataclasses.dataclass(slots=True)
class Incoming:
    """A bulk message from `source` not yet delivered: its header, the buffer its pieces land in
    (None: a bulk message without KV) and how many pieces are not received yet."""

    source: int
    header: object
    buffer: np.ndarray | None = None
    left: int = 0


class Receiver:
    """Bulk messages in assembly, the pieces not posted yet, and the receives posted (the progress
    thread only)."""

    def __init__(self, comm, MPI, window: int, pool: BufferPool):
        self.comm, self.MPI, self.window, self.pool = comm, MPI, window, pool
        self.assembly: dict[int, collections.deque[Incoming]] = {}  # source -> its messages, in order
        self.to_post: dict[int, collections.deque[tuple[Incoming, np.ndarray]]] = {}  # source -> (message, piece)
        self.posted: collections.Counter = collections.Counter()  # source -> receives posted, not done
        self.receives = InFlight()  # records: the Incoming each piece belongs to

    def expect(self, src: int, header) -> None:
        """A bulk message's header arrived from `src`: queue its pieces' receives (a `LayerKV`'s
        `kv` is a `KVShape` here), in order after the pieces before them."""
        msg = Incoming(src, header)
        shape = getattr(header, "kv", None)
        if isinstance(shape, KVShape):
            msg.buffer = self.pool.take(shape.nbytes)
            todo = self.to_post.setdefault(src, collections.deque())
            for i in range(0, msg.buffer.size, shape.chunk):
                todo.append((msg, msg.buffer[i:i + shape.chunk]))
                msg.left += 1
        self.assembly.setdefault(src, collections.deque()).append(msg)

    def post(self) -> bool:
        """Post the next data receives of each source, up to `window` outstanding per source."""
        posted = False
        for src, todo in self.to_post.items():
            while todo and self.posted[src] < self.window:
                msg, buf = todo.popleft()
                self.receives.add(self.comm.Irecv([buf, self.MPI.BYTE], source=src, tag=TAG_KV_DATA), msg)
                self.posted[src] += 1
                posted = True
        return posted

    def completed(self, done: list[int]) -> bool:
        """Account for completed receives (indices into `receives.requests`) and post the next
        ones; whether any completed."""
        if not done:
            return False
        for msg in self.receives.pop(done):
            msg.left -= 1
            self.posted[msg.source] -= 1
        self.post()
        return True

    def deliver(self, inbox) -> bool:
        """Put every message whose pieces are all in into `inbox`, in order per source; whether any."""
        got = False
        for src, pending in self.assembly.items():
            while pending and pending[0].left == 0:
                msg = pending.popleft()
                head = msg.header
                if msg.buffer is not None:
                    head = dataclasses.replace(head, kv=msg.buffer.view(head.kv.dtype).reshape(head.kv.shape))
                inbox.put((src, head))
                got = True
        return got

    def sources(self) -> list[int]:
        """The ranks that have sent this one bulk messages."""
        return list(self.assembly)
