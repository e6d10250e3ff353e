"""The simulator's resources: links, buffers, nodes, and what compute costs.

`FifoLink` serves bytes first come, first served (storage NICs, host DRAM), `DepthLink` at a rate that
grows with the reads outstanding (a storage NIC with a queue-depth curve); `Lane` is one
direction of a GPU's compute NIC, where KV (low priority) gets what model traffic (expert-parallel
all-to-all, high priority) leaves; `Buffer` is a byte budget whose reservations wait FIFO for
room (host buffers, and a PE's device memory for KV); `Node` holds a node's storage NIC, DRAM,
buffer and what it read per time window; `Costs` turns a hardware profile and a model into
seconds of prefill passes, decode steps and the device memory left for KV.
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque

import numpy as np

from dualjax.core.batching import AttentionFit
from dualjax.sim.profiles import Hardware, ModelCost
from models.buckets import DEFAULT_BUCKETS


class SimError(ValueError):
    pass


def latest(a: float, b: float, c: float) -> float:
    """max(a, b, c): the end of a transfer over three resources. The builtin costs several times these
    comparisons in CPython 3.11, on paths taken a few times per request."""
    if b > a:
        a = b
    return c if c > a else a


class FifoLink:
    """A first-come first-served link: a transfer starts when the link frees and takes bytes/rate, in the
    order reserved (one reserved to start later holds the link from then; later reservations follow it).
    `reserve` returns the transfer's end; `start` holds the last one's start."""

    __slots__ = ("rate", "free", "free_at", "bytes", "busy_s", "start")

    def __init__(self, rate: float):
        self.rate, self.free_at, self.bytes, self.busy_s, self.start = rate, 0.0, 0.0, 0.0, 0.0
        self.free = math.isinf(rate)  # transfers take no time

    def reserve(self, t: float, nbytes: float) -> float:
        self.bytes += nbytes
        if self.free or nbytes == 0:
            self.start = t
            return t
        self.start = start = t if t > self.free_at else self.free_at
        self.free_at = end = start + nbytes / self.rate
        self.busy_s += end - start
        return end


class DepthLink(FifoLink):
    """A storage NIC whose throughput grows with the reads outstanding on it (the queue depth), as a
    storage system's does until its devices and network are busy: a read that finds k - 1 others
    outstanding (k with it) is served, FIFO, at rate * k / (k + half), `rate` being the saturated rate.
    A read's rate is fixed when it is queued: later reads do not re-time it. Equal reads queued
    together therefore end with the last one when they would if every read were re-timed as the queue
    drains (the depths k = 1 .. N are the same, in the other order)."""

    __slots__ = ("half", "ends")

    def __init__(self, rate: float, half: float):
        if half < 0:
            raise SimError(f"snic_depth_half is the reads outstanding at half the storage rate: >= 0, not {half}")
        super().__init__(rate)
        self.half, self.ends = half, deque()  # ends of the reads queued, in order (FIFO: ascending)

    def reserve(self, t: float, nbytes: float) -> float:
        self.bytes += nbytes
        if self.free or nbytes == 0:
            self.start = t
            return t
        ends = self.ends
        while ends and ends[0] <= t:
            ends.popleft()
        k = len(ends) + 1
        self.start = start = t if t > self.free_at else self.free_at
        self.free_at = end = start + nbytes * (k + self.half) / (self.rate * k)
        self.busy_s += end - start
        ends.append(end)
        return end


class Lane:
    """One direction of a compute NIC (tx: out of memory, rx: into memory; a loopback uses both).

    Model traffic (EP dispatch/combine) is a utilisation the owning engine sets for the duration
    of a pass or a decode step (`carry_model`). With priority (docs/paper.md §6) a KV transfer gets the rest
    of the line, at least `1 - share` of it (model traffic gets `share` under contention); without, model
    and KV traffic split the line evenly while both are active. KV is served FIFO at the rate in
    force when it is queued (`kv_rate`; a fluid approximation: later changes of the model load do not
    re-time transfers already queued)."""

    __slots__ = ("rate", "free", "priority", "least", "kv_rate", "free_at", "bytes")

    def __init__(self, rate: float, priority: bool = True, share: float = 0.99):
        self.rate, self.priority = rate, priority
        self.least = 1.0 - share if priority else 0.5  # the least share of the line KV gets under model traffic
        self.kv_rate = rate  # what KV queued now gets: the line while no model traffic runs
        self.free_at, self.bytes = 0.0, 0.0
        self.free = math.isinf(rate)  # transfers take no time

    def model_rate(self, now: float) -> float:
        """The rate model traffic gets now: the line, or half of it while KV is queued without priority."""
        return self.rate if self.priority or self.free_at <= now else self.rate / 2

    def reserve(self, t: float, nbytes: float) -> float:
        """The end of a KV transfer of `nbytes` queued at `t`."""
        self.bytes += nbytes
        if self.free or nbytes == 0:
            return t
        start = t if t > self.free_at else self.free_at
        self.free_at = end = start + nbytes / self.kv_rate
        return end


def model_line_rate(tx: Lane, rx: Lane, now: float) -> float:
    """The rate a GPU's model traffic (its EP all-to-all, both ways) gets over its compute NIC now: the line
    with priority, else the slower direction's (`Lane.model_rate`)."""
    if tx.priority:
        return tx.rate  # both directions run at one rate
    t, r = tx.model_rate(now), rx.model_rate(now)
    return t if t < r else r


def carry_model(tx: Lane, rx: Lane, util: float) -> None:
    """Model traffic takes `util` of both directions of a compute NIC from now on (0: none): KV gets what it
    leaves, at least 1 - share of the line (priority) or half (an even split)."""
    if not util:
        tx.kv_rate, rx.kv_rate = tx.rate, rx.rate
        return
    left = 1.0 - util
    tx.kv_rate = tx.rate * (left if left > tx.least else tx.least)
    rx.kv_rate = rx.rate * (left if left > rx.least else rx.least)


class Buffer:
    """A byte budget (a host buffer, a PE's device memory for KV): reservations wait FIFO for room, as in
    `dualjax.runtime.buffers`. A budget of None is no buffer at all (free I/O: nothing passes through host
    memory): every reservation goes through at once and nothing is held."""

    __slots__ = ("budget", "used", "peak", "waiting", "name")

    def __init__(self, name: str, budget: float | None):
        self.name, self.budget, self.used, self.peak, self.waiting = name, budget, 0.0, 0.0, deque()

    @property
    def free(self) -> float:
        return math.inf if self.budget is None else self.budget - self.used

    def take(self, nbytes: float) -> None:
        """Take `nbytes` that the caller has checked fit (no wait)."""
        if self.budget is None:
            return
        self.used += nbytes
        if self.used > self.peak:
            self.peak = self.used

    def reserve(self, nbytes: float, then, *args) -> None:
        """Take `nbytes`, then call then(*args): now if they fit and nothing waits, else once released."""
        if self.budget is None:
            then(*args)
            return
        if nbytes > self.budget:
            raise SimError(f"a request needs {nbytes / 1e9:.2f} GB of {self.name} buffer, more than its "
                           f"{self.budget / 1e9:.2f} GB budget")
        if self.waiting or self.used + nbytes > self.budget:
            self.waiting.append((nbytes, then, args))
            return
        self.used += nbytes
        if self.used > self.peak:
            self.peak = self.used
        then(*args)

    def release(self, nbytes: float) -> None:
        if self.budget is None:
            return
        self.used -= nbytes
        while self.waiting and self.used + self.waiting[0][0] <= self.budget:
            nbytes, then, args = self.waiting.popleft()
            self.used += nbytes
            if self.used > self.peak:
                self.peak = self.used
            then(*args)


