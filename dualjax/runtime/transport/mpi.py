"""The MPI transport: a `Sender` and a `Receiver` driven by one progress thread per rank.

* The progress thread makes every MPI call but a bell (below): host threads only queue (`send`)
  and take from an inbox (`recv`). Threads blocked in MPI calls of their own are 10-100x slower
  than one thread making progress for all of them.
* **Back-off.** When nothing moves, the thread pauses between polls, doubling from `BUSY_POLL_S`
  up to `WAIT_MAX_S` while transfers are in flight (the peer is slow: its reads and copies need
  the CPU more than our polling) and `IDLE_MAX_S` with nothing in flight; a local `send` wakes it
  at once, and any movement restarts the pause at its shortest.
* **Probes.** Only the control, header and bell tags are probed (a data piece whose receive is not
  posted yet must not be taken for a message), and the control tag twice: MPICH's `Iprobe` looks
  among the messages it has already taken in before it makes progress, so a message that arrived
  while the thread slept is taken in by a first probe and seen only by a second.
* **Stall rule.** Where MPI moves KV only inside its calls (MPICH's shared memory without
  single-copy CMA, which it turns off under Yama's ptrace_scope >= 1), polling between pauses
  relays about 1/100 of a plain `Send`. `STALLS_TO_WAIT` received pieces in a row that each needed
  over `STALLED_POLLS` polls switch every transport of the process to waiting inside MPI
  (`Waitsome`) while KV is in flight (`MpiTransport.waits_inside_mpi`), and tell the ranks that
  sent them to do the same (they need it as much). Only receives are watched: a sent piece waits
  for its receiver to post it, so its wait says nothing about how MPI moves bytes.
* **Bells.** Every control message and KV header is followed by an empty "bell" message whose
  receive is always posted and in every wait, so a waiting rank still takes in its peers'
  messages (two ranks each waiting for the other to post the receives of its KV would otherwise
  wait forever); a local `send` rings the rank's own bell (MPI_THREAD_MULTIPLE).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pickle
import queue
import threading
import time

from dualjax.runtime.buffers import BufferPool
from dualjax.runtime.messages import LayerKV
from dualjax.runtime.transport.lanes import Transport
from dualjax.runtime.transport.receiver import DEFAULT_WINDOW, Receiver
from dualjax.runtime.transport.sender import DEFAULT_CHUNK_BYTES, Sender
from dualjax.runtime.transport.wire import TAG_BELL, TAG_CTRL, TAG_KV_HEAD, WaitInsideMpi, byte_rows

log = logging.getLogger("dualjax.runtime.transport")

BUSY_POLL_S = 0.00002  # the first pause when nothing moved (MPI copies inside its calls)
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


@dataclasses.dataclass(slots=True)
class StallWatch:
    """How long received pieces take, in polls: the evidence that MPI moves KV only inside calls."""

    polls: int = 0  # idle polls with receives posted since a piece was last received
    stalls: int = 0  # received pieces in a row that took more than STALLED_POLLS polls

    def piece_received(self) -> bool:
        """A piece came in; whether this makes STALLS_TO_WAIT stalled ones in a row (one stalled
        piece is a busy peer, several are MPI moving bytes only inside its calls)."""
        self.stalls = self.stalls + 1 if self.polls > STALLED_POLLS else 0
        self.polls = 0
        return self.stalls >= STALLS_TO_WAIT


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
        self.pool, self.pack_to = pool or BufferPool(), pack_to
        self._sender = Sender(comm, MPI, priority, chunk_bytes, self.sent_bytes)
        self._receiver = Receiver(comm, MPI, window, self.pool)
        self._stall = StallWatch()
        self._inbox: queue.Queue = queue.Queue()
        self._bell = None  # the posted receive of a bell (posted by the progress thread)
        self._bell_buf = bytearray(1)
        self._stop = threading.Event()
        self._wake = threading.Event()  # set by send(): something to push
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"mpi-progress-{self.rank}", daemon=True)
        self._thread.start()

    # -- host threads ------------------------------------------------------------------------------
    def send(self, dst: int, msg) -> None:
        if self._error:
            raise self._error
        if dst == self.rank:
            self._inbox.put((self.rank, msg))
            return
        if dst in self.pack_to and isinstance(msg, LayerKV) and byte_rows(msg.kv) is not None:
            packed = self.pool.take(msg.kv.nbytes).view(msg.kv.dtype).reshape(msg.kv.shape)
            packed[...] = msg.kv
            msg = dataclasses.replace(msg, kv=packed)
        self._sender.queue(dst, msg)
        self._wake_up()

    def _wake_up(self) -> None:
        """Wake the progress thread: from its pause, or, if it waits inside MPI, by ringing our own
        bell (an MPI call from this thread: MPI_THREAD_MULTIPLE)."""
        with self._sender.lock:
            ring = self._sender.waiting
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

    def wait_backlog(self, limit: int) -> None:
        """Block until fewer than `limit` bulk messages are queued or in flight (`Sender.backlog`),
        woken as each goes through (and every 0.1 s, to surface a progress-thread error): a sender
        that keeps a few layers ahead of the link without polling."""
        if limit < 1:
            raise ValueError(f"wait_backlog: limit must be at least 1, got {limit}")
        s = self._sender
        with s.lock:
            while s.backlog() >= limit:
                if self._error:
                    raise self._error
                s.handed.wait(0.1)

    def abort(self, text: str) -> None:
        self.comm.Abort(1)

    def close(self) -> None:
        """Flush what was sent, then stop the progress thread."""
        while not self._error and not self._sender.idle():
            time.sleep(0.001)
        self._stop.set()
        self._wake_up()
        self._thread.join()
        self._sender.free()

    # -- the progress thread ---------------------------------------------------------------------
    def _run(self) -> None:
        pause, s, r = BUSY_POLL_S, self._sender, self._receiver
        try:
            self._post_bell()
            while not self._stop.is_set():
                busy = self._poll_incoming()
                busy |= s.push()
                busy |= s.reap()
                if busy:
                    pause = BUSY_POLL_S
                    continue
                in_flight = bool(r.receives.requests or s.outstanding)
                if in_flight and MpiTransport.waits_inside_mpi:
                    self._wait_inside_mpi()
                    pause = BUSY_POLL_S
                    continue
                self._stall.polls += bool(r.receives.requests)
                # Nothing moved: back off (a rank spinning here takes the core its peer needs to read
                # and copy), the longer the less is in flight; a local send wakes us at once.
                pause = min(2 * pause, WAIT_MAX_S if in_flight or s.sends.requests else IDLE_MAX_S)
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
        s, r = self._sender, self._receiver
        with s.lock:
            if s.pushable():
                return  # queued since the push, and it can go now: push it first
            s.waiting = True
        recvs, sends = r.receives.requests, s.sends.requests
        nr, ns = len(recvs), len(sends)
        try:
            done = self.MPI.Request.Waitsome(recvs + sends + [self._bell]) or []
        finally:
            with s.lock:
                s.waiting = False
        self._received([i for i in done if i < nr])
        s.completed([i - nr for i in done if nr <= i < nr + ns])
        if nr + ns in done:
            self._post_bell()

    def _probe(self, st) -> bool:
        """Whether a control message, KV header or bell is waiting (its envelope in `st`); the
        control tag twice (module docstring)."""
        probe, any_src = self.comm.Iprobe, self.MPI.ANY_SOURCE
        return any(probe(source=any_src, tag=tag, status=st) for tag in (TAG_CTRL, TAG_KV_HEAD, TAG_BELL, TAG_CTRL))

    def _poll_incoming(self) -> bool:
        """Take in what arrived (control to the inbox, headers to the receiver), post and test the
        receiver's data receives, deliver what is complete; whether anything moved."""
        MPI, st, got, r = self.MPI, self.MPI.Status(), False, self._receiver
        while self._probe(st):
            src, tag, got = st.Get_source(), st.Get_tag(), True
            raw = bytearray(st.Get_count(MPI.BYTE))
            self.comm.Recv([raw, MPI.BYTE], source=src, tag=tag)
            if tag == TAG_BELL:  # rung while our bell's receive was taken: its message is probed anyway
                continue
            msg = pickle.loads(raw)
            if isinstance(msg, WaitInsideMpi):
                self._wait_from_now(f"rank {src}, which receives our KV, found")
            elif tag == TAG_CTRL:
                self._inbox.put((src, msg))
            else:
                r.expect(src, msg)
        got |= r.post()
        if r.receives.requests:
            got |= self._received(MPI.Request.Testsome(r.receives.requests) or [])
        return r.deliver(self._inbox) or got

    def _received(self, done: list[int]) -> bool:
        """Completed receives (indices into the receiver's requests); a rank that polls between
        pauses waits inside MPI from now on once the stall rule says so, and tells the ranks that
        send it KV."""
        if not self._receiver.completed(done):
            return False
        if self._stall.piece_received() and not MpiTransport.waits_inside_mpi:
            self._wait_from_now("its receives found")
            for src in self._receiver.sources():
                self._sender.post(src, TAG_CTRL, WaitInsideMpi())
        return True

    def _wait_from_now(self, who: str) -> None:
        if not MpiTransport.waits_inside_mpi:
            MpiTransport.waits_inside_mpi = True
            log.info("rank %d: %s that KV moves only while MPI is called (no single-copy transfers): its progress "
                     "thread waits inside MPI while KV is in flight", self.rank, who)
