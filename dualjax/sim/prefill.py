"""The prefill side of the simulation: PE engines, their expert-parallel groups, device memory and passes.

A PE group (the PE GPUs of up to `Hardware.ep_gpus` GPUs, whole nodes) steps together: when it
is idle and a member has a batch ready, every member with one computes it and the pass ends when
its slowest member ends (an expert-parallel step: the MoE all-to-all waits for every member; a
member without a batch runs its experts for the others' tokens). A member's pass takes the
profile's time at the batch's efficiency, overlapped with its EP all-to-all on its compute NIC
(model traffic, high priority). Batches are packed with the runtime's `batching.pack`: the compute
quota bounds one attention layer of the batch (docs/paper.md §7), or, without intra-engine
scheduling (`scheduler` naive), a pass takes every ready row.

Two loading disciplines, as in the runtime (`dualjax.runtime.prefill_host`):

* Layerwise prefill: a row's storage read starts once it is placed (and its hit KV has room in the
  buffer that receives it); its KV waits there and moves into HBM layer by layer during the pass,
  which ends no earlier than its last layer's arrival plus that layer's compute. HBM holds
  `layerwise_layers` layers of the batch (`batching.fit_memory`), so it bounds the batch only.
* Without it (Basic): a PE forms a batch (packed FIFO from its placed rows, then cut to the memory
  it has, `batching.fit_free`) and only then loads it: every layer of its rows' prompt KV must be in
  HBM before the pass starts. `basic_ahead` batches may be loading or loaded while one computes (0:
  load, compute, load, ...). With `basic_lands` hbm the read goes through the PE buffer into HBM and
  HBM holds every batch formed; with host the read lands in the PE buffer, which holds the batches
  waiting, and each moves into HBM (a loopback) when its pass starts. A row keeps its memory until its
  last pass ends; a row chunked by the quota goes on in a later batch without another read.

A plan (docs/policies.md) splits a row's read: the DE's share is read into the DE buffer once the row is
placed and reaches HBM over the relay, the PE's share as above over its loopback; the row's load spans
both. Its recomputed tail is new tokens of its passes.
"""

from __future__ import annotations

from collections import deque

from dualjax.core.batching import fit_free, fit_memory, pack
from dualjax.core.policies import Plan
from dualjax.sim.resources import Buffer, Lane, Node, SimError, carry_model, latest, model_line_rate


class Row:
    """A request on a PE (a `batching.Work`): its storage read [t0, t1] once issued (t1: in the buffer
    that feeds the pass, or in HBM for Basic; a split's spans both sides' reads, `early` the first of
    them), the path, the hit tokens its DE reads (`de_tokens`, the leading ones of `cached`), the tokens
    its PE took in the scheduler (`pe_load`), its DE engine (`de_engine`), and what it holds. Basic:
    `admitted` (when) once its DE buffer has room, `batched` while in a batch formed and not yet computed,
    `held` once it holds its memory."""

    __slots__ = ("rid", "cached", "remaining", "t0", "t1", "started", "path", "de_tokens", "pe_load", "de_engine",
                 "early", "hbm", "buf", "admitted", "batched", "held")

    def __init__(self, rid: int, cached: int, remaining: int, path: str, de_tokens: int = 0, pe_load: int = 0,
                 de_engine=None):
        self.rid, self.cached, self.remaining, self.path = rid, cached, remaining, path
        self.de_tokens, self.pe_load, self.de_engine, self.early = de_tokens, pe_load, de_engine, None
        self.t0 = self.t1 = self.admitted = None
        self.started = self.batched = self.held = False
        self.hbm = self.buf = 0.0

    @classmethod
    def placed(cls, d, path: str, de_engine) -> Row:
        """The simulator's one translation of a scheduler decision `d` (`dualjax.core.scheduler.Decision`)
        and its plan (`dualjax.core.policies.Plan`) into a row, in tokens as the plan: `cached` =
        `Plan.loaded` = hit_tokens - recompute_tokens (read by either side), `remaining` = prompt_tokens -
        cached (the misses and the recomputed tail, computed), `de_tokens` (the leading ones, read by the
        DE), `pe_load` = the decision's `pe_tokens`; the deadline stays with the simulation
        (`dualjax.sim.deadline`). `plan` translates back. The runtime's translation, in blocks, is
        `dualjax.runtime.messages.Assign.placed`."""
        r, plan = d.request, d.plan
        loaded = r.hit_tokens - plan.recompute_tokens  # `Plan.loaded`
        return cls(r.id, loaded, r.prompt_tokens - loaded, path, plan.de_tokens, d.pe_tokens, de_engine)

    def plan(self, hit_tokens: int) -> Plan:
        """The plan (without its deadline) of a row of a request of `hit_tokens` hit tokens (`placed`'s
        inverse)."""
        return Plan(self.de_tokens, hit_tokens - self.cached)


