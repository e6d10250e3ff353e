"""Host DRAM buffers (PE buffer, DE buffer): a byte budget that requests reserve and release.

A request that does not fit waits (FIFO) until earlier ones release; it is never dropped. One
larger than the whole budget can never fit and is refused at once with the figure to raise.
"""

from __future__ import annotations

import threading

import numpy as np

from dualjax.core.config import ConfigError


class BufferTooSmall(ConfigError):
    """A buffer budget smaller than one request: the message says which flag to raise."""


class HostBuffer:
    def __init__(self, name: str, budget_bytes: int):
        self.name, self.budget = name, int(budget_bytes)
        self.used = self.peak = 0
        self._cond = threading.Condition()
        self._turn = 0  # FIFO: tickets are served in order
        self._next = 0

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


class RequestKV:
    """One request's prompt KV in host DRAM, kept as Full Blocks `blocks` [nb, L, T, 2, K, H].

    Storage reads land in `blocks` directly; layer messages scatter into it (`write`); the store
    write-back takes its rows as they are; `sequence()` is the [L, S, 2, K, H] view a decode
    cache takes.
    """

    def __init__(self, layout, n_tokens: int):
        self.layout, self.n_tokens = layout, n_tokens
        nb = -(-n_tokens // layout.block_tokens)
        self.blocks = np.zeros((nb, *layout.full_shape), layout.np_dtype)

    @staticmethod
    def nbytes(layout, n_tokens: int) -> int:
        return -(-n_tokens // layout.block_tokens) * layout.block_bytes

    def write(self, layer: int, start: int, kv: np.ndarray) -> None:
        """Tokens [start, start + len(kv)) of `layer`: kv [n, 2, K, H]."""
        T, end = self.layout.block_tokens, start + kv.shape[0]
        if end > self.n_tokens:
            raise ValueError(f"KV for tokens [{start}, {end}) past the request's {self.n_tokens} tokens")
        for b in range(start // T, -(-end // T)):
            lo, hi = max(start, b * T), min(end, (b + 1) * T)
            self.blocks[b, layer, lo - b * T:hi - b * T] = kv[lo - start:hi - start]

    def layer(self, layer: int, stop: int) -> np.ndarray:
        """Tokens [0, stop) of `layer` as one [stop, 2, K, H] array (a copy)."""
        return self.blocks[:, layer].reshape(-1, *self.layout.layer_shape[1:])[:stop]

    def sequence(self) -> np.ndarray:
        """[L, S, 2, K, H] (a copy)."""
        L = self.layout.n_layers
        return np.swapaxes(self.blocks, 0, 1).reshape(L, -1, *self.layout.layer_shape[1:])[:, :self.n_tokens]
