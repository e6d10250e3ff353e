"""Per-host storage NIC model: the read queue the scheduler balances, an optional bandwidth cap.

On one machine every emulated host shares one disk, so per-host storage bandwidth does not exist
physically (DESIGN.md §5). A `StorageNIC` serialises a host's block reads FIFO, paces them to
`cap_bytes_per_s` when set (a leaky bucket with a one-block burst), and counts what it carried.
Reads really come from the store; only the per-host bandwidth limit is emulated.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import queue
import threading
import time

import numpy as np

from kvstore.store import BlockStore


@dataclasses.dataclass
class _Request:
    store: BlockStore
    hashes: list[str]
    tokens: int
    future: concurrent.futures.Future
    out: np.ndarray


class StorageNIC:
    """A host's storage read path. `read(store, hashes)` returns a future of the leading run of
    readable Full Blocks (a bad block ends the run). `read_queue()` is (bytes, tokens) still to
    be read, counted from submission to completion."""

    def __init__(self, name: str, cap_bytes_per_s: float | None = None, window: int = 8, clock=time.monotonic):
        if cap_bytes_per_s is not None and cap_bytes_per_s <= 0:
            raise ValueError(f"storage NIC {name}: cap must be positive bytes/s, got {cap_bytes_per_s}")
        self.name, self.cap, self.window, self.clock = name, cap_bytes_per_s, window, clock
        self._queue: queue.Queue[_Request | None] = queue.Queue()
        self._lock = threading.Lock()
        self._q_bytes = self._q_tokens = 0
        self._busy_since: float | None = None
        self.busy_s = 0.0
        self.counters = collections.Counter()
        self.series: list[tuple[float, int]] = []  # (time, cumulative bytes read) per block
        self._t0 = clock()
        self._thread = threading.Thread(target=self._run, name=f"snic-{name}", daemon=True)
        self._thread.start()

    def read(self, store: BlockStore, hashes: list[str], tokens_per_block: int | None = None,
             out: np.ndarray | None = None) -> concurrent.futures.Future:
        """Queue a read of `hashes` (into `out` [n, L, T, 2, K, H] when given); the future resolves
        to the leading run of readable blocks (views into `out`)."""
        if out is None:
            out = np.empty((len(hashes), *store.layout.full_shape), store.layout.np_dtype)
        fut: concurrent.futures.Future = concurrent.futures.Future()
        tokens = len(hashes) * (tokens_per_block or store.layout.block_tokens)
        with self._lock:
            if self._q_bytes == 0 and self._busy_since is None:
                self._busy_since = self.clock()
            self._q_bytes += len(hashes) * store.layout.block_bytes
            self._q_tokens += tokens
        self._queue.put(_Request(store, list(hashes), tokens, fut, out))
        return fut

    def read_queue(self) -> tuple[int, int]:
        with self._lock:
            return self._q_bytes, self._q_tokens

    def _done(self, nbytes: int, ntokens: int, read_bytes: int) -> None:
        with self._lock:
            self._q_bytes -= nbytes
            self._q_tokens -= ntokens
            self.counters["bytes_read"] += read_bytes
            self.counters["blocks_read"] += read_bytes > 0
            self.series.append((self.clock() - self._t0, self.counters["bytes_read"]))
            if self._q_bytes == 0 and self._busy_since is not None:
                self.busy_s += self.clock() - self._busy_since
                self._busy_since = None

    def _run(self) -> None:
        next_t = self.clock()
        while (req := self._queue.get()) is not None:
            block_bytes, per_tok = req.store.layout.block_bytes, req.tokens // max(len(req.hashes), 1)
            inflight: collections.deque = collections.deque()
            blocks: list[np.ndarray] = []
            ok = True
            try:
                for i, h in enumerate(req.hashes):
                    if self.cap:
                        next_t = max(next_t, self.clock()) + block_bytes / self.cap
                        time.sleep(max(0.0, next_t - self.clock() - block_bytes / self.cap))
                    inflight.append(req.store.get([h], req.out[i:i + 1])[0])
                    while len(inflight) >= self.window or (inflight and inflight[0].done()):
                        ok = self._collect(inflight.popleft(), ok, blocks, block_bytes, per_tok)
                while inflight:
                    ok = self._collect(inflight.popleft(), ok, blocks, block_bytes, per_tok)
                req.future.set_result(blocks)
            except Exception as e:  # noqa: BLE001 - handed to the caller through its future
                req.future.set_exception(e)

    def _collect(self, fut, ok: bool, blocks: list, block_bytes: int, per_tok: int) -> bool:
        block = fut.result()
        ok = ok and block is not None
        if ok:
            blocks.append(block)
        self._done(block_bytes, per_tok, block_bytes if block is not None else 0)
        return ok

    def stats(self) -> dict:
        with self._lock:
            busy = self.busy_s + (self.clock() - self._busy_since if self._busy_since is not None else 0.0)
            return {"name": self.name, "cap_bytes_per_s": self.cap, "busy_s": busy,
                    "elapsed_s": self.clock() - self._t0, **self.counters}

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()
