"""Per-host storage NIC model: the read queue the scheduler balances, an optional bandwidth cap.

On one machine every emulated host shares one disk, so per-host storage bandwidth does not exist
physically (docs/architecture.md §5). A `StorageNIC` serialises a host's reads FIFO, paces them to
`cap_bytes_per_s` when set (a link: each read of at most `batch_bytes` is delivered once its
transfer time at the cap has elapsed after the previous one's, across requests; it is read from
the store up to `window` reads ahead of its delivery), and counts what it carried.
Reads really come from the store; only the per-host bandwidth limit is emulated.

A read fetches the Full Blocks of one request into a host buffer, either block-major or
**layer-major** (layer 0 of every block, then layer 1, ...): the same bytes, but layerwise
prefill can start computing layer l as soon as `ticket.wait_layer(l)` returns.

A read may carry a **deadline** (a time of the NIC's clock). It then goes block-major, whole blocks
in prefix order (one a read on a capped link), so that what the deadline keeps is a prefix of whole
blocks; its layers are all ready when it ends or is cut. From the deadline on it issues no further
reads, a read that comes in after it is dropped (its task is waited for, so nothing writes into the
buffer once the ticket is done; the store's pins are released as usual and nothing is marked bad),
and `valid` counts the leading blocks that came in time. An emulated link is held until the
deadline (the block in flight then is lost) and frees after it.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import NamedTuple

import numpy as np

from kvstore.reads import ReadBatch, RequestReads
from kvstore.store import BlockStore

_CAPPED_BATCH = 1 << 20
_LAG_S = 0.05  # within a request, how far the emulated link may run behind the clock and catch up


class _InFlight(NamedTuple):
    """A batch of a request issued to the store: blocks [b0, b1) (`batch`: the read of those before
    a known miss, None when none is), delivered once the emulated link has carried it (`due`)."""

    b0: int
    b1: int
    layers: range
    batch: ReadBatch | None
    due: float


class ReadTicket:
    """Progress of one queued read. `valid` = leading blocks read and checked so far: a bad
    piece makes its block and every later block a miss (they are then not read at all)."""

    def __init__(self, store: BlockStore, hashes: list[str], out: np.ndarray, layer_major: bool, tokens: int,
                 deadline: float | None = None):
        self.store, self.hashes, self.out, self.layer_major, self.tokens = store, list(hashes), out, layer_major, tokens
        self.deadline = deadline  # the NIC's clock; None: none
        self.dropped = 0  # pieces (a block, or a layer of one) abandoned: not read, or read late and dropped
        self.valid = len(hashes)
        self.layers_done = 0
        self._cond = threading.Condition()
        self.error: BaseException | None = None

    def _batches(self, batch_bytes: int, layer_major: bool):
        """(first block, end block, layers) in read order: layer-major or block-major, with
        consecutive blocks grouped up to `batch_bytes` per read."""
        layout, n = self.store.layout, len(self.hashes)
        spans = [range(layer, layer + 1) for layer in range(layout.n_layers)] if layer_major \
            else [range(layout.n_layers)]
        per = max(1, batch_bytes // (layout.layer_bytes * len(spans[0])))
        return [(b, min(b + per, n), layers) for layers in spans for b in range(0, n, per)]

    def wait_layer(self, layer: int, timeout: float | None = None) -> int:
        """Block until `layer` of every still-valid block is in `out`; returns `valid` then."""
        with self._cond:
            if not self._cond.wait_for(lambda: self.layers_done > layer or self.error, timeout):
                raise TimeoutError(f"storage read of layer {layer} did not finish in {timeout} s")
            if self.error:
                raise self.error
            return self.valid

    def wait(self, timeout: float | None = None) -> int:
        """Block until the whole read is done; returns the number of leading valid blocks."""
        return self.wait_layer(self.store.layout.n_layers - 1, timeout)

    def _advance(self, layers_done: int, valid: int) -> None:
        with self._cond:
            self.layers_done, self.valid = max(self.layers_done, layers_done), min(self.valid, valid)
            self._cond.notify_all()

    def _fail(self, e: BaseException) -> None:
        with self._cond:
            self.error = e
            self._cond.notify_all()


class StorageNIC:
    """A host's storage read path. `read(...)` queues a request and returns its `ReadTicket`;
    `read_queue()` is (bytes, tokens) not yet read, counted from submission to completion."""

    def __init__(self, name: str, cap_bytes_per_s: float | None = None, window: int = 8,
                 batch_bytes: int = 16 << 20, clock=time.monotonic):
        if cap_bytes_per_s is not None and cap_bytes_per_s <= 0:
            raise ValueError(f"storage NIC {name}: cap must be positive bytes/s, got {cap_bytes_per_s}")
        self.name, self.cap, self.window, self.batch_bytes = name, cap_bytes_per_s, window, batch_bytes
        self.clock = clock
        self._link_free = 0.0  # when the emulated link has delivered everything issued so far
        self._pending: collections.deque[ReadTicket | None] = collections.deque()
        self._cond = threading.Condition()
        self._closed = False
        self._q_bytes = self._q_tokens = 0
        self._busy_since: float | None = None
        self.busy_s = 0.0
        self.counters = collections.Counter()
        self._t0 = clock()
        self.wall0 = time.time()  # wall-clock time of `series` time 0, to line series up across hosts
        self.series: list[tuple[float, int]] = []  # (seconds since start, cumulative bytes read)
        self._thread = threading.Thread(target=self._run, name=f"snic-{name}", daemon=True)
        self._thread.start()

    def read(self, store: BlockStore, hashes: list[str], out: np.ndarray | None = None, layer_major: bool = False,
             tokens_per_block: int | None = None, deadline: float | None = None) -> ReadTicket:
        """Queue a read of `hashes` into `out` [n, L, T, *record] (allocated when None); `deadline` (this
        NIC's clock): what has not come in by then is abandoned."""
        if out is None:
            out = store.layout.empty(len(hashes))
        tokens = len(hashes) * (tokens_per_block or store.layout.block_tokens)
        ticket = ReadTicket(store, hashes, out, layer_major, tokens, deadline)
        with self._cond:
            if self._closed:  # its thread is gone: the read would wait forever
                raise RuntimeError(f"storage NIC {self.name} is closed")
            if self._busy_since is None:
                self._busy_since = self.clock()
            self._q_bytes += len(hashes) * store.layout.block_bytes
            self._q_tokens += ticket.tokens
            self._pending.append(ticket)
            self._cond.notify()
        if not hashes:
            ticket._advance(store.layout.n_layers, 0)
        return ticket

    def read_queue(self) -> tuple[int, int]:
        with self._cond:
            return self._q_bytes, int(round(self._q_tokens))

    def _account(self, nbytes: int, ntokens: float, read_bytes: int) -> None:
        with self._cond:
            self._q_bytes -= nbytes
            self._q_tokens -= ntokens
            self.counters["bytes_read"] += read_bytes
            self.series.append((self.clock() - self._t0, self.counters["bytes_read"]))
            if not self._pending and self._q_bytes <= 0 and self._busy_since is not None:
                self._q_bytes, self._q_tokens = 0, 0
                self.busy_s += self.clock() - self._busy_since
                self._busy_since = None

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending)
                ticket = self._pending[0]
            if ticket is None:
                return
            try:
                self._serve(ticket)
            except Exception as e:  # noqa: BLE001 - handed to the reader through its ticket
                ticket._fail(e)
            with self._cond:
                self._pending.popleft()
            self._account(0, 0, 0)

    def _serve(self, t: ReadTicket) -> None:
        layout, n = t.store.layout, len(t.hashes)
        inflight: collections.deque[_InFlight] = collections.deque()
        valid, done_per_layer = n, collections.Counter()
        reads = RequestReads(t.store, t.hashes, t.out)
        deadline, cut = t.deadline, False  # cut: the deadline has passed, nothing more is issued

        def collect():
            nonlocal valid
            b0, b1, layers, batch, due = inflight.popleft()
            late = False
            if deadline is not None and batch is not None:  # in by the deadline, or dropped
                while not reads.done(batch) and self.clock() < deadline:
                    time.sleep(0.001)
                late = not reads.done(batch)
            if late:  # wait for it all the same: nothing may write into `out` once the ticket is done
                if batch.fut is not None:
                    batch.fut.result()
                t.dropped += batch.b1 - b0
                ok = []
            else:
                ok = reads.collect(batch) if batch is not None else []
                time.sleep(max(0.0, due - self.clock()))  # in the buffer already; delivered when the link is through
            ok += [False] * (b1 - b0 - len(ok))  # blocks past a known miss, skipped
            if not all(ok):
                valid = min(valid, b0 + ok.index(False))
            piece_bytes = layout.layer_bytes * len(layers)
            self._account(piece_bytes * len(ok), t.tokens / n * len(ok) * len(layers) / layout.n_layers,
                          piece_bytes * sum(ok))
            for layer in layers:
                done_per_layer[layer] += len(ok)
            complete = 0
            while complete < layout.n_layers and done_per_layer[complete] == n:
                complete += 1
            t._advance(complete, valid)

        # Uncapped: few large reads. Capped: at most 1 MiB per read, so pacing stays fine-grained at
        # the few MB/s an emulated storage NIC runs at. A capped read is issued up to `window` reads
        # ahead of the emulated link and delivered (progress, accounting) when the link has carried
        # it: this host's CPU being busy elsewhere (a prefill on the same cores) then does not slow
        # the link down, as it would not slow a real NIC's DMA.
        # Uncapped, a layer-major read of blocks not in the page cache goes block by block instead:
        # whole blocks are long runs the disk streams past the page cache (kvstore/preads.py), where a
        # layer's Layer Blocks are short reads a block apart (3.3x as long for `small` on a virtual disk). Its
        # layers are then all ready at the end, no sooner. Capped, the emulated link's order stays.
        try:
            layer_major = t.layer_major and (self.cap is not None or not reads.cold()) and deadline is None
            size = min(self.batch_bytes, _CAPPED_BATCH) if self.cap or deadline is not None else self.batch_bytes
            if deadline is not None and self.cap:  # whole blocks, one a read: the deadline keeps each one in
                size = layout.block_bytes
            batches = t._batches(size, layer_major)
            for i, (b0, b1, layers) in enumerate(batches):
                good = min(max(valid, b0), b1)  # blocks past a known miss are skipped, still accounted for
                if not cut and deadline is not None and good > b0 and self.clock() >= deadline:
                    cut = True
                if cut:  # past the deadline: issued no more
                    t.dropped += good - b0
                    good = b0
                batch, due = None, 0.0
                if good > b0:
                    if self.cap:
                        cost = layout.layer_bytes * len(layers) * (good - b0) / self.cap
                        # the link runs on from where it was, so this host's own time between reads (issuing,
                        # collecting) does not add up read after read; a lag past _LAG_S is idle time, not debt
                        start = max(self._link_free, self.clock() - (_LAG_S if i else 0.0))
                        if deadline is not None and start + cost > deadline:  # it cannot come in time
                            self._link_free = max(self._link_free, deadline)  # held until then
                            t.dropped += good - b0
                            cut = True
                            inflight.append(_InFlight(b0, b1, layers, None, 0.0))
                            continue
                        self._link_free = due = start + cost
                    batch = reads.submit(b0, good, layers)
                inflight.append(_InFlight(b0, b1, layers, batch, due))
                while len(inflight) >= self.window or (inflight and inflight[0].due <= self.clock() and (
                        inflight[0].batch is None or reads.done(inflight[0].batch))):
                    collect()
            while inflight:
                collect()
        finally:
            reads.close()
        t._advance(layout.n_layers, valid)

    def stats(self) -> dict:
        with self._cond:
            busy = self.busy_s + (self.clock() - self._busy_since if self._busy_since is not None else 0.0)
            return {"name": self.name, "cap_bytes_per_s": self.cap, "busy_s": busy, "wall0": self.wall0,
                    "elapsed_s": self.clock() - self._t0, **self.counters}

    def close(self) -> None:
        """Serve what is queued, then stop; a later `read` raises RuntimeError."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._pending.append(None)
            self._cond.notify()
        self._thread.join()
