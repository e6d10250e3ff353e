"""Transports: how ranks exchange messages. One interface, two implementations.

* `InProcFabric`/`InProcTransport`: threads and queues in one process (tests, notebooks, demo).
* `MpiTransport`: mpi4py. One progress thread per rank makes every MPI call (threads blocked
  in MPI calls measured 10-100x slower here). Two traffic classes: control messages (pickled,
  high priority) and bulk messages: `LayerKV`, sent as a header plus raw chunks of at most
  `chunk_bytes` with the upper-case buffer calls, and what must stay in order with them
  (`PrefillDone`). A control message waits for at most a window of chunks, never a whole layer.
  The receiver pre-posts every chunk's receive when a header arrives, so MPI moves the bytes.
  `priority=False` sends everything in submission order (the FIFO baseline of `dualjax.bench.relay`).
"""

from __future__ import annotations

import collections
import dataclasses
import queue
import threading
import time

import numpy as np

from dualjax.runtime.messages import LayerKV


class HostFailure(RuntimeError):
    """A host raised: the run is over. The message carries that host's traceback."""


class Transport:
    rank: int
    size: int

    def __init__(self):
        self.sent_bytes = collections.Counter()  # "control" / "kv" -> bytes

    def send(self, dst: int, msg) -> None:
        raise NotImplementedError

    def recv(self, timeout: float | None = None):
        """(source rank, message), or None after `timeout` seconds."""
        raise NotImplementedError

    def abort(self, text: str) -> None:
        """End the whole job now (another host failed)."""
        raise NotImplementedError

    def close(self) -> None:
        pass


class InProcFabric:
    """The shared medium of an in-process cluster: one inbox per rank."""

    def __init__(self, size: int):
        self.inboxes = [queue.Queue() for _ in range(size)]
        self.failure: str | None = None

    def transport(self, rank: int) -> "InProcTransport":
        return InProcTransport(self, rank)


class InProcTransport(Transport):
    def __init__(self, fabric: InProcFabric, rank: int):
        super().__init__()
        self.fabric, self.rank, self.size = fabric, rank, len(fabric.inboxes)

    def send(self, dst: int, msg) -> None:
        if isinstance(msg, LayerKV):  # a copy, as a network would make: the sender may reuse its buffer
            msg = dataclasses.replace(msg, kv=np.array(msg.kv, copy=True))
            self.sent_bytes["kv"] += msg.kv.nbytes
        else:
            self.sent_bytes["control"] += 1
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


TAG_CTRL, TAG_KV_HEAD, TAG_KV_DATA = 11, 12, 13
DEFAULT_CHUNK_BYTES = 1 << 20