class PrefillEngine:
    __slots__ = ("rank", "node", "tx", "rx", "rows", "group", "hbm", "compute_s", "passes", "rows_run", "batches",
                 "cut")

    def __init__(self, rank: int, node: Node, tx: Lane, rx: Lane, hbm: Buffer):
        self.rank, self.node, self.tx, self.rx, self.hbm, self.rows = rank, node, tx, rx, hbm, []
        self.cut = False  # its last plan was cut by the compute quota (a ready row left out or chunked)
        self.group = None
        self.compute_s = 0.0
        self.passes = self.rows_run = 0
        self.batches: deque[list] = deque()  # Basic: batches formed, oldest (computing or next) first

    @property
    def busy_s(self) -> float:
        """Its group's: every member steps in every group pass."""
        return self.group.busy_s


class PeGroup:
    """PE engines that step together (an expert-parallel group over `nodes` nodes)."""

    __slots__ = ("members", "nodes", "busy", "passes", "busy_s")

    def __init__(self, members: list[PrefillEngine], nodes: int):
        self.members, self.nodes, self.busy, self.passes, self.busy_s = members, nodes, False, 0, 0.0
        for pe in members:
            pe.group = self


def _ready(rows: list[Row], now: float, floor_bytes: float, budget: float, seen: list):
    """Layerwise: the rows a pass may take, in FIFO order: read (t1 <= now), and the first row being read
    (its layers arrive during the pass), counting in seen[0] those taken. Lazy, and it stops once the rows'
    prefixes alone (`floor_bytes` per cached token, a lower bound of what `fit_memory` counts) pass
    `budget`: what follows cannot fit."""
    first, held = True, 0.0
    for r in rows:
        if r.t1 is None:
            continue
        if r.t1 <= now or first:
            seen[0] += 1
            yield r
            held += r.cached * floor_bytes
            if held > budget:
                return
        first = False


def _unbatched(rows: list[Row]):
    """Basic: the placed rows whose DE buffer has room and that no batch holds, in FIFO order."""
    for r in rows:
        if r.admitted is not None and not r.batched:
            yield r


