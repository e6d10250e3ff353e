"""Discrete-event simulation of a DualPath cluster, driven by the runtime's own scheduler and policy.

Nodes hold g engines (one per GPU), all prefill (PE) or all decode (DE). Per node: a storage NIC
(FIFO, bytes/s) whose queue the scheduler balances, host DRAM bandwidth, and a PE or DE buffer
budget. Per GPU: a compute NIC whose KV share carries relays and prefill output. A request flows
as in the runtime (PAPER.md §3):

1. it arrives (agents: offline all at 0, online Poisson; the next turn starts when the previous
   one completes, after an optional think time) and waits in the scheduler's FIFO queue;
2. the scheduler places it (PE, DE, path) exactly as in a real run; the DE buffer takes its
   prompt KV, the reading side's storage NIC reads its hit blocks (DE path: relayed to the PE
   over both GPUs' compute NICs, layer by layer);
3. the PE packs passes with the runtime's `batching.pack` (quota, chunks); a layerwise pass may
   start while its oldest row is still loading and ends no earlier than its last layer allows;
   Basic waits for full loads;
4. the prefill's KV goes to the DE (hit + miss on the PE path, miss only on the DE path); the
   DE decodes it in a continuous batch, modelled as a fluid: between joins and leaves every
   member advances at the batch's step time, so the cost is an event per join and leave, not per
   token; full blocks are written back (counted, not queued: storage writes do not compete
   with reads here, and every block is assumed stored before the agent's next turn).

Hits follow the runtime's store: a turn hits every full block of the agent's previous context
(prompt + generation - 1 tokens have KV), at most (prompt - 1) // block tokens.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import deque

import numpy as np
from tqdm import tqdm

from dualjax.core.batching import pack
from dualjax.core.config import SimConfig
from dualjax.core.policies import Policy, get_policy, layerwise_for
from dualjax.core.records import HostStats, SnicStats, StoreStats
from dualjax.core.scheduler import EngineView, RequestView, Scheduler, Thresholds, Waiting
from dualjax.core.streams import stream
from dualjax.sim.profiles import Hardware, ModelCost
from dualjax.sim.resources import Costs, FifoLink, Node, SimError
from models.buckets import DEFAULT_BUCKETS

PATH_CODES = {"pe": 0, "de": 1, "none": 2}


class Row:
    """A request on a PE (a `batching.Work`): its read interval [t0, t1] (t1: every layer is on the
    PE) once the read is issued."""

    __slots__ = ("rid", "cached", "remaining", "t0", "t1", "started")

    def __init__(self, rid: int, cached: int, remaining: int):
        self.rid, self.cached, self.remaining = rid, cached, remaining
        self.t0 = self.t1 = None
        self.started = False


class PrefillEngine:
    __slots__ = ("rank", "node", "cnic", "rows", "busy", "busy_s")

    def __init__(self, rank: int, node: Node, cnic: FifoLink):
        self.rank, self.node, self.cnic, self.rows, self.busy, self.busy_s = rank, node, cnic, [], False, 0.0


class DecodeEngine:
    """A continuous decode batch as a fluid: `steps` advance at 1/step_s between membership changes."""

    __slots__ = ("rank", "node", "cnic", "members", "n", "ready", "steps", "t_ref", "step_s", "ctx_base", "version",
                 "busy_s")

    def __init__(self, rank: int, node: Node, cnic: FifoLink):
        self.rank, self.node, self.cnic = rank, node, cnic
        self.members: list[tuple[float, int]] = []  # heap of (finish step, request id)
        self.n, self.ready = 0, deque()
        self.steps = self.t_ref = self.step_s = self.busy_s = 0.0
        self.ctx_base = 0.0  # sum over members of (prompt - join step): context = ctx_base + n * steps
        self.version = 0


def _slowdowns(measured: tuple[float, ...], engines: int) -> list[float]:
    """Slowdown with 0 .. engines - 1 others computing: 1, the measured ones, then linear."""
    if not measured:  # engines have their own compute
        return [1.0] * engines
    out = [1.0, *measured]
    while len(out) < engines:
        out.append(out[-1] + (out[-1] - out[-2]))
    return out


class Simulation:
    """Run with `run()`; then `columns()` per request and `host_stats()` per node."""

    def __init__(self, cfg: SimConfig, hw: Hardware, model: ModelCost, append: list[np.ndarray],
                 gen: list[np.ndarray], starts: np.ndarray, think_s: float = 0.0, policy: Policy | str | None = None,
                 progress: bool = True):
        self.cfg, self.hw, self.model = cfg, hw, model
        longest = max(int(a.sum() + g.sum()) for a, g in zip(append, gen))
        self.costs = Costs(hw, model, DEFAULT_BUCKETS.prefix(longest + 1))  # as `dualjax.runtime.decode_host.decode_capacity`
        self.policy = get_policy(policy or cfg.policy)
        self.layerwise = layerwise_for(self.policy, cfg.layerwise)
        self.append, self.gen, self.starts, self.think_s = append, gen, starts, think_s
        self.progress = progress
        g, P, D = hw.gpus_per_node, cfg.cluster.prefill, cfg.cluster.decode
        self.nodes = [Node(n, "prefill" if n < P else "decode", hw, cfg.window_s) for n in range(P + D)]
        self.engines: dict[int, PrefillEngine | DecodeEngine] = {}
        views, rank = [], 1
        de_mem = self.costs.de_memory_tokens()
        for node in self.nodes:
            for _ in range(g):
                cnic = FifoLink(hw.cnic_bytes_per_s * hw.kv_share)
                cls = PrefillEngine if node.role == "prefill" else DecodeEngine
                self.engines[rank] = cls(rank, node, cnic)
                views.append(EngineView(rank, node.role, node.id,
                                        free_tokens=None if node.role == "prefill" or math.isinf(de_mem) else de_mem))
                rank += 1
        if de_mem <= 0:
            raise SimError(f"{model.name} leaves no device memory for KV on a {hw.name} GPU")
        self.de_mem = de_mem
        self.kvb = model.kv_bytes_per_token
        self.T = cfg.block_tokens
        self.scheduler = Scheduler(self.policy, self.thresholds(), views)
        self.waiting = Waiting()
        self.pe_mem = self.costs.pe_memory_tokens(self.layerwise)
        n = sum(len(a) for a in append)
        self.n_requests = n
        self.cols = {k: np.full(n, np.nan) for k in ("arrival", "scheduled", "prefill_start", "prefill_end",
                                                   "first_token", "ttst", "done", "tpot")}
        for k in ("agent", "turn", "prompt_tokens", "gen_len", "hit_tokens", "pe", "de", "path", "restarts"):
            self.cols[k] = np.zeros(n, np.int64)
        self.context = np.zeros(len(append), np.int64)  # tokens of each agent's conversation so far
        self.next_turn = np.zeros(len(append), np.int64)
        self.next_id = 0
        self.events: list = []
        self.seq = 0
        self.now = 0.0
        self.events_done = 0
        self.rng = stream("simulator", cfg.workload_seed)
        self.dirty, self.completed = False, 0
        # `local`: engines share one machine's cores; slowdown of a pass / a step by others computing
        self.shared = bool(hw.contention or hw.decode_contention)
        self.slow = {PrefillEngine: _slowdowns(hw.contention, len(self.engines)),
                     DecodeEngine: _slowdowns(hw.decode_contention or hw.contention, len(self.engines))}

    def thresholds(self) -> Thresholds:
        rate = self.hw.prefill_tokens_per_s  # `local`: what the runtime profiles at start-up
        if rate is None:  # the workload's typical turn
            spec_new = int(np.mean([a[1:].mean() if len(a) > 1 else a[0] for a in self.append[:64]]))
            spec_cached = int(np.mean([(a.sum() + g.sum()) / 2 for a, g in zip(self.append[:64], self.gen[:64])]))
            rate = spec_new / self.costs.predict(spec_cached, spec_new)
        return Thresholds.from_rates(self.hw.snic_bytes_per_s, self.kvb, rate)

    # -- events ------------------------------------------------------------------------------------
    def at(self, t: float, fn, *args) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, fn, args))

    def run(self) -> "Simulation":
        t_wall = time.perf_counter()
        for a, t in enumerate(self.starts):
            self.at(float(t), self._submit, a)
        done = 0
        with tqdm(total=self.n_requests, desc=f"sim {self.cfg.cluster.name} {self.policy.name}", unit="req",
                  disable=not self.progress, leave=False, mininterval=1.0) as bar:
            events = self.events
            while events:
                self.now, _, fn, args = heapq.heappop(events)
                fn(*args)
                self.events_done += 1
                if self.dirty and self.waiting:
                    self._schedule()
                if self.completed - done >= 1000:
                    bar.update(self.completed - done)
                    done = self.completed
        if self.completed != self.n_requests:
            raise SimError(f"the simulation stalled with {self.n_requests - self.completed} requests unfinished "
                           f"({len(self.waiting)} waiting for an engine): a request fits no engine's memory")
        self.wall_s = time.perf_counter() - t_wall
        return self

    # -- arrivals and placement --------------------------------------------------------------------
    def _submit(self, agent: int) -> None:
        k = int(self.next_turn[agent])
        ctx = int(self.context[agent])
        prompt = ctx + int(self.append[agent][k])
        hit = ((ctx - 1) // self.T) * self.T if (k and self.cfg.use_store) else 0
        if prompt + self.gen[agent][k] > self.de_mem:
            raise SimError(f"agent {agent} turn {k} needs {prompt + self.gen[agent][k]} tokens of KV, more than a "
                           f"decode engine holds ({self.de_mem} tokens on {self.hw.name} with {self.model.name})")
        rid = self.next_id
        self.next_id += 1
        c = self.cols
        c["agent"][rid], c["turn"][rid], c["prompt_tokens"][rid] = agent, k, prompt
        c["gen_len"][rid], c["hit_tokens"][rid], c["arrival"][rid] = self.gen[agent][k], hit, self.now
        self.waiting.append(RequestView(rid, agent, k, prompt, hit, int(self.gen[agent][k])))
        self.dirty = True

    def _schedule(self) -> None:
        self.dirty = False
        for d in self.scheduler.schedule(self.waiting):
            self._place(d)

    def _place(self, d) -> None:
        r, c = d.request, self.cols
        rid = r.id
        pe, de = self.engines[d.pe], self.engines[d.de]
        c["scheduled"][rid], c["pe"][rid], c["de"][rid] = self.now, d.pe, d.de
        c["path"][rid] = PATH_CODES[d.path if self.cfg.use_store else "none"]
        row = Row(rid, r.hit_tokens, r.miss_tokens)
        pe.rows.append(row)
        de.node.buffer.reserve(r.prompt_tokens * self.kvb, lambda: self._admitted(row, d.path, pe, de))

    def _admitted(self, row: Row, path: str, pe: PrefillEngine, de: DecodeEngine) -> None:
        """The DE buffer holds room for the prompt's KV: start the hit read on the chosen side."""
        hit = row.cached * self.kvb
        if not hit:
            row.t0 = row.t1 = self.now
            self._poke(pe)
        elif path == "pe":
            pe.node.buffer.reserve(hit, lambda: self._read(row, pe.node, pe, None))
        else:
            self._read(row, de.node, pe, de)

    def _read(self, row: Row, node: Node, pe: PrefillEngine, relay_from: DecodeEngine | None) -> None:
        nbytes = row.cached * self.kvb
        t0, t1 = node.snic.reserve(self.now, nbytes)
        node.account_read(t0, t1, nbytes)
        # into the host buffer, then out of it (to the PE GPU, or to the compute NIC for the relay)
        t1 = max(t1, node.dram.reserve(self.now, 2 * nbytes)[1])
        ready = t1
        if relay_from is not None:  # layer by layer over both GPUs' compute NICs, behind the read
            node.relay_bytes += nbytes
            relay_end = max(relay_from.cnic.reserve(t0, nbytes)[1], pe.cnic.reserve(t0, nbytes)[1])
            last_layer = nbytes / self.model.n_layers / (self.hw.cnic_bytes_per_s * self.hw.kv_share)
            ready = max(t1 + last_layer, relay_end)
        row.t0, row.t1 = t0, ready
        self.at(t1, self._read_done, node.id, row.cached, pe if ready == t1 else None)
        if ready != t1:
            self.at(ready, self._poke, pe)
        if self.layerwise:  # the oldest row may start while it loads
            self._poke(pe)

    def _read_done(self, node: int, tokens: int, pe: PrefillEngine | None) -> None:
        self.scheduler.set_read_queue(node, self.scheduler.read_queue(node) - tokens)
        if pe is not None:
            self._poke(pe)

    # -- prefill -----------------------------------------------------------------------------------
    def _poke(self, pe: PrefillEngine) -> None:
        if not pe.busy:
            self._start_pass(pe)

    def _start_pass(self, pe: PrefillEngine) -> None:
        assert not pe.busy, "one pass at a time per PE"
        now = self.now
        ready = [r for r in pe.rows if r.t1 is not None]
        ready = [r for i, r in enumerate(ready) if r.t1 <= now or (i == 0 and self.layerwise)]
        if not ready:
            return
        plan = pack(ready, self.costs, self.cfg.compute_quota_ms / 1e3, self.cfg.prefill_chunk,
                    padded=self.hw.padded)
        held, kept = 0, []
        for w, n in plan:  # device memory: the pass's prefix + new KV (layerwise: one layer's)
            held += w.cached + n
            if kept and held > self.pe_mem:
                break
            kept.append((w, n))
        dur = self.costs.pass_seconds([(w.cached, n) for w, n in kept])
        if self.shared:
            dur *= self._slowdown(pe)
        end = now + dur
        first = kept[0][0]
        if first.t1 > now:  # layerwise over a loading row: layer l runs once layer l has arrived
            L = self.model.n_layers
            end = max(end, first.t0 + (first.t1 - first.t0) / L + dur, first.t1 + dur / L)
        for w, _ in kept:
            if not w.started:
                w.started = True
                self.cols["prefill_start"][w.rid] = now
        pe.busy = True
        pe.busy_s += end - now
        self.at(end, self._end_pass, pe, kept)
        if self.shared:
            self._retime_decoders()

    def _end_pass(self, pe: PrefillEngine, plan) -> None:
        c, kvb = self.cols, self.kvb
        for w, n in plan:
            w.cached += n
            w.remaining -= n
            if w.remaining:
                continue
            rid = w.rid
            pe.rows.remove(w)
            c["prefill_end"][rid] = self.now
            hit, prompt = int(c["hit_tokens"][rid]), int(c["prompt_tokens"][rid])
            self.scheduler.update(pe.rank, -1, hit - prompt)
            self.dirty = True
            pe_path = c["path"][rid] == PATH_CODES["pe"]
            if pe_path and hit:
                pe.node.buffer.release(hit * kvb)
            de = self.engines[int(c["de"][rid])]
            out = (prompt if pe_path else prompt - hit) * kvb  # the DE already holds the hit KV on its path
            arrive = max(pe.cnic.reserve(self.now, out)[1], de.cnic.reserve(self.now, out)[1],
                         de.node.dram.reserve(self.now, 2 * out)[1])
            self.at(arrive, self._join, de, rid)
        pe.busy = False  # only now: releasing buffers above may issue reads that poke this PE
        self._start_pass(pe)
        if self.shared and not pe.busy:
            self._retime_decoders()

    # -- decode ------------------------------------------------------------------------------------
    def _join(self, de: DecodeEngine, rid: int) -> None:
        """The prompt KV is in the DE buffer: the first token is out; decode the rest."""
        c = self.cols
        c["first_token"][rid] = self.now
        de.node.buffer.release(c["prompt_tokens"][rid] * self.kvb)
        if c["gen_len"][rid] <= 1:
            self._complete(de, rid)
            return
        de.ready.append(rid)
        self._admit(de)

    def _advance(self, de: DecodeEngine) -> None:
        if de.n:
            de.steps += (self.now - de.t_ref) / de.step_s
            de.busy_s += self.now - de.t_ref
        de.t_ref = self.now

    def _admit(self, de: DecodeEngine) -> None:
        self._advance(de)
        limit = self.hw.decode_batch or math.inf
        c = self.cols
        joined = []
        while de.ready and de.n < limit:
            rid = de.ready.popleft()
            heapq.heappush(de.members, (de.steps + c["gen_len"][rid] - 1, rid))
            de.ctx_base += c["prompt_tokens"][rid] - de.steps
            de.n += 1
            joined.append(rid)
        self._retime(de)
        for rid in joined:
            c["ttst"][rid] = self.now + de.step_s  # the second token comes with the next step

    def _slowdown(self, engine) -> float:
        """`local`: engines share the machine's cores; how much the others computing slow this one."""
        others = sum(1 for e in self.engines.values()
                     if e is not engine and (e.busy if isinstance(e, PrefillEngine) else e.n))
        return self.slow[type(engine)][others]

    def _retime_decoders(self) -> None:
        for e in self.engines.values():
            if isinstance(e, DecodeEngine) and e.n:
                self._advance(e)
                self._retime(e)

    def _retime(self, de: DecodeEngine) -> None:
        de.version += 1
        if not de.n:
            return
        de.step_s = self.costs.decode_step_s(de.n, de.ctx_base + de.n * de.steps)
        if self.shared:
            de.step_s *= self._slowdown(de)
        due = self.now + max(0.0, de.members[0][0] - de.steps) * de.step_s
        self.at(due, self._decode_event, de, de.version)

    def _decode_event(self, de: DecodeEngine, version: int) -> None:
        if version != de.version:
            return  # the batch changed since this was due
        self._advance(de)
        while de.members and de.members[0][0] <= de.steps + 1e-6:
            finish, rid = heapq.heappop(de.members)
            de.n -= 1
            de.ctx_base -= self.cols["prompt_tokens"][rid] - (finish - self.cols["gen_len"][rid] + 1)
            self._complete(de, rid)
        self._admit(de)

    def _complete(self, de: DecodeEngine, rid: int) -> None:
        c = self.cols
        c["done"][rid] = self.now
        gen, prompt, hit = int(c["gen_len"][rid]), int(c["prompt_tokens"][rid]), int(c["hit_tokens"][rid])
        if gen > 1:
            c["tpot"][rid] = (self.now - c["first_token"][rid]) / (gen - 1)
        else:
            c["ttst"][rid] = np.nan
        if self.cfg.use_store:  # every block that filled, the prompt's new ones first
            de.node.write_bytes += ((prompt + gen - 1) // self.T - hit // self.T) * self.T * self.kvb
        self.scheduler.update(de.rank, -1, -(prompt + gen))
        self.dirty = True
        self.completed += 1
        agent = int(c["agent"][rid])
        self.context[agent] = prompt + gen
        self.next_turn[agent] += 1
        if self.next_turn[agent] < len(self.append[agent]):
            if self.think_s:
                self.at(self.now + self.rng.exponential(self.think_s), self._submit, agent)
            else:
                self._submit(agent)

    # -- results -----------------------------------------------------------------------------------
    def host_stats(self) -> list[HostStats]:
        """Per node, the record real hosts report (`dualjax.core.records.HostStats`)."""
        out = []
        for node in self.nodes:
            engines = [e for e in self.engines.values() if e.node is node]
            cum = np.concatenate([[0.0], np.cumsum(node.series)])
            series = [(k * node.window, float(b)) for k, b in enumerate(cum)]
            out.append(HostStats(node.id, node.role, kv_sent_bytes=node.relay_bytes,
                                 busy_s=sum(e.busy_s for e in engines) / len(engines),
                                 buffer_peak_bytes=node.buffer.peak,
                                 snic=SnicStats(node.snic.bytes, node.snic.busy_s, series=series),
                                 store=StoreStats(bytes_written=node.write_bytes)))
        return out

    def columns(self) -> dict[str, np.ndarray]:
        c = dict(self.cols)
        c["ttft"] = c["first_token"] - c["arrival"]
        c["ttst"] = c["ttst"] - c["arrival"]
        c["path"] = np.array(list(PATH_CODES))[c["path"]]
        return c
