"""The simulator's resources: links, host buffers, nodes, and what compute costs.

`FifoLink` serves bytes first come, first served (storage NICs, compute NICs, host DRAM);
`Buffer` is a host buffer whose reservations wait FIFO for room; `Node` holds a node's storage
NIC, DRAM, buffer and what it read per time window; `Costs` turns a hardware profile and a model
into seconds of prefill rows, decode steps and the device memory left for KV.
"""

from __future__ import annotations

import math
from collections import deque

from dualjax.sim.profiles import Hardware, ModelCost
from models.buckets import DEFAULT_BUCKETS


class SimError(ValueError):
    pass


class FifoLink:
    """A first-come first-served link: a transfer starts when the link frees and takes bytes/rate."""

    __slots__ = ("rate", "free_at", "bytes", "busy_s")

    def __init__(self, rate: float):
        self.rate, self.free_at, self.bytes, self.busy_s = rate, 0.0, 0.0, 0.0

    def reserve(self, t: float, nbytes: float) -> tuple[float, float]:
        self.bytes += nbytes
        if math.isinf(self.rate) or nbytes == 0:
            return t, t
        start = max(t, self.free_at)
        self.free_at = start + nbytes / self.rate
        self.busy_s += self.free_at - start
        return start, self.free_at


class Buffer:
    """A host buffer with a byte budget: reservations wait FIFO for room, as in `dualjax.runtime.buffers`."""

    __slots__ = ("budget", "used", "peak", "waiting", "name")

    def __init__(self, name: str, budget: float):
        self.name, self.budget, self.used, self.peak, self.waiting = name, budget, 0.0, 0.0, deque()

    def reserve(self, nbytes: float, then) -> None:
        if nbytes > self.budget:
            raise SimError(f"a request needs {nbytes / 1e9:.2f} GB of {self.name} buffer, more than its "
                           f"{self.budget / 1e9:.2f} GB budget")
        if self.waiting or self.used + nbytes > self.budget:
            self.waiting.append((nbytes, then))
            return
        self.used += nbytes
        self.peak = max(self.peak, self.used)
        then()

    def release(self, nbytes: float) -> None:
        self.used -= nbytes
        while self.waiting and self.used + self.waiting[0][0] <= self.budget:
            nbytes, then = self.waiting.popleft()
            self.used += nbytes
            self.peak = max(self.peak, self.used)
            then()


