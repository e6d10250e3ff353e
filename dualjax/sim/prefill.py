"""The prefill side of the simulation: PE engines, their expert-parallel groups, device memory and passes.

A PE group (the PE GPUs of up to `Hardware.ep_gpus` GPUs, whole nodes) steps together: when it
is idle and a member has a row ready, every member packs its own ready rows with the runtime's
`batching.pack` (the compute quota on the predicted attention-layer time, docs/paper.md §7) and the pass
ends when its slowest member ends (an expert-parallel step: the MoE all-to-all waits for every
member). A member's pass takes the profile's time at the batch's efficiency, overlapped with its
EP all-to-all on its compute NIC (model traffic, high priority).

Device memory (`PrefillEngine.hbm`): Basic (not layerwise) reserves every layer of a row's prompt
KV (hit + miss) before its storage read starts and holds it until the row's last pass ends, so
HBM caps both its reads in flight and its batch; the read lands in HBM (storage -> PE buffer ->
loopback over the PE's compute NIC, or the relay from the DE buffer). Layerwise holds two layers
of the batch's KV at a time, so HBM bounds the batch only; the row's hit KV waits in the PE or
DE host buffer and moves layer by layer during the pass (loopback or relay), the pass ending no
earlier than its last layer's arrival plus that layer's compute.
"""

from __future__ import annotations

from dualjax.core.batching import fit_memory, pack
from dualjax.sim.resources import Buffer, Lane, Node


class Row:
    """A request on a PE (a `batching.Work`): its storage read [t0, t1] once issued (t1: in the buffer
    that feeds the pass, or in HBM for Basic), the path, and what it holds."""

    __slots__ = ("rid", "cached", "remaining", "t0", "t1", "started", "path", "hbm", "buf", "hbm_asked")

    def __init__(self, rid: int, cached: int, remaining: int, path: str):
        self.rid, self.cached, self.remaining, self.path = rid, cached, remaining, path
        self.t0 = self.t1 = None
        self.started = False
        self.hbm = self.buf = 0.0
        self.hbm_asked = 0.0


class PrefillEngine:
    __slots__ = ("rank", "node", "tx", "rx", "rows", "group", "hbm", "busy_s", "compute_s", "passes", "rows_run")

    def __init__(self, rank: int, node: Node, tx: Lane, rx: Lane, hbm: Buffer):
        self.rank, self.node, self.tx, self.rx, self.hbm, self.rows = rank, node, tx, rx, hbm, []
        self.group = None
        self.busy_s = self.compute_s = 0.0
        self.passes = self.rows_run = 0


class PeGroup:
    """PE engines that step together (an expert-parallel group over `nodes` nodes)."""

    __slots__ = ("members", "nodes", "busy", "passes")

    def __init__(self, members: list[PrefillEngine], nodes: int):
        self.members, self.nodes, self.busy, self.passes = members, nodes, False, 0
        for pe in members:
            pe.group = self


def _ready(rows: list[Row], now: float, layerwise: bool):
    """The rows a pass may take, in FIFO order: read (t1 <= now), and layerwise also the first row being
    read (its layers arrive during the pass). Lazy: packing stops at the quota, long before a long queue's end."""
    first = True
    for r in rows:
        if r.t1 is None:
            continue
        if r.t1 <= now or (first and layerwise):
            yield r
        first = False


