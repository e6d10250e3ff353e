"""The MPI transport's sending side: the two lanes that host threads queue on, and the sends the
progress thread has handed to MPI.

Control messages are pickled and sent at once. A `LayerKV` goes as a pickled header (its shape,
dtype and piece size) and then every one of its pieces at once, at most `KV_AHEAD` messages not yet
through: the receiver sets the pace by how many pieces it keeps posted (`receiver.py`), and a large
piece is a rendezvous in MPICH, whose bytes move only once its receive is posted. An array that is
rows of contiguous bytes a fixed stride apart (one layer of several Full Blocks) is sent as it lies
through an MPI `hvector` datatype; anything else not contiguous is copied once.
`priority=False` puts every message on one FIFO lane, each sent only once the KV before it is
through (the baseline of `dualjax bench relay`).
"""

from __future__ import annotations

import collections
import dataclasses
import threading

import numpy as np

from dualjax.runtime.messages import LayerKV
from dualjax.runtime.transport.lanes import is_bulk, pickled
from dualjax.runtime.transport.wire import TAG_BELL, TAG_CTRL, TAG_KV_DATA, TAG_KV_HEAD, InFlight, KVShape, byte_rows

DEFAULT_CHUNK_BYTES = 2 << 20
KV_AHEAD = 2  # KV messages a sender has handed to MPI and not yet seen through


@dataclasses.dataclass(slots=True)
class OutgoingKV:
    """A KV message whose pieces are handed to MPI: the array they read (kept alive until the last
    is sent) and how many are not sent yet."""

    kv: np.ndarray
    left: int