class Node:
    __slots__ = ("id", "role", "snic", "dram", "buffer", "window", "series", "relay_bytes", "write_bytes", "busy_s")

    def __init__(self, id: int, role: str, hw: Hardware, window: float):
        self.id, self.role, self.window = id, role, window
        self.snic, self.dram = FifoLink(hw.snic_bytes_per_s), FifoLink(hw.dram_bytes_per_s)
        self.buffer = Buffer(f"{'PE' if role == 'prefill' else 'DE'} node {id}",
                             hw.pe_buffer_bytes if role == "prefill" else hw.de_buffer_bytes)
        self.series: list[float] = []  # storage bytes read per window
        self.relay_bytes = self.write_bytes = self.busy_s = 0.0

    def account_read(self, start: float, end: float, nbytes: float) -> None:
        """Spread a read's bytes over the windows it spans."""
        w = self.window
        first, last = int(start // w), int(end // w)
        if last >= len(self.series):
            self.series.extend([0.0] * (last + 1 - len(self.series)))
        if first == last or end <= start:
            self.series[first] += nbytes
            return
        rate = nbytes / (end - start)
        for k in range(first, last + 1):
            self.series[k] += rate * (min(end, (k + 1) * w) - max(start, k * w))


class PassTable:
    """Measured seconds of padded prefill passes by shape (rows, padded new, padded prefix), as
    `dualjax calibrate` writes them. A shape it did not measure comes from the nearest one it did:
    rows in between interpolate, more rows scale in proportion, and a longer prefix or chunk than
    any measured scales with the padded attention work new * (prefix + new)."""

    def __init__(self, rows: tuple[tuple[int, int, int, float], ...]):
        self.seconds = {(b, t, s): sec for b, t, s, sec in rows}
        self.memo: dict[tuple[int, int, int], float] = {}

    def __call__(self, rows: int, new: int, prefix: int) -> float:
        key = (rows, new, prefix)
        if key not in self.memo:
            self.memo[key] = self._lookup(rows, new, prefix)
        return self.memo[key]

    def _lookup(self, rows: int, new: int, prefix: int) -> float:
        t = _at_least(new, {t for _, t, _ in self.seconds})
        s = _at_least(prefix, {s for _, tt, s in self.seconds if tt == t})
        counts = [b for b, tt, ss in self.seconds if (tt, ss) == (t, s)]
        lo = max((b for b in counts if b <= rows), default=min(counts))
        hi = min((b for b in counts if b >= rows), default=lo)
        if hi == lo:
            sec = self.seconds[lo, t, s] * rows / lo
        else:
            sec = self.seconds[lo, t, s] + (self.seconds[hi, t, s] - self.seconds[lo, t, s]) * (rows - lo) / (hi - lo)
        return sec * max(1.0, new * (prefix + new) / (t * (s + t)))


def _at_least(x: int, measured: set[int]) -> int:
    """The smallest measured value >= x, else the largest."""
    return min((m for m in measured if m >= x), default=max(measured))


class Costs:
    """Seconds of a prefill row / pass and of a decode step, from a hardware profile and a model.
    `predict(cached, new)` is what a PE packs with; `pass_seconds` what a pass then takes."""

    def __init__(self, hw: Hardware, model: ModelCost, decode_capacity: int):
        self.hw, self.model, self.capacity = hw, model, decode_capacity
        self.rate = hw.flops_per_s * hw.efficiency
        if hw.prefill_fit is not None:
            a, b, c = hw.prefill_fit
            self.predict = lambda cached, new: a * new * (cached + new / 2) + b * new + c  # noqa: E731
        else:
            self.predict = model.prefill_seconds(self.rate)
        self.table = PassTable(hw.pass_table) if hw.pass_table else None

    def pass_seconds(self, rows: list[tuple[int, int]]) -> float:
        """A pass over (cached, new) rows: the table's padded shape on `local`, else the profile's model
        (padded: every row as the longest; ragged: each row its own)."""
        if self.table is None and not self.hw.padded:
            return sum(self.predict(c, n) for c, n in rows)
        cached, new = max(c for c, _ in rows), max(n for _, n in rows)
        if self.table is None:
            return len(rows) * self.predict(cached, new)
        return self.table(*DEFAULT_BUCKETS.pass_shape(len(rows), cached, new)) * self.hw.prefill_scale

    def decode_step_s(self, batch: int, context: float) -> float:
        hw, m = self.hw, self.model
        if hw.decode_fit is not None:  # fixed-shape steps: the cost of the slots' capacity
            return hw.decode_fit[0] + hw.decode_fit[1] * self.capacity
        kv = (min(context, batch * m.window) if m.window else context) * m.kv_bytes_per_token
        reads = m.weight_bytes_per_gpu + kv + context * m.indexer_bytes_per_token
        return max(batch * m.linear_flops / self.rate, reads / hw.hbm_bytes_per_s)

    def _kv_hbm(self) -> float:
        return self.hw.hbm_bytes - self.model.weight_bytes_per_gpu - self.hw.hbm_reserve_bytes

    def de_memory_tokens(self) -> float:
        if self.hw.decode_fit is not None:  # as the runtime: every slot holds the workload's longest context
            return (self.hw.decode_batch or 1) * self.capacity
        kv = self._kv_hbm()
        return kv if math.isinf(kv) else int(kv // self.model.kv_bytes_per_token)

    def pe_memory_tokens(self, layerwise: bool) -> float:
        """Tokens of prefix + new KV one PE pass may hold on the GPU (layerwise: one layer at a time)."""
        if self.hw.prefill_fit is not None:
            return math.inf
        return self._kv_hbm() / (self.model.kv_bytes_per_token / (self.model.n_layers if layerwise else 1))