class PrefillSide:
    """Mixin of `Simulation`: placement onto a PE up to its passes' end."""

    def _poke(self, pe: PrefillEngine) -> None:
        if not pe.group.busy:
            self._start_group_pass(pe.group)

    def _quota(self) -> float | None:
        """The compute quota per attention layer, s; None without intra-engine scheduling (naive)."""
        return None if self.cfg.scheduler == "naive" else self.cfg.compute_quota_ms / 1e3

    def _pack(self, rows) -> list:
        return pack(rows, self.costs, self._quota(), self.cfg.prefill_chunk, padded=self.hw.padded,
                    layers=self.model.n_layers)

    def _plan(self, pe: PrefillEngine) -> list:
        """The rows (and tokens) of `pe`'s next pass. Layerwise: ready rows packed under the quota, then cut
        to HBM; Basic: its oldest batch once every row of it is in memory. The caller skips a PE without
        rows (a Basic batch holds placed rows only)."""
        if not self.layerwise:
            if pe.batches and all(w.t1 is not None and w.t1 <= self.now for w, _ in pe.batches[0]):
                return pe.batches[0]
            return []
        L, held = self.model.n_layers, self.cfg.layerwise_layers
        seen = [0]
        rows = _ready(pe.rows, self.now, self.kvb * held / L, pe.hbm.budget, seen)
        packed = self._pack(rows)
        if packed and self.cfg.scheduler != "naive":  # `pack` stops early only at the quota
            w, n = packed[-1]
            pe.cut = seen[0] > len(packed) or n < min(w.remaining, self.cfg.prefill_chunk)
        plan = fit_memory(packed, pe.hbm.budget, self.kvb, held, L)
        peak = sum(w.cached + n for w, n in plan) * self.kvb * held / L
        if peak > pe.hbm.peak:
            pe.hbm.peak = peak
        return plan

    # -- Basic: batches formed, then loaded ----------------------------------------------------------
    def _form(self, pe: PrefillEngine) -> None:
        """Basic: form and start loading batches while fewer than 1 + `basic_ahead` are formed and not yet
        computed. A row new to memory needs every layer of its prompt KV in HBM (hbm: for as long as it is
        in any batch formed; host: in the PE buffer, and in HBM only while its batch computes)."""
        host = self.cfg.basic_lands == "host"
        while len(pe.batches) < 1 + self.cfg.basic_ahead:
            plan = self._pack(_unbatched(pe.rows))
            if not plan:
                return
            need = self._need(pe, plan[0][0], host)
            if host:
                plan = fit_free(fit_free(plan, pe.hbm.budget, self._prompt_bytes), pe.node.buffer.free, need)
            else:
                plan = fit_free(plan, pe.hbm.free, need)
            if not plan:
                return  # the oldest row waits for memory a pass will release
            pe.batches.append(plan)
            if host:
                pe.hbm.peak = max(pe.hbm.peak, sum(self._prompt_bytes(w) for w, _ in plan))
            for w, _ in plan:
                w.batched = True
            for w, _ in plan:
                if not w.held:  # new to memory: take it and load
                    self._load(w, pe, host)
            self.at(max(w.t1 for w, _ in plan), self._poke, pe)  # loaded: it may compute

    def _prompt_bytes(self, w: Row) -> float:
        return (w.cached + w.remaining) * self.kvb

    def _need(self, pe: PrefillEngine, first: Row, host: bool):
        """The memory a Basic row new to it takes, bytes (0 once it holds it); a row larger than the whole
        budget is an error, not a wait."""
        if not first.held and self._prompt_bytes(first) > pe.hbm.budget:
            raise SimError(f"a request needs {self._prompt_bytes(first) / 1e9:.2f} GB of device memory for its "
                           f"prompt's KV, more than PE {pe.rank}'s {pe.hbm.budget / 1e9:.2f} GB")
        if host:  # the hit KV read by the PE waits in its buffer; the DE's share waits in the DE buffer
            return lambda w: 0.0 if w.held else (w.cached - w.de_tokens) * self.kvb
        return lambda w: 0.0 if w.held else self._prompt_bytes(w)

    def _load(self, w: Row, pe: PrefillEngine, host: bool) -> None:
        """Take a Basic row's memory and start its load: the PE's storage read of its share (hbm: on into
        HBM), and the relay of the DE's share (read into the DE buffer when placed) into HBM once that read
        is done (host: the relay waits for the pass)."""
        w.held = True
        self.cols.load_wait[w.rid] = self.now - w.admitted
        if not host:
            w.hbm = self._prompt_bytes(w)
            pe.hbm.take(w.hbm)
        ready = None  # the DE's share: in the DE buffer (host), or relayed into HBM
        if w.de_tokens:
            ready = w.t1 if host else self._relay(w, pe, max(self.now, w.t1), w.de_tokens * self.kvb)
        own = w.cached - w.de_tokens
        if own or w.path != "de":
            if host:
                w.buf = own * self.kvb
                pe.node.buffer.take(w.buf)
            self._read(w, pe.node, pe, tokens=own, into_hbm=not host)
        if ready is not None:
            w.t1 = max(w.t1, ready) if own else ready

    # -- passes ------------------------------------------------------------------------------------
    def _start_group_pass(self, g) -> None:
        assert not g.busy, "one pass at a time per PE group"
        plans = [(pe, kept) for pe in g.members if pe.rows and (kept := self._plan(pe))]
        if not plans:
            return
        now, end, outputs = self.now, self.now, []
        if self.layerwise and self.cfg.scheduler != "naive":  # did the quota cut any member's batch?
            self.quota_cuts.append((now, any(pe.cut for pe, _ in plans)))
        if len(g.members) > 1:  # intra-engine balance: max / mean of the members' attention time (none: 0)
            attention = self.costs.attention
            times = [sum(attention(w.cached, n) for w, n in kept) for _, kept in plans]
            total = sum(times)
            if total > 0:
                self.attention_balance.append((now, max(times) * len(g.members) / total))
        for pe, kept in plans:
            e, out = self._member_pass(pe, kept, g.nodes)
            if e > end:
                end = e
            outputs += out
        for pe, kept in plans:
            for w, _ in kept:
                if not w.started:
                    w.started = True
                    self.cols.prefill_start[w.rid] = now
            pe.passes += 1
            pe.rows_run += len(kept)
        g.busy_s += end - now
        g.busy = True
        g.passes += 1
        self.at(end, self._end_group_pass, g, plans, outputs)
        if self.shared:
            self._retime_decoders()

    def _member_pass(self, pe: PrefillEngine, kept: list, ep_nodes: int) -> tuple[float, list]:
        """When `pe`'s part of a group pass ends, and the output transfers it started (layerwise)."""
        now, L = self.now, self.model.n_layers
        dur = self.costs.pass_seconds([(w.cached, n) for w, n in kept])
        if self.shared:
            dur *= self._slowdown(pe)
        pe.compute_s += dur
        ep = self.costs.ep_bytes(sum(n for _, n in kept), ep_nodes)
        if ep:  # the MoE all-to-all overlaps the compute (two micro-batches); model traffic on the CNIC
            ep_s = ep / model_line_rate(pe.tx, pe.rx, now)
            if ep_s > dur:
                dur = ep_s
            util = ep_s / dur
            carry_model(pe.tx, pe.rx, util if util < 1.0 else 1.0)
        end, outputs = now + dur, []
        if not self.layerwise:
            if self.cfg.basic_lands == "host":  # the batch moves from the host buffers into HBM first
                for w, _ in kept:
                    if w.cached:
                        end = max(end, self._to_gpu(w, pe, now, w.cached * self.kvb) + dur)
            return end, outputs
        first = kept[0][0]
        if first.t1 > now:  # layerwise over a loading row: layer l runs once layer l has arrived
            end = max(end, first.t0 + (first.t1 - first.t0) / L + dur, first.t1 + dur / L)
        for w, n in kept:  # the prefix KV moves into HBM layer by layer while the pass computes
            if w.cached:  # its last layer computes once it has arrived and been read
                arrive = self._to_gpu(w, pe, now, w.cached * self.kvb)
                last = (arrive if arrive > w.t1 else w.t1) + dur / L
                if last > end:
                    end = last
            if n == w.remaining:  # the last chunk: its KV streams out to the DE layer by layer
                outputs.append((w.rid, self._output(w, pe, now)))
        return end, outputs

    def _to_gpu(self, w: Row, pe: PrefillEngine, t: float, nbytes: float) -> float:
        """Move `nbytes` of a row's prefix KV from the buffers that hold it to the PE's HBM: on its first pass
        the relay of the hit tokens its DE read, from the DE buffer, and a loopback over the PE's compute NIC
        of the rest. A chunked row's later passes find the relayed share on the PE's host, as the runtime
        keeps it there, and the chunks it computed: a loopback of all of it. Returns the end."""
        relay = 0.0 if w.started else w.de_tokens * self.kvb
        if relay > nbytes:
            relay = nbytes
        end = self._relay(w, pe, t, relay) if relay else t
        if nbytes > relay or not relay:
            loaded = self._loopback(pe, t, nbytes - relay)
            if loaded > end:
                end = loaded
        return end

    def _relay(self, w: Row, pe: PrefillEngine, t: float, nbytes: float) -> float:
        """`nbytes` of a row's prefix KV from its DE's buffer to the PE's HBM. Returns the end."""
        de = w.de_engine
        de.node.kv_sent_bytes += nbytes
        end = latest(de.node.dram.reserve(t, nbytes), de.tx.reserve(t, nbytes), pe.rx.reserve(t, nbytes))
        if not self.kv_priority:
            self._kv_queued(de)
        return end

    def _loopback(self, pe: PrefillEngine, t: float, nbytes: float) -> float:
        """`nbytes` from the PE's buffer to its HBM. Returns the end."""
        end = pe.node.dram.reserve(t, nbytes)
        if self.hw.loopbacks:
            end = latest(end, pe.tx.reserve(t, nbytes), pe.rx.reserve(t, nbytes))
        return end

    def _output(self, w: Row, pe: PrefillEngine, t: float) -> float:
        """The prompt's KV to the DE buffer: all but the hit tokens the DE read (hit + miss on the PE path,
        miss on the DE path). Returns the end."""
        c = self.cols
        rid = w.rid
        out = (c.prompt_tokens[rid] - w.de_tokens) * self.kvb
        pe.node.kv_sent_bytes += out
        de = w.de_engine
        end = latest(pe.tx.reserve(t, out), de.rx.reserve(t, out), de.node.dram.reserve(t, out))
        if not self.kv_priority:
            self._kv_queued(de)
        return end

    def _end_group_pass(self, g, plans, outputs) -> None:
        streamed = dict(outputs)
        for pe, kept in plans:
            self._end_member_pass(pe, kept, streamed)
        for pe, _ in plans:  # only a member with a batch set its model traffic (`_member_pass`)
            carry_model(pe.tx, pe.rx, 0.0)
        if not self.layerwise:  # memory was released: the next batches may form and load
            for pe in g.members:
                self._form(pe)
        g.busy = False  # only now: releasing memory above may issue reads that poke this group
        self._start_group_pass(g)
        if self.shared and not g.busy:
            self._retime_decoders()

    def _end_member_pass(self, pe: PrefillEngine, kept, streamed: dict) -> None:
        c = self.cols
        if not self.layerwise:
            pe.batches.popleft()
        for w, n in kept:
            w.cached += n
            w.remaining -= n
            w.batched = False
            if w.remaining:
                continue
            rid = w.rid
            pe.rows.remove(w)
            c.prefill_end[rid] = c.first_token[rid] = self.now  # the pass's last layer samples the first token
            self.scheduler.update(pe.rank, -1, -w.pe_load)
            self.dirty = True
            arrive = streamed[rid] if rid in streamed else self._output(w, pe, self.now)
            if w.buf:
                pe.node.buffer.release(w.buf)
            if w.hbm:
                pe.hbm.release(w.hbm)
            self.at(arrive, self._join, w.de_engine, rid)