class Sender:
    """The lanes (`queue`, any thread) and the sends in flight (`push`, `reap`, `completed`: the
    progress thread only). `lock` guards the lanes, `starting`, `outstanding` and `waiting`;
    `handed` is notified as each bulk message goes through (`MpiTransport.wait_backlog`)."""

    def __init__(self, comm, MPI, priority: bool, chunk_bytes: int, sent_bytes: collections.Counter):
        self.comm, self.MPI, self.priority, self.chunk_bytes = comm, MPI, priority, chunk_bytes
        self.sent_bytes = sent_bytes
        self.lock = threading.Lock()
        self.handed = threading.Condition(self.lock)
        self.ctrl: collections.deque = collections.deque()  # (dst, msg); with priority=False, every message
        self.kv: collections.deque = collections.deque()  # (dst, msg) of the bulk lane
        self.starting = False  # a bulk message is taken off its lane, not yet posted or handed to MPI
        self.outstanding = 0  # KV messages handed to MPI whose pieces are not all sent
        self.waiting = False  # the progress thread is (about to be) waiting inside MPI
        self.sends = InFlight()  # records: the bytes a control send reads, or the OutgoingKV of a piece
        self._types: dict[tuple, object] = {}  # committed strided datatypes, by (rows, row bytes, stride)

    # -- the lanes (any thread) -------------------------------------------------------------------
    def queue(self, dst: int, msg) -> None:
        with self.lock:
            (self.kv if self.priority and is_bulk(msg) else self.ctrl).append((dst, msg))

    def backlog(self) -> int:
        """Bulk messages queued or with KV not yet through: the one being started and those whose
        pieces are not all sent count, control messages do not, on either lane (the caller holds
        `lock`)."""
        queued = len(self.kv) if self.priority else sum(is_bulk(m) for _, m in self.ctrl)
        return queued + self.outstanding + self.starting

    def pushable(self) -> bool:
        """Whether `push` would send something now (the caller holds `lock`)."""
        return bool(self.ctrl and (self.priority or not self.outstanding) or self.kv and self.outstanding < KV_AHEAD)

    def idle(self) -> bool:
        with self.lock:
            return not (self.ctrl or self.kv or self.sends.requests)

    # -- sends (the progress thread) ---------------------------------------------------------------
    def push(self) -> bool:
        """Hand MPI what may go now: every queued control message, and the next bulk message if
        fewer than `KV_AHEAD` are in flight (FIFO lane: the next message once the KV before it is
        through). Whether anything was sent."""
        with self.lock:
            ctrl = list(self.ctrl) if self.priority else []
            if ctrl:
                self.ctrl.clear()
            elif not self.priority and self.ctrl and not self.outstanding:  # one lane: after the KV before
                ctrl = [self.ctrl.popleft()]
            start = self.kv.popleft() if self.priority and self.kv and self.outstanding < KV_AHEAD else None
            # a bulk message counts in the backlog until posted (KV: then in `outstanding` until its pieces are sent)
            handed = start is not None or not self.priority and bool(ctrl) and is_bulk(ctrl[0][1])
            self.starting = handed
        moved = bool(ctrl)
        for dst, msg in ctrl:
            if isinstance(msg, LayerKV):  # FIFO lane: KV waits its turn like everything else
                start = (dst, msg)
                break
            self.post(dst, TAG_KV_HEAD if is_bulk(msg) else TAG_CTRL, msg)
        if start is not None:
            dst, msg = start
            if isinstance(msg, LayerKV):
                self._start_kv(dst, msg)
            else:
                self.post(dst, TAG_KV_HEAD, msg)  # bulk, in order with the KV
            moved = True
        if handed:  # posted, or (KV) its pieces handed to MPI: the backlog counts it in `outstanding` now
            with self.lock:
                self.starting = False
                self.handed.notify_all()
        return moved

    def post(self, dst: int, tag: int, msg) -> None:
        """Send a pickled message, then ring `dst`'s bell (it may be waiting inside MPI)."""
        raw = pickled(msg)
        for buf, t in ((raw, tag), (b"", TAG_BELL)):
            self.sends.add(self.comm.Isend([buf, self.MPI.BYTE], dest=dst, tag=t), buf)
        self.sent_bytes["control"] += len(raw)

    def _start_kv(self, dst: int, msg: LayerKV) -> None:
        """A header with the array's shape, then every piece of its bytes handed to MPI (the receiver
        posts their receives as it goes: it sets the pace)."""
        kv, pieces = msg.kv, []
        rows = byte_rows(kv)
        if rows is None:  # contiguous (or made so): plain byte ranges
            keep = np.ascontiguousarray(kv).reshape(-1).view(np.uint8)
            step = self.chunk_bytes
            pieces = [[keep[i:i + step], self.MPI.BYTE] for i in range(0, keep.size, step)]
        else:  # rows of `width` bytes, `stride` apart (a layer of Full Blocks): datatypes, no copy
            keep, (n, width, stride, addr) = kv, rows
            per = max(1, self.chunk_bytes // width)
            step = per * width
            for r in range(0, n, per):
                m = min(per, n - r)
                buf = self.MPI.buffer.fromaddress(addr + r * stride, (m - 1) * stride + width, readonly=True)
                pieces.append([buf, 1, self._strided(m, width, stride)])
        self.post(dst, TAG_KV_HEAD, dataclasses.replace(msg, kv=KVShape(tuple(kv.shape), kv.dtype, step)))
        out = OutgoingKV(keep, len(pieces))
        for spec in pieces:
            self.sends.add(self.comm.Isend(spec, dest=dst, tag=TAG_KV_DATA), out)
        if pieces:
            with self.lock:
                self.outstanding += 1
        self.sent_bytes["kv"] += kv.nbytes

    def _strided(self, rows: int, width: int, stride: int):
        key = (rows, width, stride)
        if key not in self._types:
            self._types[key] = self.MPI.BYTE.Create_hvector(rows, width, stride).Commit()
        return self._types[key]

    def reap(self) -> bool:
        """Account for the sends that completed; whether any did."""
        return bool(self.sends.requests) and self.completed(self.MPI.Request.Testsome(self.sends.requests) or [])

    def completed(self, done: list[int]) -> bool:
        """Account for completed sends (indices into `sends.requests`); whether any."""
        through = 0  # KV messages whose last piece this was
        for record in self.sends.pop(done):
            if isinstance(record, OutgoingKV):
                record.left -= 1
                through += record.left == 0
        if through:
            with self.lock:
                self.outstanding -= through
                self.handed.notify_all()
        return bool(done)

    def free(self) -> None:
        for t in self._types.values():
            t.Free()
        self._types.clear()
