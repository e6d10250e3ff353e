"""Transports: how ranks exchange messages. One interface, two implementations.

* `InProcFabric`/`InProcTransport`: threads and queues in one process (tests, notebooks, demo).
  A `LayerKV` is copied, as a network would, into a pooled page-aligned buffer (no page faults;
  the receiver can hand it to a CPU device uncopied).
* `MpiTransport`: mpi4py. One progress thread per rank makes every MPI call but a bell (below)
  (threads blocked in MPI calls measured 10-100x slower here). Two traffic classes: control messages (pickled by
  the transport, sent at once: high priority) and bulk messages: `LayerKV`, sent as a small
  pickled header plus the array's bytes in data messages of at most `chunk_bytes` (a strided
  layer slice of Full Blocks goes as it lies, described by an MPI datatype: no gather copy), and
  what must stay in order with them (`PrefillDone`). The receiver sets the pace: the sender hands
  every piece of a message to MPI at once (of at most `KV_AHEAD` messages), and the receiver
  keeps at most `window` pieces per source posted into a recycled buffer (`BufferPool`: no page
  faults), posting the next as each completes (`Testsome`), so a control message waits behind at
  most `window * chunk_bytes` of KV from a source, never a backlog of layers (the preemption
  points), and no piece waits for the sender's progress thread to wake up and post it (as it did
  while the sender kept the window, until 2026-12-03). Probes look only at the control, header and
  bell tags: a piece not yet posted for is never probed. `priority=False` sends everything in
  submission order, each message only once the KV before it is through (the FIFO baseline of
  `dualjax.bench.relay`). When nothing moves the progress
  thread backs off, up to `WAIT_MAX_S` between polls while transfers are in flight (the peer is
  slow: its reads or copies need the CPU more than our polling) and `IDLE_MAX_S` with nothing in
  flight; a local `send` wakes it at once.
* Where MPI moves KV only inside its calls (MPICH's shared memory without single-copy CMA, which
  MPICH turns off under Yama's ptrace_scope >= 1), polling between pauses relayed 1/100 of a plain
  `Send`. `STALLS_TO_WAIT` received pieces in a row that each needed over `STALLED_POLLS` polls
  switch every transport of the process to waiting inside MPI (`Waitsome`) while KV is in flight
  (`MpiTransport.waits_inside_mpi`), and tell the ranks that sent them to do the same (they need
  it as much). Only receives are watched: a sent piece waits for its receiver to post it, so its
  wait says nothing about how MPI moves bytes. Every control message and KV header is followed by an empty
  "bell" message, whose receive is always posted and in every wait, so a waiting rank still takes
  in its peers' messages (two ranks each waiting for the other to post the receives of its KV would
  otherwise wait forever); a local `send` rings the rank's own bell.
* `sent_bytes`: "kv" counts KV payload bytes, "control" the pickled bytes of every other message
  and of the KV headers.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
import os
import pickle
import queue
import threading
import time

import numpy as np

from dualjax.runtime.buffers import BufferPool
from dualjax.runtime.messages import LayerKV

log = logging.getLogger("dualjax.runtime.transport")


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
        self.pool = BufferPool()  # what KV messages are copied into

    def transport(self, rank: int) -> "InProcTransport":
        return InProcTransport(self, rank)


class InProcTransport(Transport):
    def __init__(self, fabric: InProcFabric, rank: int):
        super().__init__()
        self.fabric, self.rank, self.size = fabric, rank, len(fabric.inboxes)

    def send(self, dst: int, msg) -> None:
        if isinstance(msg, LayerKV):  # a copy, as a network would make: the sender may reuse its buffer
            msg = dataclasses.replace(msg, kv=self.fabric.pool.copy(msg.kv))
            self.sent_bytes["kv"] += msg.kv.nbytes
        else:  # the bytes the MPI transport would send
            self.sent_bytes["control"] += len(pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL))
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


TAG_CTRL, TAG_KV_HEAD, TAG_KV_DATA, TAG_BELL = 11, 12, 13, 14
DEFAULT_CHUNK_BYTES = 2 << 20
DEFAULT_WINDOW = 2  # data receives a receiver keeps posted per source
KV_AHEAD = 2  # KV messages a sender has handed to MPI and not yet seen through
BUSY_POLL_S = 0.00002  # progress thread's first pause when nothing moved (MPI copies inside its calls)
WAIT_MAX_S = 0.0005  # longest pause while transfers are in flight but nothing moved (the peer is slow)
IDLE_MAX_S = 0.005  # longest pause between probes for incoming messages when nothing is in flight
STALLED_POLLS = 32  # polls with receives posted before a piece is received (~15 ms) that make it a stalled one
STALLS_TO_WAIT = 3  # stalled received pieces in a row that show MPI moves KV only inside its calls


# MPICH settings for the ranks of this transport, where the environment leaves them unset: a thread
# waiting inside MPI yields its core at every poll (MPICH's default: every 1,000), so the threads that
# share the core (storage reads, the model, the host's own loop) are not held off while KV is in flight.
# Between hosts over UCX, a KV piece goes by rendezvous (its bytes move once the receiver posts it, so the
# receiver sets the pace and a control message waits behind at most `window` pieces): over TCP, UCX's own
# threshold sent 2 MiB eagerly, every send completing at once, and control messages queued behind every
# layer handed to MPI (docs/cluster.md). It changes nothing within a host (MPICH's shared memory).
MPICH_ENV = {"MPIR_CVAR_POLLS_BEFORE_YIELD": "1", "UCX_RNDV_THRESH": "64K"}


def comm_world():
    """`MPI.COMM_WORLD`, MPI initialized (on first use) with `MPICH_ENV`."""
    for key, value in MPICH_ENV.items():
        os.environ.setdefault(key, value)
    from mpi4py import MPI
    return MPI.COMM_WORLD


class MpiTransport(Transport):
    """mpi4py transport with a progress thread; see the module docstring."""

    # Whether progress threads wait inside MPI while KV is in flight: set, for every transport of the
    # process, once one has seen its KV stall between polls (MPI moves it only inside calls here)
    waits_inside_mpi = False

    def __init__(self, comm, priority: bool = True, chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                 window: int = DEFAULT_WINDOW, pool: BufferPool | None = None, pack_to: frozenset[int] = frozenset()):
        """`pack_to`: ranks on other hosts. Strided KV to them is gathered into one pooled buffer by
        `send` (the caller's thread) and sent as bytes: MPICH's datatype path over a network netmod
        (UCX packing in small fragments) relayed a layer of Full Blocks at a third of a plain `Send`."""
        super().__init__()
        from mpi4py import MPI  # imported here so in-process runs never load MPI

        self.MPI, self.comm, self.rank, self.size = MPI, comm, comm.Get_rank(), comm.Get_size()
        self.priority, self.chunk_bytes, self.window, self.pack_to = priority, chunk_bytes, window, pack_to
        self.pool = pool or BufferPool()
        self._ctrl: collections.deque = collections.deque()
        self._kv: collections.deque = collections.deque()
        self._lock = threading.Lock()
        self._handed = threading.Condition(self._lock)  # a bulk message was fully handed to MPI
        self._starting = False  # a bulk message is popped from its queue, not yet posted or chunked
        self._inbox: queue.Queue = queue.Queue()
        self._assembly: dict[int, collections.deque] = {}  # source -> [header, buffer, receives left], in order
        self._to_post: dict[int, collections.deque] = {}  # source -> data receives not posted yet (entry, bytes)
        self._posted: collections.Counter = collections.Counter()  # source -> data receives posted, not done
        self._recv_reqs: list = []  # outstanding data receives, and (assembly entry, source) of each
        self._recv_of: list = []
        self._send_reqs: list = []  # outstanding sends, and what each reads (kept alive until done)
        self._send_keep: list = []
        self._outstanding = 0  # KV messages handed to MPI, pieces not all sent (written by the progress thread only)
        self._bell = None  # the posted receive of a bell (posted by the progress thread)
        self._waiting = False  # the progress thread is (about to be) waiting inside MPI
        self._stalled = 0  # polls with receives in flight since a piece was last received
        self._stalls = 0  # received pieces in a row done after more than STALLED_POLLS polls
        self._bell_buf = bytearray(1)
        self._types: dict[tuple, object] = {}  # committed strided datatypes, by (rows, row bytes, stride)
        self._stop = threading.Event()
        self._wake = threading.Event()  # set by send(): something to push
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"mpi-progress-{self.rank}", daemon=True)
        self._thread.start()

    def send(self, dst: int, msg) -> None:
        """Queue `msg` for `dst`. A `LayerKV`'s array is read until its send completes: the caller
        must not modify it meanwhile (it may drop it)."""
        if self._error:
            raise self._error
        if dst == self.rank:
            self._inbox.put((self.rank, msg))
            return
        if dst in self.pack_to and isinstance(msg, LayerKV) and _byte_rows(msg.kv) is not None:
            packed = self.pool.take(msg.kv.nbytes).view(msg.kv.dtype).reshape(msg.kv.shape)
            packed[...] = msg.kv
            msg = dataclasses.replace(msg, kv=packed)
        with self._lock:
            (self._kv if getattr(msg, "bulk", False) and self.priority else self._ctrl).append((dst, msg))
        self._wake_up()

    def _wake_up(self) -> None:
        """Wake the progress thread: from its pause, or, if it waits inside MPI, by ringing our own
        bell (an MPI call from this thread: MPI_THREAD_MULTIPLE)."""
        with self._lock:
            ring = self._waiting
        self._wake.set()
        if ring:
            self.comm.Isend([b"", self.MPI.BYTE], dest=self.rank, tag=TAG_BELL).Free()

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

    def _backlog(self) -> int:
        """Bulk messages queued or with KV not yet through: the one being started and those whose
        pieces are not all sent count, control messages do not, on either lane (the caller holds
        the lock)."""
        queued = len(self._kv) if self.priority else sum(getattr(m, "bulk", False) for _, m in self._ctrl)
        return queued + self._outstanding + self._starting

    def wait_backlog(self, limit: int) -> None:
        """Block until fewer than `limit` bulk messages are queued or in flight (`_backlog`), woken by
        the progress thread as each goes through (and every 0.1 s, to surface its error): a sender
        that keeps a few layers ahead of the link without polling."""
        if limit < 1:
            raise ValueError(f"wait_backlog: limit must be at least 1, got {limit}")
        with self._lock:
            while self._backlog() >= limit:
                if self._error:
                    raise self._error
                self._handed.wait(0.1)

    def abort(self, text: str) -> None:
        self.comm.Abort(1)

    def close(self) -> None:
        """Flush what was sent, then stop the progress thread."""
        while not self._error:
            with self._lock:
                idle = not (self._ctrl or self._kv or self._send_reqs)
            if idle:
                break
            time.sleep(0.001)
        self._stop.set()
        self._wake_up()
        self._thread.join()
        for t in self._types.values():
            t.Free()

    # -- progress thread -------------------------------------------------------------------------
    def _run(self) -> None:
        pause = BUSY_POLL_S
        try:
            self._post_bell()
            while not self._stop.is_set():
                busy = self._poll_incoming()
                busy |= self._push_outgoing()
                busy |= self._reap_sends()
                if busy:
                    pause = BUSY_POLL_S
                    continue
                in_flight = bool(self._recv_reqs or self._outstanding)
                if in_flight and MpiTransport.waits_inside_mpi:
                    self._wait_inside_mpi()
                    pause = BUSY_POLL_S
                    continue
                self._stalled += bool(self._recv_reqs)
                # Nothing moved: back off (a rank spinning here takes the core its peer needs to read
                # and copy), the longer the less is in flight; a local send wakes us at once.
                pause = min(2 * pause, WAIT_MAX_S if in_flight or self._send_reqs else IDLE_MAX_S)
                if self._wake.wait(pause):
                    self._wake.clear()
            self._bell.Cancel()
            self._bell.Wait()
        except BaseException as e:  # noqa: BLE001 - surfaced to the host thread on its next call
            self._error = e

    def _post_bell(self) -> None:
        self._bell = self.comm.Irecv([self._bell_buf, self.MPI.BYTE], source=self.MPI.ANY_SOURCE, tag=TAG_BELL)

    def _wait_inside_mpi(self) -> None:
        """Block in `Waitsome` until a KV piece is sent or received or the bell rings (a peer's
        message, or a local `send`)."""
        with self._lock:
            if self._ctrl and (self.priority or not self._outstanding) or self._kv and self._outstanding < KV_AHEAD:
                return  # queued since the push, and it can go now: push it first
            self._waiting = True
        nr, ns = len(self._recv_reqs), len(self._send_reqs)
        try:
            done = self.MPI.Request.Waitsome(self._recv_reqs + self._send_reqs + [self._bell]) or []
        finally:
            with self._lock:
                self._waiting = False
        self._received([i for i in done if i < nr])
        self._sent([i - nr for i in done if nr <= i < nr + ns])
        if nr + ns in done:
            self._post_bell()

    def _probe(self, st) -> bool:
        """Whether a control message, KV header or bell is waiting (its envelope in `st`). Not any
        tag: a data piece whose receive is not posted yet must not be taken for one. The control
        tag is probed again last: MPICH's `Iprobe` looks among the messages it has taken in before
        it makes progress, so one that arrived while this thread slept is taken in by a first probe
        and seen only by a second (without it, a message to a sleeping rank waited a whole extra
        pause, up to IDLE_MAX_S)."""
        probe, any_src = self.comm.Iprobe, self.MPI.ANY_SOURCE
        return any(probe(source=any_src, tag=tag, status=st) for tag in (TAG_CTRL, TAG_KV_HEAD, TAG_BELL, TAG_CTRL))

    def _poll_incoming(self) -> bool:
        MPI, st, got = self.MPI, self.MPI.Status(), False
        while self._probe(st):
            src, tag, got = st.Get_source(), st.Get_tag(), True
            raw = bytearray(st.Get_count(MPI.BYTE))
            self.comm.Recv([raw, MPI.BYTE], source=src, tag=tag)
            if tag == TAG_BELL:  # rung while our bell's receive was taken: its message is probed anyway
                continue
            msg = pickle.loads(raw)
            if isinstance(msg, _WaitInsideMpi):
                self._wait_from_now(f"rank {src}, which receives our KV, found")
                continue
            if tag == TAG_CTRL:
                self._inbox.put((src, msg))
                continue
            entry = [msg, None, 0]
            if isinstance(getattr(msg, "kv", None), _Shape):  # its pieces, received in order as they are posted
                entry[1], step = self.pool.take(msg.kv.nbytes), msg.kv.chunk
                todo = self._to_post.setdefault(src, collections.deque())
                for i in range(0, entry[1].size, step):
                    todo.append((entry, entry[1][i:i + step]))
                    entry[2] += 1
            self._assembly.setdefault(src, collections.deque()).append(entry)
        got |= self._post_receives()
        if self._recv_reqs:
            got |= self._received(MPI.Request.Testsome(self._recv_reqs) or [])
        for src, pending in self._assembly.items():  # deliver in order, per source
            while pending and pending[0][2] == 0:
                head, buf, _ = pending.popleft()
                if buf is not None:
                    head = dataclasses.replace(head, kv=buf.view(head.kv.dtype).reshape(head.kv.shape))
                self._inbox.put((src, head))
                got = True
        return got

    def _post_receives(self) -> bool:
        """Post the next data receives of each source, up to `window` outstanding per source."""
        posted = False
        for src, todo in self._to_post.items():
            while todo and self._posted[src] < self.window:
                entry, buf = todo.popleft()
                self._recv_reqs.append(self.comm.Irecv([buf, self.MPI.BYTE], source=src, tag=TAG_KV_DATA))
                self._recv_of.append((entry, src))
                self._posted[src] += 1
                posted = True
        return posted

    def _received(self, done: list[int]) -> bool:
        """Account for completed data receives (indices into `_recv_reqs`) and post the next ones."""
        for i in done:
            entry, src = self._recv_of[i]
            entry[2] -= 1
            self._posted[src] -= 1
        for i in sorted(done, reverse=True):
            del self._recv_reqs[i], self._recv_of[i]
        if done:
            self._post_receives()
            self._piece_received()
        return bool(done)

    def _piece_received(self) -> None:
        """A KV piece was received. A rank that polls between pauses waits inside MPI from now on if
        this is the STALLS_TO_WAIT-th piece in a row that needed over STALLED_POLLS polls (one such
        piece is a busy peer, several are MPI moving bytes only inside its calls), and so do the
        ranks that send it KV: they are told."""
        self._stalls = self._stalls + 1 if self._stalled > STALLED_POLLS else 0
        self._stalled = 0
        if self._stalls >= STALLS_TO_WAIT and not MpiTransport.waits_inside_mpi:
            self._wait_from_now("its receives found")
            for src in self._assembly:
                self._post(src, TAG_CTRL, _WaitInsideMpi())

    def _wait_from_now(self, who: str) -> None:
        if not MpiTransport.waits_inside_mpi:
            MpiTransport.waits_inside_mpi = True
            log.info("rank %d: %s that KV moves only while MPI is called (no single-copy transfers): its progress "
                     "thread waits inside MPI while KV is in flight", self.rank, who)

    def _post(self, dst: int, tag: int, msg) -> None:
        """Send a pickled message, then ring `dst`'s bell (it may be waiting inside MPI)."""
        raw = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)
        for buf, t in ((raw, tag), (b"", TAG_BELL)):
            self._send_reqs.append(self.comm.Isend([buf, self.MPI.BYTE], dest=dst, tag=t))
            self._send_keep.append(buf)
        self.sent_bytes["control"] += len(raw)

    def _push_outgoing(self) -> bool:
        with self._lock:
            ctrl = list(self._ctrl) if self.priority else []
            if ctrl:
                self._ctrl.clear()
            elif not self.priority and self._ctrl and not self._outstanding:  # one lane: after the KV before
                ctrl = [self._ctrl.popleft()]
            start = self._kv.popleft() if self.priority and self._kv and self._outstanding < KV_AHEAD else None
            # a bulk message counts in the backlog until posted (KV: then in `_outstanding` until its pieces are sent)
            handed = start is not None or not self.priority and bool(ctrl) and getattr(ctrl[0][1], "bulk", False)
            self._starting = handed
        moved = bool(ctrl)
        for dst, msg in ctrl:
            if isinstance(msg, LayerKV):  # FIFO lane: KV waits its turn like everything else
                start = (dst, msg)
                break
            self._post(dst, TAG_KV_HEAD if getattr(msg, "bulk", False) else TAG_CTRL, msg)
        if start is not None:
            dst, msg = start
            if isinstance(msg, LayerKV):
                self._start_kv(dst, msg)
            else:
                self._post(dst, TAG_KV_HEAD, msg)  # bulk, in order with the KV
            moved = True
        if handed:  # posted, or (KV) its pieces handed to MPI: the backlog counts it in `_outstanding` now
            with self._lock:
                self._starting = False
                self._handed.notify_all()
        return moved

    def _start_kv(self, dst: int, msg: LayerKV) -> None:
        """A header with the array's shape, then every piece of its bytes handed to MPI (the receiver
        posts their receives as it goes: it sets the pace)."""
        kv, pieces = msg.kv, []
        rows = _byte_rows(kv)
        if rows is None:  # contiguous (or made so): plain byte ranges
            flat = np.ascontiguousarray(kv).reshape(-1).view(np.uint8)
            step = self.chunk_bytes
            pieces = [([flat[i:i + step], self.MPI.BYTE], flat) for i in range(0, flat.size, step)]
        else:  # rows of `width` bytes, `stride` apart (a layer of Full Blocks): datatypes, no copy
            n, width, stride, addr = rows
            per = max(1, self.chunk_bytes // width)
            step = per * width
            for r in range(0, n, per):
                m = min(per, n - r)
                buf = self.MPI.buffer.fromaddress(addr + r * stride, (m - 1) * stride + width, readonly=True)
                pieces.append(([buf, 1, self._strided(m, width, stride)], kv))
        head = dataclasses.replace(msg, kv=_Shape(tuple(kv.shape), kv.dtype, step))
        self._post(dst, TAG_KV_HEAD, head)
        left = [len(pieces)]  # pieces of this message not sent yet
        for spec, keep in pieces:  # (MPI buffer spec, the array it reads)
            self._send_reqs.append(self.comm.Isend(spec, dest=dst, tag=TAG_KV_DATA))
            self._send_keep.append((keep, left))
        if pieces:
            with self._lock:
                self._outstanding += 1
        self.sent_bytes["kv"] += kv.nbytes

    def _strided(self, rows: int, width: int, stride: int):
        key = (rows, width, stride)
        if key not in self._types:
            self._types[key] = self.MPI.BYTE.Create_hvector(rows, width, stride).Commit()
        return self._types[key]

    def _reap_sends(self) -> bool:
        return bool(self._send_reqs) and self._sent(self.MPI.Request.Testsome(self._send_reqs) or [])

    def _sent(self, done: list[int]) -> bool:
        """Account for completed sends (indices into `_send_reqs`)."""
        through = 0  # KV messages whose last piece this was
        for i in done:
            if isinstance(self._send_keep[i], tuple):  # a data piece: (the array it reads, pieces left)
                left = self._send_keep[i][1]
                left[0] -= 1
                through += left[0] == 0
        for i in sorted(done, reverse=True):
            del self._send_reqs[i], self._send_keep[i]
        if through:
            with self._lock:
                self._outstanding -= through
                self._handed.notify_all()
        return bool(done)


def _byte_rows(kv: np.ndarray):
    """(rows, row bytes, stride, address) when `kv` is rows of contiguous bytes a fixed stride
    apart but not contiguous as a whole (e.g. one layer of several Full Blocks); else None."""
    if kv.flags.c_contiguous or kv.ndim < 2 or kv.size == 0:
        return None
    try:
        rows = np.reshape(kv, (kv.shape[0], -1), copy=False)
    except ValueError:
        return None
    width = rows.shape[1] * rows.itemsize
    if rows.strides[1] != rows.itemsize or rows.strides[0] < width:
        return None
    return rows.shape[0], width, rows.strides[0], rows.__array_interface__["data"][0]


@dataclasses.dataclass(frozen=True)
class _WaitInsideMpi:
    """From a rank that found its KV moving only inside MPI calls to the ranks sending it KV."""


@dataclasses.dataclass(frozen=True)
class _Shape:
    """Shape and dtype of a KV array in flight: stands in for the array in the pickled header."""

    shape: tuple
    dtype: np.dtype
    chunk: int  # bytes per data message (the last may be shorter)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize
