"""Discrete-event simulation of a DualPath cluster, driven by the runtime's own scheduler and policy.

Nodes hold g engines (one per GPU), all prefill (PE) or all decode (DE). Per node: a storage NIC
(FIFO at its effective read rate, optionally rising with the reads outstanding) whose queue the
scheduler balances, host DRAM (every read and write of the host buffers), and a PE or DE buffer
budget. Per GPU: a full-duplex compute NIC (`Lane` tx and rx) where expert-parallel traffic has
priority over KV, and device memory. Engines of a role form expert-parallel groups
(`Hardware.ep_gpus`). A request flows as in the runtime (docs/paper.md §3):

1. it arrives (agents: offline all at 0, online Poisson; the next turn starts when the previous
   one completes, after an optional think time) and waits in the scheduler's FIFO queue;
2. the scheduler places it (PE, DE, path or plan) exactly as in a real run; the DE buffer takes its
   prompt KV; layerwise, each reading side's storage NIC then reads its share of the hit blocks into
   the PE or DE buffer (a plan's recomputed tail is not read: it is prefill work); Basic waits on its
   PE for a batch to be formed and loaded (`prefill.py`);
3. PEs step in groups and pack passes with the runtime's `batching.pack` (`prefill.py`);
4. the prefill's KV goes to the DE buffer (all but the hit tokens the DE read itself); the first token
   is the PE's, at its last pass's end. Once prefill has ended the KV moves into the DE's HBM, which
   it takes then (prompt + generation tokens, until the last token), waiting in the DE buffer while
   the HBM is full; the DE decodes it in a continuous batch (`decode.py`). What the scheduler counts
   as a DE's free memory, `de_memory`: resident (the HBM held now) or reserved (from placement).

Hits follow the runtime's store (`dualjax.core.lengths.hit_tokens`): a turn hits every full block of the
agent's previous context (prompt + generation - 1 tokens have KV), at most (prompt - 1) // block tokens.
"""

from __future__ import annotations

import gc
import itertools
import math
import time
from array import array
from collections import deque
from heapq import heappop, heappush

import numpy as np
from tqdm import tqdm

from dualjax.core.config import SimConfig
from dualjax.core.lengths import at_block, decode_capacity, hit_tokens, longest_context
from dualjax.core.policies import Policy, get_policy, layerwise_for
from dualjax.core.records import HostStats, SnicStats, StoreStats
from dualjax.core.scheduler import EngineView, RequestView, Scheduler, Thresholds, Waiting
from dualjax.core.sessions import SessionTable
from dualjax.core.streams import stream
from dualjax.sim.deadline import cut_read, hold
from dualjax.sim.decode import DecodeEngine, DecodeSide
from dualjax.sim.prefill import PeGroup, PrefillEngine, PrefillSide, Row
from dualjax.sim.profiles import Hardware, ModelCost
from dualjax.sim.resources import Buffer, Costs, Lane, Node, SimError
from models.buckets import DEFAULT_BUCKETS
from models.presets import PRESETS

PATH_CODES = {"pe": 0, "de": 1, "none": 2, "split": 3}
FLOAT_COLUMNS = ("arrival", "scheduled", "prefill_start", "prefill_end", "first_token", "second_token", "done",
                 "tpot", "load_wait")
INT_COLUMNS = ("agent", "turn", "prompt_tokens", "gen_len", "hit_tokens", "de_tokens", "recomputed_tokens", "pe", "de",
               "path", "restarts")
_TYPECODE = {k: "d" for k in FLOAT_COLUMNS} | {k: "q" for k in INT_COLUMNS}  # float64 and int64, as numpy's


class Columns:
    """The per-request columns, one attribute each: `cols.done[rid]` (an attribute read costs a fraction
    of a dict lookup, and the event loop makes dozens per request)."""

    __slots__ = tuple(_TYPECODE)

    def __init__(self, columns: dict):
        for k, v in columns.items():
            setattr(self, k, v)

    def items(self):
        return ((k, getattr(self, k)) for k in self.__slots__)