class Node:
    __slots__ = ("id", "role", "snic", "dram", "buffer", "window", "series", "kv_sent_bytes", "write_bytes")

    def __init__(self, id: int, role: str, hw: Hardware, window: float):
        self.id, self.role, self.window = id, role, window
        snic = math.inf if hw.free_io else hw.snic_bytes_per_s * hw.snic_efficiency
        self.snic = DepthLink(snic, hw.snic_depth_half) if hw.snic_depth_half else FifoLink(snic)
        self.dram = FifoLink(math.inf if hw.free_io else hw.dram_bytes_per_s)
        # free I/O (Oracle): no KV passes through host memory, so no buffer holds, bounds or delays it
        self.buffer = Buffer(f"{'PE' if role == 'prefill' else 'DE'} node {id}", None if hw.free_io else
                             hw.pe_buffer_bytes if role == "prefill" else hw.de_buffer_bytes)
        self.series: list[float] = []  # storage bytes read per window
        self.kv_sent_bytes = self.write_bytes = 0.0

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
    """Seconds of prefill passes and decode steps, and device memory, from a hardware profile and a model.
    `attention(cached, new)` is what a PE packs with under the compute quota (the predicted attention-layer
    time, docs/paper.md §7), `row(cached, new)` a row's whole prefill time and `pass_seconds` what a pass
    then takes. On a measured profile both come from the runtime's own `AttentionFit` (`prefill_fit`), so
    the simulator packs as the runtime does; a fit with a = 0 predicts no attention time, and the quota
    never binds. Else from the model's FLOPs: attention (and the indexer) without the linear layers."""

    def __init__(self, hw: Hardware, model: ModelCost, decode_capacity: int, pe_ep: int = 1, de_ep: int = 1):
        self.hw, self.model, self.capacity = hw, model, decode_capacity
        self.pe_ep, self.de_ep = pe_ep, de_ep
        self.rate = hw.flops_per_s * hw.efficiency
        if hw.prefill_fit is not None:
            fit = AttentionFit(*hw.prefill_fit)
            self.row, self.attention = fit.predict, fit.attention
        else:
            self.row = model.prefill_seconds(self.rate)
            self.attention = dataclasses.replace(model, linear_flops=0.0).prefill_seconds(self.rate)
        self.table = PassTable(hw.pass_table) if hw.pass_table else None
        # a decode step's terms (`decode_step_s`, on every change of a batch)
        self.de_weights = model.weights_per_gpu(de_ep)  # read by every decode step
        self.fixed_step_s = None if hw.decode_fit is None else hw.decode_fit[0] + hw.decode_fit[1] * decode_capacity
        self.window, self.kv_bytes, self.indexer_bytes = (model.window, model.kv_bytes_per_token,
                                                          model.indexer_bytes_per_token)
        self.linear_flops, self.hbm_rate, self.step_overhead_s = (model.linear_flops, hw.hbm_bytes_per_s,
                                                                  hw.decode_step_overhead_s)

    def efficiency(self, tokens: int) -> float:
        """Fraction of the saturated rate a pass of `tokens` new tokens reaches (1 for a flat profile)."""
        half = self.hw.prefill_half_tokens
        return 1.0 if not half or not tokens else tokens / (tokens + half)

    def pass_seconds(self, rows: list[tuple[int, int]]) -> float:
        """A pass over (cached, new) rows: the table's padded shape on `local`, else the profile's model
        (padded: every row as the longest; ragged: each row its own) at the batch's efficiency."""
        if self.table is None and not self.hw.padded:
            return sum(self.row(c, n) for c, n in rows) / self.efficiency(sum(n for _, n in rows))
        cached, new = max(c for c, _ in rows), max(n for _, n in rows)
        if self.table is None:
            return len(rows) * self.row(cached, new) / self.efficiency(len(rows) * new)
        return self.table(*DEFAULT_BUCKETS.pass_shape(len(rows), cached, new)) * self.hw.prefill_scale

    def one_row_s(self, cached: int, new: int) -> float:
        """A pass of one (cached, new) row: what a PE view's `prefill_s` predicts (docs/policies.md)."""
        return self.pass_seconds([(cached, new)])

    def ep_bytes(self, tokens: float, ep_nodes: int) -> float:
        """Expert-parallel bytes one GPU sends (and receives) over its compute NIC for `tokens` tokens:
        the share routed to experts on other nodes (inside a node they go over NVLink)."""
        return tokens * self.model.ep_bytes_per_token * (ep_nodes - 1) / ep_nodes if ep_nodes > 1 else 0.0

    def decode_step_s(self, batch: int, context: float, ep_s: float = 0.0) -> float:
        """A step of `batch` requests over `context` tokens in all: the HBM roofline (or the compute, if
        longer) overlapped with its EP all-to-all (`ep_s`, dual micro-batches), plus the overhead."""
        if self.fixed_step_s is not None:  # fixed-shape steps: the cost of the slots' capacity
            compute = self.fixed_step_s
        else:
            w = self.window  # positions attended: sparse attention reads at most `window` per request
            visible = batch * w if w and batch * w < context else context
            reads = self.de_weights + visible * self.kv_bytes + context * self.indexer_bytes
            compute, memory = batch * self.linear_flops / self.rate, reads / self.hbm_rate
            if memory > compute:
                compute = memory
        return (compute if compute > ep_s else ep_s) + self.step_overhead_s

    def ep_latency_s(self, ep_gpus: int) -> float:
        """The least a decode step's expert-parallel all-to-all takes over `ep_gpus` GPUs: one dispatch and one
        combine per MoE layer at the latency of the profile's low-latency kernels (`Hardware.ep_latency_us`,
        linear in log2 of the EP size between its points, the nearest point outside them). The two
        micro-batches' all-to-alls overlap each other's compute, so a step waits for one of each per layer."""
        table = self.hw.ep_latency_us
        if not table or ep_gpus <= 1 or not self.model.moe_layers:
            return 0.0
        pts = sorted((math.log2(ep), d + c) for ep, d, c in table)
        return self.model.moe_layers * float(np.interp(math.log2(ep_gpus), *zip(*pts))) * 1e-6

    def _kv_hbm(self, ep: int) -> float:
        return self.hw.hbm_bytes - self.model.weights_per_gpu(ep) - self.hw.hbm_reserve_bytes

    def de_memory_tokens(self) -> float:
        if self.hw.decode_fit is not None:  # as the runtime: every slot holds the workload's longest context
            return (self.hw.decode_batch or 1) * self.capacity
        kv = self._kv_hbm(self.de_ep)
        return kv if math.isinf(kv) else int(kv // self.model.cache_bytes_per_token)

    def pe_memory_bytes(self) -> float:
        """Device memory one PE has for the KV of its passes (weights and activations set aside)."""
        if self.hw.prefill_fit is not None:
            return math.inf
        return self._kv_hbm(self.pe_ep)