class PrefillSide:
    """Mixin of `Simulation`: placement onto a PE up to its passes' end."""

    def _poke(self, pe: PrefillEngine) -> None:
        if not pe.group.busy:
            self._start_group_pass(pe.group)

    def _plan(self, pe: PrefillEngine) -> list:
        """The rows (and tokens) of `pe`'s next pass: ready rows packed under the quota, then cut to HBM."""
        plan = pack(_ready(pe.rows, self.now, self.layerwise), self.costs, self.cfg.compute_quota_ms / 1e3,
                    self.cfg.prefill_chunk, padded=self.hw.padded)
        if not self.layerwise:  # Basic rows already hold every layer of their KV in HBM
            return plan
        return fit_memory(plan, pe.hbm.budget, self.kvb, 2, self.model.n_layers)  # two layers in flight

    def _start_group_pass(self, g) -> None:
        assert not g.busy, "one pass at a time per PE group"
        plans = [(pe, kept) for pe in g.members if (kept := self._plan(pe))]
        if not plans:
            return
        now, end, outputs = self.now, self.now, []
        for pe, kept in plans:
            e, out = self._member_pass(pe, kept, g.nodes)
            end = max(end, e)
            outputs += out
        for pe, kept in plans:
            for w, _ in kept:
                if not w.started:
                    w.started = True
                    self.cols["prefill_start"][w.rid] = now
            pe.passes += 1
            pe.rows_run += len(kept)
        for pe in g.members:
            pe.busy_s += end - now
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
            ep_s = ep / min(pe.tx.model_rate(now), pe.rx.model_rate(now))
            pe.tx.model_util = pe.rx.model_util = min(1.0, ep_s / max(dur, ep_s))
            dur = max(dur, ep_s)
        end, outputs = now + dur, []
        first = kept[0][0]
        if first.t1 > now:  # layerwise over a loading row: layer l runs once layer l has arrived
            end = max(end, first.t0 + (first.t1 - first.t0) / L + dur, first.t1 + dur / L)
        if self.layerwise:
            for w, n in kept:  # the prefix KV moves into HBM layer by layer while the pass computes
                if w.cached:
                    arrive = max(self._to_gpu(w, pe, now, w.cached * self.kvb), w.t1)
                    end = max(end, arrive + dur / L)
                if n == w.remaining:  # the last chunk: its KV streams out to the DE layer by layer
                    outputs.append((w.rid, self._output(w, pe, now)))
        return end, outputs

    def _to_gpu(self, w: Row, pe: PrefillEngine, t: float, nbytes: float) -> float:
        """Move `nbytes` of a row's prefix KV from the buffer that holds it to the PE's HBM: a loopback
        over the PE's compute NIC (PE path) or the relay from the DE buffer (DE path). Returns the end."""
        if w.path == "de":
            de = self.engines[int(self.cols["de"][w.rid])]
            de.node.relay_bytes += nbytes
            end = max(de.node.dram.reserve(t, nbytes)[1], de.tx.reserve(t, nbytes)[1], pe.rx.reserve(t, nbytes)[1])
            self._kv_queued(de)
            return end
        end = pe.node.dram.reserve(t, nbytes)[1]
        if self.hw.loopbacks:
            end = max(end, pe.tx.reserve(t, nbytes)[1], pe.rx.reserve(t, nbytes)[1])
        return end

    def _output(self, w: Row, pe: PrefillEngine, t: float) -> float:
        """The prompt's KV to the DE buffer (hit + miss on the PE path, miss on the DE path). Returns the end."""
        c = self.cols
        rid = w.rid
        hit, prompt = int(c["hit_tokens"][rid]), int(c["prompt_tokens"][rid])
        out = (prompt if w.path != "de" else prompt - hit) * self.kvb
        de = self.engines[int(c["de"][rid])]
        end = max(pe.tx.reserve(t, out)[1], de.rx.reserve(t, out)[1], de.node.dram.reserve(t, out)[1])
        self._kv_queued(de)
        return end

    def _end_group_pass(self, g, plans, outputs) -> None:
        streamed = dict(outputs)
        for pe, kept in plans:
            self._end_member_pass(pe, kept, streamed)
        for pe in g.members:
            pe.tx.model_util = pe.rx.model_util = 0.0
        g.busy = False  # only now: releasing memory above may issue reads that poke this group
        self._start_group_pass(g)
        if self.shared and not g.busy:
            self._retime_decoders()

    def _end_member_pass(self, pe: PrefillEngine, kept, streamed: dict) -> None:
        c = self.cols
        for w, n in kept:
            w.cached += n
            w.remaining -= n
            if w.remaining:
                continue
            rid = w.rid
            pe.rows.remove(w)
            c["prefill_end"][rid] = self.now
            self.scheduler.update(pe.rank, -1, -int(c["prompt_tokens"][rid]))
            self.dirty = True
            arrive = streamed[rid] if rid in streamed else self._output(w, pe, self.now)
            if w.buf:
                pe.node.buffer.release(w.buf)
            if w.hbm:
                pe.hbm.release(w.hbm)
            self.at(max(arrive, self.now), self._join, self.engines[int(c["de"][rid])], rid)
