"""Host DRAM buffers (PE buffer, DE buffer): a byte budget that requests reserve and release.

A request that does not fit waits (FIFO) until earlier ones release; it is never dropped. One
larger than the whole budget can never fit and is refused at once with the figure to raise.
`BufferPool` recycles memory by size class: the transports' receive buffers, and each host
buffer's memory (`HostBuffer.pool`, up to its budget), which a request's `RequestKV` takes and
gives back once dropped. Memory new to the process faults in a page per 4 KiB on first touch,
reused memory does not (`bench dataplane` times a store read into new memory beside one into
reused memory: `store_fresh_vs_raw` against `store_vs_raw`). Every buffer here is
page-aligned (`aligned_empty`): XLA's CPU client then aliases a host array instead of copying it
(`jax.device_put` of a layer is free on CPU), and accelerators' DMA engines move page-aligned host
memory fastest.
"""

from __future__ import annotations

import sys
import threading

import numpy as np

from dualjax.core.config import ConfigError
from kvstore.layout import ALIGN, aligned_empty, aligned_view


class BufferTooSmall(ConfigError):
    """A buffer budget smaller than one request: the message says which flag to raise."""


class HostBuffer:
    def __init__(self, name: str, budget_bytes: int):
        self.name, self.budget = name, int(budget_bytes)
        self.used = self.peak = 0
        self._cond = threading.Condition()
        self._turn = 0  # FIFO: tickets are served in order
        self._next = 0
        self.pool = BufferPool(keep_bytes=self.budget)  # the memory itself, reused request to request

    def check_fits(self, nbytes: int) -> None:
        if nbytes > self.budget:
            raise BufferTooSmall(f"{self.name} buffer of {self.budget / 2**20:.2f} MiB cannot hold one request of "
                                 f"{nbytes / 2**20:.2f} MiB; raise --{self.name.lower()}-buffer-mb")

    def reserve(self, nbytes: int, stop: threading.Event | None = None) -> bool:
        """Wait (FIFO) until `nbytes` fit, then take them. False if `stop` was set meanwhile."""
        self.check_fits(nbytes)
        with self._cond:
            ticket, self._next = self._next, self._next + 1
            while not (ticket == self._turn and self.used + nbytes <= self.budget):
                if stop is not None and stop.is_set():
                    return False
                self._cond.wait(0.05)
            self.used += nbytes
            self.peak = max(self.peak, self.used)
            self._turn += 1
            self._cond.notify_all()
            return True

    def release(self, nbytes: int) -> None:
        with self._cond:
            self.used -= nbytes
            self._cond.notify_all()


class BufferPool:
    """Buffers by power-of-two size class (receive buffers, a host buffer's memory), reused once
    nothing references them.

    `take(nbytes)` returns a uint8 view of a pooled buffer; every array derived from it keeps the
    buffer alive, and the buffer is handed out again only when the CPython reference count says
    no view of it is left (so a receiver may keep a delivered array as long as it likes). At most
    `keep_bytes` are pooled; past that, buffers are plain allocations freed as usual. Any thread
    may take (a lock serialises takers) or drop views.
    """

    def __init__(self, keep_bytes: int = 1 << 30, min_bytes: int = 1 << 16):
        self.keep_bytes, self.min_bytes = keep_bytes, min_bytes
        self.pooled = 0
        self.hits = self.misses = 0
        self._classes: dict[int, list[np.ndarray]] = {}
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> np.ndarray:
        """A page-aligned uint8 array of `nbytes`, reused when a free one of its size class exists."""
        size = max(self.min_bytes, 1 << max(nbytes - 1, 0).bit_length())
        with self._lock:
            owners = self._classes.setdefault(size, [])  # each over-allocated by ALIGN; views' base is the owner
            for owner in owners:
                if sys.getrefcount(owner) <= _FREE_REFS:  # the list, the loop variable, getrefcount's argument
                    self.hits += 1
                    return aligned_view(owner, nbytes)
            self.misses += 1
            owner = np.empty(size + ALIGN, np.uint8)
            if self.pooled + size <= self.keep_bytes:
                owners.append(owner)
                self.pooled += size
            return aligned_view(owner, nbytes)

    def copy(self, a: np.ndarray) -> np.ndarray:
        """`a` copied into a pooled buffer (same shape and dtype, C order)."""
        out = self.take(a.nbytes).view(a.dtype).reshape(a.shape)
        np.copyto(out, a)
        return out


_FREE_REFS = 3


class RequestKV:
    """One request's prompt KV in host DRAM: `blocks` [nb, L, T, *record] (Full Blocks) is a view
    of memory laid out layer-major, [L, nb, T, *record], so one layer of all blocks is contiguous.

    Storage reads land in `blocks` directly (TensorStore writes any strided array); layer messages
    go into it (`write`); the store write-back takes its rows; `layer()` (what a PE computes over
    and what a DE relays) and `sequence()` (what a decode cache takes) are views, not gathers.
    """

    def __init__(self, layout, n_tokens: int, pool: BufferPool | None = None):
        """Zeroed memory of its own, or memory from `pool` (a host buffer's) whose every token is
        written before it is read: only the padding past `n_tokens` is zeroed."""
        self.layout, self.n_tokens = layout, n_tokens
        nb, T = -(-n_tokens // layout.block_tokens), layout.block_tokens
        shape = (layout.n_layers, nb, T, *layout.record_shape)
        nbytes = int(np.prod(shape)) * layout.np_dtype.itemsize  # page-aligned: a layer goes to a CPU device uncopied
        pooled = pool is not None and nbytes > 0
        mem = pool.take(nbytes) if pooled else aligned_empty(nbytes, zero=True)
        self.by_layer = mem.view(layout.np_dtype).reshape(shape)
        if pooled:
            self.by_layer[:, -1, n_tokens - (nb - 1) * T:] = 0
        self.blocks = np.swapaxes(self.by_layer, 0, 1)  # [nb, L, T, *record], a view

    @staticmethod
    def nbytes(layout, n_tokens: int) -> int:
        return -(-n_tokens // layout.block_tokens) * layout.block_bytes

    def _tokens(self, layer: int) -> np.ndarray:
        return self.by_layer[layer].reshape(-1, *self.layout.record_shape)  # a view: the layer is contiguous

    def write(self, layer: int, start: int, kv: np.ndarray) -> None:
        """Tokens [start, start + len(kv)) of `layer`: kv [n, *record]."""
        end = start + kv.shape[0]
        if end > self.n_tokens:
            raise ValueError(f"KV for tokens [{start}, {end}) past the request's {self.n_tokens} tokens")
        self._tokens(layer)[start:end] = kv

    def layer(self, layer: int, stop: int) -> np.ndarray:
        """Tokens [0, stop) of `layer` as one [stop, *record] array: a view of the buffer, valid
        while it is (copy it before the request's buffer room is released)."""
        return self._tokens(layer)[:stop]

    def layer_view(self, layer: int, blocks: int) -> np.ndarray:
        """Layer `layer` of the first `blocks` Full Blocks, [blocks, T, *record]: a contiguous view
        (the transport sends it as it lies)."""
        return self.by_layer[layer, :blocks]

    def sequence(self) -> np.ndarray:
        """[L, S, *record], a view."""
        return self.by_layer.reshape(self.layout.n_layers, -1, *self.layout.record_shape)[:, :self.n_tokens]