def _slowdowns(measured: tuple[float, ...], engines: int) -> list[float]:
    """Slowdown with 0 .. engines - 1 others computing: 1, the measured ones, then linear."""
    if not measured:  # engines have their own compute
        return [1.0] * engines
    out = [1.0, *measured]
    while len(out) < engines:
        out.append(out[-1] + (out[-1] - out[-2]))
    return out


def ep_groups(nodes: int, gpus_per_node: int, ep_gpus: int) -> list[int]:
    """Node counts of the expert-parallel groups of a role's `nodes` nodes: groups of at most `ep_gpus`
    GPUs (whole nodes, at least one), as even as possible; without EP (`ep_gpus` 0) one per node."""
    if not ep_gpus:
        return [1] * nodes
    per = max(1, ep_gpus // gpus_per_node)
    n = -(-nodes // per)
    return [nodes // n + (1 if i < nodes % n else 0) for i in range(n)]


def slot_tokens(model: str, append: list[np.ndarray], gen: list[np.ndarray], trace: SessionTable | None = None) -> int:
    """Tokens per decode slot of a simulation of agents of these (append, gen) lengths per turn (or a
    recorded `trace`'s prompts), as the runtime sizes them (`dualjax.core.lengths.decode_capacity`):
    capped at the `model` preset's context (none for a model that is not a preset: a test's toy)."""
    if trace is None:
        longest = longest_context(zip(append, gen))
    else:  # a recorded turn's prompt is its own, not the conversation so far plus its misses
        longest = max(int((p + g).max()) for p, g in zip(trace.prompt, trace.gen))
    context = PRESETS[model].max_seq_len if model in PRESETS else math.inf
    return decode_capacity(longest, context, DEFAULT_BUCKETS)


class Simulation(PrefillSide, DecodeSide):
    """Run with `run()`; then `columns()` per request, `host_stats()` per node, `pe_summary()`."""

    def __init__(self, cfg: SimConfig, hw: Hardware, model: ModelCost, append: list[np.ndarray],
                 gen: list[np.ndarray], starts: np.ndarray, think_s: float = 0.0, policy: Policy | str | None = None,
                 progress: bool = True, trace: SessionTable | None = None):
        self.cfg, self.hw, self.model = cfg, hw, model
        self.trace = trace  # recorded sessions: each turn's prompt, hit tokens and pause (`build`)
        self.capacity = slot_tokens(cfg.model, append, gen, trace)
        self.policy = get_policy(policy or cfg.policy)
        self.layerwise = layerwise_for(self.policy, cfg.layerwise)
        # each agent's turn lengths as flat arrays: indexing one gives a Python int (numpy's: a numpy scalar)
        self.append, self.gen = ([array("q", np.asarray(x, np.int64).tobytes()) for x in xs] for xs in (append, gen))
        self.starts, self.think_s = starts, think_s
        self.progress = progress
        self.kvb = model.cache_bytes_per_token
        self.block_tokens = cfg.block_tokens
        g, P, D = hw.gpus_per_node, cfg.cluster.prefill, cfg.cluster.decode
        self.nodes = [Node(n, "prefill" if n < P else "decode", hw, cfg.window_s) for n in range(P + D)]
        self.engines: dict[int, PrefillEngine | DecodeEngine] = {}
        self.groups: list[PeGroup] = []
        self.decoders: list[DecodeEngine] = []
        views = self._build(ep_groups(P, g, hw.ep_gpus), ep_groups(D, g, hw.ep_gpus))
        self.scheduler = Scheduler(self.policy, self.thresholds(), views, naive=cfg.scheduler == "naive",
                                   de_memory=cfg.de_memory)
        self.reserved = cfg.de_memory == "reserved"  # placement takes a DE's memory (resident: the KV moving in)
        self.waiting = Waiting()
        n = sum(len(a) for a in append)
        self.n_requests = n
        # Per-request columns: flat `array`s while running (a scalar access costs a fraction of a numpy one,
        # the arithmetic stays on Python floats and ints, and the garbage collector never walks them, as it
        # would every slot of lists at each full collection), numpy arrays once `run` ends.
        self.cols = Columns({k: array(_TYPECODE[k], [math.nan if k in FLOAT_COLUMNS else 0]) * n for k in _TYPECODE})
        self.context = [0] * len(append)  # tokens of each agent's conversation so far
        self.next_turn = [0] * len(append)
        self.next_id = 0
        self.events: list = []  # heap of (time, order, fn, args)
        self.due: deque = deque()  # (order, fn, args) of events queued for the current time: FIFO (`at`)
        # (end, order, node, tokens) of the reads whose end wakes nothing: no event of their own; the scheduler's
        # read queues shrink by those due before the event that next places requests (`_schedule`)
        self.reads_due: list = []
        self.deadlines: dict[int, float] = {}  # a placed row's read deadline, by request (`dualjax.sim.deadline`)
        self.seeded, self.wall_s = False, 0.0  # `run`: the agents' starts queued; its wall time so far
        self.tick = itertools.count(1).__next__  # events due at the same time run in the order queued
        self.now = 0.0
        self.events_done = 0
        self.rng = stream("simulator", cfg.workload_seed)
        self.dirty, self.completed = False, 0
        self.de_mem_peak = 0.0
        self.attention_balance: list[tuple[float, float]] = []  # (start, max/avg attention time) per EP group pass
        self.quota_cuts: list[tuple[float, bool]] = []  # (start, the quota cut a member's batch) per group pass
        self.decode_limit = hw.decode_batch or math.inf  # requests a DE's batch holds
        self.kv_priority = hw.kv_priority  # with it, KV queued on a DE's compute NIC re-times nothing
        # `local`: engines share one machine's cores; slowdown of a pass / a step by others computing
        self.shared = bool(hw.contention or hw.decode_contention)
        self.slow = {PrefillEngine: _slowdowns(hw.contention, len(self.engines)),
                     DecodeEngine: _slowdowns(hw.decode_contention or hw.contention, len(self.engines))}

    def _build(self, pe_groups: list[int], de_groups: list[int]) -> list[EngineView]:
        """Engines, their NICs, memory and groups; the scheduler's views of them."""
        hw, g, cfg = self.hw, self.hw.gpus_per_node, self.cfg
        views, rank, node_iter = [], 1, iter(self.nodes)
        self.de_mem = 0.0
        for role, sizes in (("prefill", pe_groups), ("decode", de_groups)):
            for size in sizes:
                costs = Costs(hw, self.model, self.capacity, pe_ep=size * g, de_ep=size * g)
                members = []
                for node in [next(node_iter) for _ in range(size)]:
                    for _ in range(g):
                        tx, rx = (Lane(hw.cnic_bytes_per_s, hw.kv_priority, hw.kv_share) for _ in range(2))
                        if hw.free_io:  # KV crosses the compute NIC in no time; model traffic keeps the line
                            tx.free = rx.free = True
                        if role == "prefill":
                            budget = costs.pe_memory_bytes() if cfg.pe_hbm_mb is None else cfg.pe_hbm_mb * 1e6
                            if budget <= 0:
                                raise SimError(self._no_memory(size * g))
                            e = PrefillEngine(rank, node, tx, rx, Buffer(f"PE {rank} HBM", budget))
                            members.append(e)
                            views.append(EngineView(rank, role, node.id, prefill_s=costs.one_row_s))
                        else:
                            mem = costs.de_memory_tokens()
                            if mem <= 0:
                                raise SimError(self._no_memory(size * g))
                            self.de_mem = max(self.de_mem, mem)
                            e = DecodeEngine(rank, node, tx, rx, costs, size, mem)
                            self.decoders.append(e)
                            views.append(EngineView(rank, role, node.id, free_tokens=None if math.isinf(mem) else mem))
                        self.engines[rank] = e
                        rank += 1
                if role == "prefill":
                    self.groups.append(PeGroup(members, size))
                self.costs = costs  # every PE group's prefill costs agree (a DE keeps its group's, `DecodeEngine`)
        return views

    def _no_memory(self, ep: int) -> str:
        return (f"{self.model.name} leaves no device memory for KV on a {self.hw.name} GPU with expert parallelism "
                f"over {ep} GPUs ({self.model.weights_per_gpu(ep) / 1e9:.1f} GB of weights per GPU): use more nodes "
                f"per role or a larger ep_gpus")

    def thresholds(self) -> Thresholds:
        """alpha from the storage NIC's effective rate (with a queue-depth curve its saturated rate: alpha
        separates long read queues, where the depth is high); beta from the prefill rate: on `local` what the
        runtime profiles at start-up, else a pass of as many of the workload's typical rows as the quota
        admits on their attention time (at most one per agent). A profile without an attention term (a fit
        with a = 0) puts no bound on the rows, so beta then rates a one-row pass, the shape the runtime's
        start-up profile times."""
        snic = math.inf if self.hw.free_io else self.hw.snic_bytes_per_s * self.hw.snic_efficiency
        if self.hw.prefill_tokens_per_s is not None:
            return Thresholds.from_rates(snic, self.kvb, self.hw.prefill_tokens_per_s)
        append, gen = [np.asarray(a) for a in self.append[:64]], [np.asarray(g) for g in self.gen[:64]]
        new = int(np.mean([a[1:].mean() if len(a) > 1 else a[0] for a in append]))
        cached = int(np.mean([(a.sum() + g.sum()) / 2 for a, g in zip(append, gen)]))
        attention = self.costs.attention(cached, new)
        # the quota bounds one attention layer of the pass (`batching.pack`); `attention` spans every layer;
        # a pass holds at most one request per agent
        quota_s = self.cfg.compute_quota_ms / 1e3 * self.model.n_layers
        rows = min(max(1, int(quota_s / attention)), len(self.append)) if attention > 0 else 1
        rate = rows * new / self.costs.pass_seconds([(cached, new)] * rows)
        return Thresholds.from_rates(snic, self.kvb, rate, measured_at=(cached, new))

    # -- events ------------------------------------------------------------------------------------
    def at(self, t: float, fn, *args) -> None:
        """Call fn(*args) at simulated time t (now, if t has passed), after every event already due then.
        One due now skips the heap: it goes to the back of `due`, which the loop merges by order."""
        if t > self.now:
            heappush(self.events, (t, self.tick(), fn, args))
        else:
            self.due.append((self.tick(), fn, args))

    def run(self, until: float | None = None) -> "Simulation":
        """Simulate every request, or (`until`) up to that simulated time, leaving later ones unfinished;
        a later call goes on from there. Python's cyclic garbage collector is paused meanwhile: the event
        loop makes no reference cycles (reference counting frees all it drops), and with tens of thousands
        of requests waiting every collection walks them all (23 % of the CPU in a stretch of 48P96D x 49,152)."""
        t_wall = time.perf_counter()
        if not self.seeded:
            for a, t in enumerate(self.starts):
                self.at(float(t), self._submit, a)
            self.seeded = True
        else:  # back to flat arrays while running (`__init__`)
            self.cols = Columns({k: array(_TYPECODE[k], v.tobytes()) for k, v in self.cols.items()})
        collecting = gc.isenabled()
        gc.disable()
        try:
            with tqdm(total=self.n_requests, desc=f"sim {self.cfg.cluster.name} {self.policy.name}", unit="req",
                      disable=not self.progress, leave=False, mininterval=1.0) as bar:
                self._loop(until, bar)
        finally:
            if collecting:
                gc.enable()
        if self.completed != self.n_requests and until is None:
            raise SimError(f"the simulation stalled with {self.n_requests - self.completed} requests unfinished "
                           f"({len(self.waiting)} waiting for an engine): a request fits no engine's memory")
        self.cols = Columns({k: np.array(v, np.float64 if k in FLOAT_COLUMNS else np.int64)
                             for k, v in self.cols.items()})
        self.wall_s += time.perf_counter() - t_wall
        return self

    def _loop(self, until: float | None, bar) -> None:
        """Run the events in time order (those due together in the order queued), placing waiting requests
        after any event that may have made room, until none is left or the next is due after `until`."""
        events, pop, waiting, n, done = self.events, heappop, self.waiting, 0, self.completed
        due, t = self.due, self.now
        if until is not None:  # a stop after every event due at `until`, those it starts included
            heappush(events, (until, math.inf, None, ()))
        while events or due:
            if due and not (events and events[0][0] == t and events[0][1] < due[0][0]):
                order, fn, args = due.popleft()  # due now, and queued before the heap's next event due now
            else:
                t, order, fn, args = pop(events)
                if fn is None:  # a stop: this call's, or one an interrupted call left behind
                    if t == until:
                        self._reads_done((t, order))
                        break
                    t = self.now  # the time `due` events run at
                    continue
                self.now = t
            fn(*args)
            n += 1
            if self.dirty:
                if waiting:
                    self._schedule((t, order))
                else:  # nothing to place; the next arrival sets it again
                    self.dirty = False
            if self.completed - done >= 1000:
                bar.update(self.completed - done)
                done = self.completed
        else:
            self._reads_done((math.inf,))
        self.events_done += n

    # -- arrivals and placement --------------------------------------------------------------------
    def _submit(self, agent: int) -> None:
        k, ctx = self.next_turn[agent], self.context[agent]
        prompt, gen = ctx + self.append[agent][k], self.gen[agent][k]
        if self.trace is not None:  # the session's own prompt and hits (its hash ids), in whole blocks
            prompt = int(self.trace.prompt[agent][k])
            hit = at_block(int(self.trace.hit[agent][k]), prompt, self.block_tokens) if self.cfg.use_store else 0
        else:
            hit = hit_tokens(ctx, prompt, self.block_tokens, self.cfg.use_store)
        if prompt + gen > self.de_mem:
            raise SimError(f"agent {agent} turn {k} needs {prompt + gen} tokens of KV, more than a "
                           f"decode engine holds ({self.de_mem} tokens on {self.hw.name} with {self.model.name})")
        rid = self.next_id
        self.next_id += 1
        c = self.cols
        c.agent[rid], c.turn[rid], c.prompt_tokens[rid] = agent, k, prompt
        c.gen_len[rid], c.hit_tokens[rid], c.arrival[rid] = gen, hit, self.now
        self.waiting.append(RequestView(rid, agent, k, prompt, hit, gen, self.block_tokens))
        self.dirty = True

    def _schedule(self, due: tuple) -> None:
        """Place what can be placed after the event keyed `due` = (time, order)."""
        self.dirty = False
        self._reads_done(due)
        for d in self.scheduler.schedule(self.waiting):
            self._place(d)
            if self.reserved:  # the memory is taken here (resident: when the KV moves in)
                self._note_de_memory(self.engines[d.de])

    def _note_de_memory(self, de: DecodeEngine) -> None:
        """The share of `de`'s KV memory the scheduler counts as taken (`de_memory`: reserved or resident),
        for its peak (`link_summary`)."""
        if de.kv_cap != math.inf:
            taken = (de.kv_cap - self.scheduler.free[self.scheduler.index[de.rank]]) / de.kv_cap
            if taken > self.de_mem_peak:
                self.de_mem_peak = taken

    def _reads_done(self, key: tuple) -> None:
        """The reads of `reads_due` that end before `key` = (time, order), as an event would have, leave
        their nodes' read queues."""
        sch, due = self.scheduler, self.reads_due
        while due and due[0] < key:
            _, _, node, tokens = heappop(due)
            sch.set_read_queue(node, sch.read_queue(node) - tokens)

    def _place(self, d) -> None:
        """Put a placed request on its PE with its plan: the hit tokens loaded (the DE's share first), the
        recomputed tail computed with the misses."""
        r, c, plan = d.request, self.cols, d.plan
        rid = r.id
        pe, de = self.engines[d.pe], self.engines[d.de]
        path = d.path if self.cfg.use_store else "none"
        c.scheduled[rid], c.pe[rid], c.de[rid], c.path[rid] = self.now, d.pe, d.de, PATH_CODES[path]
        row = Row.placed(d, path, de)  # the plan in the row's terms
        loaded = row.cached
        c.hit_tokens[rid], c.de_tokens[rid], c.recomputed_tokens[rid] = loaded, plan.de_tokens, plan.recompute_tokens
        if plan.deadline_s is not None and loaded and self.layerwise:  # Basic loads its batches whole: none
            self.deadlines[rid] = self.now + plan.deadline_s
        pe.rows.append(row)
        de.node.buffer.reserve(r.prompt_tokens * self.kvb, self._admitted, row, pe, de)

    def _admitted(self, row: Row, pe: PrefillEngine, de: DecodeEngine) -> None:
        """The DE buffer holds room for the prompt's KV. The DE's share of the hit blocks is read into it now;
        layerwise, the PE's share once the PE buffer has room for it (the row's read spans both); Basic: the
        PE forms and loads its batches (`PrefillSide._form`)."""
        own, de_reads = row.cached - row.de_tokens, row.de_tokens or row.path == "de"
        if de_reads:
            self._read(row, de.node, pe, tokens=row.de_tokens, first=bool(own) and self.layerwise)
        if not self.layerwise:
            row.admitted = self.now
            self._form(pe)
        elif own:
            row.buf = own * self.kvb
            pe.node.buffer.reserve(row.buf, self._read, row, pe.node, pe, own)
        elif not de_reads:
            self._read(row, pe.node, pe, tokens=0)

    def _read(self, row: Row, node: Node, pe: PrefillEngine, tokens: int, into_hbm: bool = False,
              first: bool = False) -> None:
        """Read `tokens` of the hit blocks into `node`'s buffer and let the PE start once they are in
        (`into_hbm`: a Basic batch's row, on into the PE's HBM; the batch pokes its PE once all its rows are
        in, `_form`). `first`: the first of the row's two reads (a split, layerwise), kept until the second.
        Free I/O (Oracle): no read; the tokens leave the node's read queue at once."""
        if tokens and self.hw.free_io:
            self.scheduler.set_read_queue(node.id, self.scheduler.read_queue(node.id) - tokens)
            tokens = 0
        cut = None
        if tokens and self.deadlines:
            tokens, cut = cut_read(self, row, node, tokens)
        if not tokens:
            row.t0 = row.t1 = self.now
            if not into_hbm:
                self._poke(pe)
            return
        nbytes = tokens * self.kvb
        t1 = node.snic.reserve(self.now, nbytes)
        t0 = node.snic.start
        if cut is not None:  # abandoned at the deadline: the NIC frees then
            hold(node.snic, self.now, cut)
        node.account_read(t0, t1, nbytes)
        written = node.dram.reserve(self.now, nbytes)  # into the host buffer
        if written > t1:
            t1 = written
        if into_hbm or self.layerwise:  # its end wakes no PE (Basic's batch pokes its own, `_form`; layerwise, a
            # pass took the row while it loads, `_ready`): no event, the read queue shrinks before the next placement
            heappush(self.reads_due, (t1, self.tick(), node.id, tokens))
            if into_hbm:  # into HBM before the pass: the loopback, behind the read
                t1 = self._loopback(pe, t1, nbytes)
        else:  # Basic, into the PE buffer: one event, the read queue shrinks and the PE may start
            self.at(t1, self._read_done, node.id, tokens, pe)
        if first:
            row.early = (t0, t1)
            return
        if row.early is not None:  # the other side's share, read since the row was admitted
            t0, t1 = min(t0, row.early[0]), max(t1, row.early[1])
        row.t0, row.t1 = t0, t1
        if self.layerwise:  # the oldest row may start while it loads
            self._poke(pe)

    def _read_done(self, node: int, tokens: int, pe: PrefillEngine) -> None:
        self.scheduler.set_read_queue(node, self.scheduler.read_queue(node) - tokens)
        self._poke(pe)

    # -- results -----------------------------------------------------------------------------------
    def host_stats(self) -> list[HostStats]:
        """Per node, the record real hosts report (`dualjax.core.records.HostStats`)."""
        out = []
        for node in self.nodes:
            engines = [e for e in self.engines.values() if e.node is node]
            cum = np.concatenate([[0.0], np.cumsum(node.series)])
            series = [(k * node.window, float(b)) for k, b in enumerate(cum)]
            out.append(HostStats(node.id, node.role, kv_sent_bytes=node.kv_sent_bytes,
                                 busy_s=sum(e.busy_s for e in engines) / len(engines),
                                 buffer_peak_bytes=node.buffer.peak, buffer_budget_bytes=node.buffer.budget,
                                 snic=SnicStats(node.snic.bytes, node.snic.busy_s, series=series),
                                 store=StoreStats(bytes_written=node.write_bytes)))
        return out

    def pe_summary(self) -> dict:
        """What the PEs did: rows per pass, passes, compute vs group time, Basic's wait from its DE buffer's
        room to the start of its load (its batch formed: the batches before it computed, memory freed), and
        the attention time's max/avg across the members of a group pass (`attention_summary`)."""
        pes = [e for e in self.engines.values() if isinstance(e, PrefillEngine)]
        passes, rows = sum(e.passes for e in pes), sum(e.rows_run for e in pes)
        busy, compute = sum(e.busy_s for e in pes), sum(e.compute_s for e in pes)
        wait = self.cols.load_wait[~np.isnan(self.cols.load_wait)]
        jct = float(np.nanmax(self.cols.done) - np.nanmin(self.cols.arrival)) or 1.0
        return {"rows_per_pass": rows / passes if passes else None, "passes": passes,
                "group_passes": sum(g.passes for g in self.groups), "ep_groups": [g.nodes for g in self.groups],
                "busy_fraction": busy / len(pes) / jct, "compute_fraction_of_busy": compute / busy if busy else None,
                "hbm_budget_gb": min(e.hbm.budget for e in pes) / 1e9,
                "hbm_peak_gb": max(e.hbm.peak for e in pes) / 1e9,
                "load_wait_s": {"mean": float(wait.mean()) if wait.size else None,
                                "p99": float(np.percentile(wait, 99)) if wait.size else None},
                "attention_max_over_avg": self.attention_summary(jct), "quota_cut": self.quota_summary(jct)}

    def quota_summary(self, jct: float) -> dict:
        """Whether the compute quota binds: the share of layerwise group passes in which it cut a member's
        batch (a ready row left out, or chunked below what it had left), over the run and over the passes
        that start in its first 5 %; None without the quota (naive) or layerwise passes."""
        start = np.array([t for t, _ in self.quota_cuts])
        cut = np.array([c for _, c in self.quota_cuts], bool)
        t0 = float(np.nanmin(self.cols.arrival)) if len(self.cols.arrival) else 0.0
        early = cut[start < t0 + 0.05 * jct]
        return {"share": float(cut.mean()) if cut.size else None,
                "first_5pct": float(early.mean()) if early.size else None, "passes": int(cut.size)}

    def attention_summary(self, jct: float) -> dict:
        """Intra-engine balance (docs/paper.md §10): per forward of an expert-parallel PE group of two or more
        GPUs, the max over its members of their batches' predicted attention time (the quantity the compute
        quota bounds) over the members' mean (a member without a batch: 0), averaged over the passes of the
        run and over those that start in its first 5 % (`first_5pct`); None without such a pass."""
        start = np.array([t for t, _ in self.attention_balance])
        ratio = np.array([r for _, r in self.attention_balance])
        t0 = float(np.nanmin(self.cols.arrival)) if len(self.cols.arrival) else 0.0
        early = ratio[start < t0 + 0.05 * jct]
        return {"mean": float(ratio.mean()) if ratio.size else None,
                "p99": float(np.percentile(ratio, 99)) if ratio.size else None,
                "first_5pct": float(early.mean()) if early.size else None, "passes": int(ratio.size)}

    def sim_summary(self) -> dict:
        """Per role: the buffers' peak over the run against their budget (GB, the busiest node's; 0: no
        buffer, free I/O), and the storage NICs' mean busy fraction (`link_summary` has the busiest one's)."""
        jct = float(np.nanmax(self.cols.done) - np.nanmin(self.cols.arrival)) or 1.0
        out = {}
        for role, tag in (("prefill", "pe"), ("decode", "de")):
            nodes = [n for n in self.nodes if n.role == role]
            out[f"{tag}_buffer_peak_gb"] = max(n.buffer.peak for n in nodes) / 1e9
            out[f"{tag}_buffer_budget_gb"] = (nodes[0].buffer.budget or 0.0) / 1e9  # None: no buffer (free I/O)
            out[f"{tag}_snic_busy_mean"] = sum(n.snic.busy_s for n in nodes) / len(nodes) / jct
        return out

    def link_summary(self) -> dict:
        """Busy fraction of each kind of resource over the run (the busiest one of its kind), by role: the
        storage NICs, host DRAM, compute NICs' tx and rx (KV traffic), and PE compute; and the peak share
        of a DE's KV memory in use and the mean wait for placement. `placement_stops`: the scheduler's rounds
        that the PE rule ended and those in which the DE rule refused a request (`Scheduler.stops`).
        `pe_beta`: the PE rule's share of those rounds. `binding`: the busiest; when requests waited over a
        second on average to be placed, `de_memory_peak` if a DE's memory filled and the DE rule refused in
        more rounds than the PE rule ended, `pe_beta` if the PE rule (every PE over beta) ended at least as
        many."""
        jct = float(np.nanmax(self.cols.done) - np.nanmin(self.cols.arrival)) or 1.0
        out = {}
        for role in ("prefill", "decode"):
            nodes = [n for n in self.nodes if n.role == role]
            gpus = [e for e in self.engines.values() if e.node.role == role]
            tag = "pe" if role == "prefill" else "de"
            out[f"{tag}_snic"] = max(n.snic.busy_s for n in nodes) / jct
            out[f"{tag}_dram"] = max(n.dram.busy_s for n in nodes) / jct
            out[f"{tag}_cnic_tx"] = max(e.tx.bytes / e.tx.rate for e in gpus) / jct  # KV's share of the line
            out[f"{tag}_cnic_rx"] = max(e.rx.bytes / e.rx.rate for e in gpus) / jct
        out["pe_compute"] = max(e.compute_s for e in self.engines.values() if isinstance(e, PrefillEngine)) / jct
        out["de_memory_peak"] = self.de_mem_peak  # a peak, not a busy fraction: full means requests wait for it
        out["queue_wait_s"] = float(np.nanmean(self.cols.scheduled - self.cols.arrival))
        out["binding"] = max((k for k in out if k not in ("de_memory_peak", "queue_wait_s")), key=out.get)
        stops = self.scheduler.stops
        held = stops["pe_rule"] + stops["de_rule"]
        out["pe_beta"] = stops["pe_rule"] / held if held else 0.0  # a share of the rounds that held requests back
        out["placement_stops"] = dict(stops)
        if out["queue_wait_s"] > 1.0:  # requests wait in the queue: for DE memory, or for a PE under beta
            if self.de_mem_peak > 0.99 and stops["de_rule"] > stops["pe_rule"]:
                out["binding"] = "de_memory_peak"
            elif stops["pe_rule"] >= stops["de_rule"]:
                out["binding"] = "pe_beta"
        return out

    def columns(self) -> dict[str, np.ndarray]:
        c = dict(self.cols.items())
        c["ttft"] = c["first_token"] - c["arrival"]
        c["ttst"] = c["second_token"] - c["first_token"]  # time to second token: from the first (docs/paper.md §9)
        c["path"] = np.array(list(PATH_CODES))[c["path"]]
        return c