class MpiTransport(Transport):
    """mpi4py transport with a progress thread; see the module docstring."""

    def __init__(self, comm, priority: bool = True, chunk_bytes: int = DEFAULT_CHUNK_BYTES, window: int = 8):
        super().__init__()
        from mpi4py import MPI  # imported here so in-process runs never load MPI

        self.MPI, self.comm, self.rank, self.size = MPI, comm, comm.Get_rank(), comm.Get_size()
        self.priority, self.chunk_bytes, self.window = priority, chunk_bytes, window
        self._ctrl: collections.deque = collections.deque()
        self._kv: collections.deque = collections.deque()
        self._lock = threading.Lock()
        self._inbox: queue.Queue = queue.Queue()
        self._assembly: dict[int, collections.deque] = {}  # source -> (header, buffer, posted receives), in order
        self._pending: list = []  # outstanding send requests (and the buffers they read)
        self._active: collections.deque = collections.deque()  # chunks of the KV message being sent
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"mpi-progress-{self.rank}", daemon=True)
        self._thread.start()

    def send(self, dst: int, msg) -> None:
        if self._error:
            raise self._error
        if dst == self.rank:
            self._inbox.put((self.rank, msg))
            return
        with self._lock:
            (self._kv if getattr(msg, "bulk", False) and self.priority else self._ctrl).append((dst, msg))

    def recv(self, timeout: float | None = None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:  # wake up now and then so a progress-thread error surfaces at once
            if self._error:
                raise self._error
            wait = 0.1 if deadline is None else min(0.1, deadline - time.monotonic())
            try:
                return self._inbox.get(timeout=max(wait, 0.0))
            except queue.Empty:
                if deadline is not None and time.monotonic() >= deadline:
                    return None

    def backlog(self) -> int:
        """Bulk messages queued and not yet fully handed to MPI (the one being chunked counts)."""
        with self._lock:
            return len(self._kv) + bool(self._active) + (0 if self.priority else len(self._ctrl))

    def abort(self, text: str) -> None:
        self.comm.Abort(1)

    def close(self) -> None:
        """Flush what was sent, then stop the progress thread."""
        while not self._error:
            with self._lock:
                idle = not (self._ctrl or self._kv or self._active or self._pending)
            if idle:
                break
            time.sleep(0.001)
        self._stop.set()
        self._thread.join()

    # -- progress thread -------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                busy = self._poll_incoming()
                busy |= self._push_outgoing()
                self._pending = [(r, buf) for r, buf in self._pending if not r.Test()]
                if not busy:
                    time.sleep(0.0002 if not self._pending else 0)
        except BaseException as e:  # noqa: BLE001 - surfaced to the host thread on its next call
            self._error = e

    def _poll_incoming(self) -> bool:
        MPI, st, got = self.MPI, self.MPI.Status(), False
        while self.comm.Iprobe(source=MPI.ANY_SOURCE, tag=TAG_CTRL, status=st) or \
                self.comm.Iprobe(source=MPI.ANY_SOURCE, tag=TAG_KV_HEAD, status=st):
            src, got = st.Get_source(), True
            if st.Get_tag() == TAG_CTRL:
                self._inbox.put((src, self.comm.recv(source=src, tag=TAG_CTRL)))
                continue
            head, reqs, buf = self.comm.recv(source=src, tag=TAG_KV_HEAD), [], None
            if isinstance(getattr(head, "kv", None), _Shape):  # pre-post every chunk's receive
                buf, step = np.empty(head.kv.nbytes, np.uint8), head.kv.chunk
                reqs = [self.comm.Irecv([buf[i:i + step], MPI.BYTE], source=src, tag=TAG_KV_DATA)
                        for i in range(0, buf.size, step)]
            self._assembly.setdefault(src, collections.deque()).append((head, buf, reqs))
        for src, pending in self._assembly.items():  # deliver in order, per source
            while pending and MPI.Request.Testall(pending[0][2]):
                head, buf, _ = pending.popleft()
                if buf is not None:
                    head = dataclasses.replace(head, kv=buf.view(head.kv.dtype).reshape(head.kv.shape))
                self._inbox.put((src, head))
                got = True
        return got or any(self._assembly.values())

    def _push_outgoing(self) -> bool:
        with self._lock:
            if self._ctrl and (self.priority or not self._active):
                dst, msg = self._ctrl.popleft()
            elif self._active or not self._kv:
                msg = None
            else:
                dst, msg = self._kv.popleft()
        if msg is not None and not isinstance(msg, LayerKV):
            tag = TAG_KV_HEAD if getattr(msg, "bulk", False) else TAG_CTRL  # bulk: ordered with the KV
            self._pending.append((self.comm.isend(msg, dest=dst, tag=tag), None))
            self.sent_bytes["control"] += 1
            return True
        if msg is not None:  # start a KV message: a header with the array's shape, then raw chunks
            data = np.ascontiguousarray(msg.kv).reshape(-1).view(np.uint8)
            head = dataclasses.replace(msg, kv=_Shape(tuple(msg.kv.shape), msg.kv.dtype, self.chunk_bytes))
            self._pending.append((self.comm.isend(head, dest=dst, tag=TAG_KV_HEAD), None))
            self._active.extend((dst, data[i:i + self.chunk_bytes]) for i in range(0, data.size, self.chunk_bytes))
            self.sent_bytes["kv"] += data.size
        sent = False
        while self._active and sum(1 for _, b in self._pending if b is not None) < self.window:
            dst, chunk = self._active.popleft()
            self._pending.append((self.comm.Isend([chunk, self.MPI.BYTE], dest=dst, tag=TAG_KV_DATA), chunk))
            sent = True
        return sent or msg is not None


@dataclasses.dataclass(frozen=True)
class _Shape:
    """Shape and dtype of a KV array in flight: stands in for the array in the pickled header."""

    shape: tuple
    dtype: np.dtype
    chunk: int  # bytes per data message

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * np.dtype(self.dtype).itemsize
