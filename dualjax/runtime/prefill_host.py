"""The prefill host (PE): computes the miss tokens of requests layer by layer.

Prefill runs in passes: each packs requests FIFO while the predicted time of one attention layer
over the batch (a fit profiled on this engine) stays within the compute quota, chunking the request
that would overflow (docs/paper.md §7; `scheduler` naive: no quota, every ready request), and
computes them as rows of one layerwise prefill. For each layer it sends each row's KV to its DE:
the miss tokens, and the hit tokens this host read (all of them on the PE path, none on the DE path,
docs/paper.md §3). A request's plan (`Assign`) may split its hit blocks: the DE reads and relays the
leading ones, this host reads the rest, and each layer's prefix is the relayed part then its own. Hit
blocks the plan recomputes are not loaded: they start the row's new tokens. A request's chunks hold
at most `prefill_chunk` tokens, which bounds attention memory. How the hit KV gets in, as in the
simulator (`dualjax.sim.prefill`):

* Layerwise prefill: per request, FIFO, reserve PE buffer room, then read this host's share of the
  hit blocks through its storage NIC and tell the DE to relay its share layer by layer; a pass takes
  the requests loaded, and the oldest while it loads (layer l+1 arrives while layer l computes).
  Device memory (`pe_hbm_mb`) holds `layerwise_layers` layers of a pass.
* Without it (the Basic baseline): a batch is packed from the requests whose DE has room, cut to the
  memory left, and only then loaded (its reads started, or the DE told to relay); it computes once
  every row is loaded. `basic_ahead` batches may load while one computes; with `basic_lands` hbm
  the PE buffer stands for device memory (at most `pe_hbm_mb`) and holds every layer of the prompt
  KV of every batch formed, with host it holds the loaded hit KV and `pe_hbm_mb` bounds one batch.

If a block turns out bad mid-way (fewer valid blocks than planned), that request restarts with
fewer hit blocks and still yields the reference tokens.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from collections import deque

import numpy as np

from dualjax.core.batching import Work, fit_free, fit_memory, pack
from dualjax.core.policies import get_policy, layerwise_for
from dualjax.core.records import HostStats, PassShape, PassTally
from dualjax.runtime.buffers import HostBuffer, RequestKV
from dualjax.runtime.host import Host, shared
from dualjax.runtime.messages import Assign, LayerKV, PrefillDone, PrefillFinished, Ready
from dualjax.runtime.startup import attention_fit, prefill_tokens_per_s
from dualjax.runtime.warmup import warm_prefill, warm_shapes
from kvstore import block_chain
from models import Layerwise
from models.buckets import DEFAULT_BUCKETS


class _Inbox:
    """Messages of one request from its DE: `Ready`, or relayed `LayerKV` kept for restarts."""

    def __init__(self):
        self.cond = threading.Condition()
        self.ready = False
        self.layers: dict[int, LayerKV] = {}

    def put(self, msg) -> None:
        with self.cond:
            if isinstance(msg, Ready):
                self.ready = True
            else:
                self.layers[msg.layer] = msg
            self.cond.notify_all()

    def wait(self, pred, stop: threading.Event):
        with self.cond:
            while not pred():
                if stop.is_set():
                    raise RuntimeError("host stopping")
                self.cond.wait(0.1)


class _Row:
    """A request on this PE from admission until its prefill is done: what it reads from, how many
    hit blocks it uses, and the KV of the chunks computed so far (per layer, host arrays). Basic: its
    memory and read come when a batch takes it (`attach`); `batched` while a batch formed holds it."""

    def __init__(self, a: Assign, layout):
        self.a, self.rkv, self.ticket, self.nbytes, self.source, self.loaded = a, None, None, 0, None, None
        self.restarts, self.t_pass, self.batched = 0, None, False
        self.restart(a.hit_blocks, layout, count=False)

    def attach(self, rkv: RequestKV, ticket, nbytes: int, source, loaded) -> "_Row":
        self.rkv, self.ticket, self.nbytes, self.source, self.loaded = rkv, ticket, nbytes, source, loaded
        return self

    def restart(self, hit: int, layout, count: bool = True) -> None:
        self.hit, self.start = hit, hit * layout.block_tokens
        self.next = self.start  # first token not computed yet
        self.done: list[list[np.ndarray]] = [[] for _ in range(layout.n_layers)]
        self.restarts += count


class PrefillHost(Host):
    role = "prefill"

    def __init__(self, transport, cfg, params=None):
        super().__init__(transport, cfg, params)
        room = cfg.pe_buffer_mb * 2**20
        # resolved only with a budget: a custom policy object run in-process is known here by name alone
        if cfg.pe_hbm_mb is not None and cfg.basic_lands == "hbm" and not layerwise_for(get_policy(cfg.policy),
                                                                                          cfg.layerwise):
            room = min(room, cfg.pe_hbm_mb * 1e6)  # Basic loads into device memory: the budget bounds its batches
        self.buffer = HostBuffer("PE", int(room))
        self.buffer.check_fits(self.layout.block_bytes)
        self.inboxes: dict[int, _Inbox] = {}  # by request, `shared` between threads
        self.admit_q: queue.Queue = queue.Queue()
        self.work_q: queue.Queue = queue.Queue()
        self.busy_s = 0.0
        self.passes, self.pass_s, self.pass_predicted_s = 0, 0.0, 0.0
        self.pass_shapes: dict[PassShape, PassTally] = {}  # by padded shape, for `dualjax calibrate`
        self.fit = attention_fit(cfg.model)
        self.spawn(self._admit_loop, name="admit")
        self.spawn(self._work_loop, name="worker")

    def warm_up(self) -> None:
        warm_prefill(self.params, self.model_cfg, warm_shapes(self.cfg, self.model_cfg, self.layout.block_tokens))
        self.prefill_rate = prefill_tokens_per_s(self.cfg.model)  # rank 0's thresholds: this node's speed

    def handle(self, src, msg) -> None:
        if isinstance(msg, Assign):
            self.expect_read(msg)
            self.admit_q.put(msg)
        elif isinstance(msg, (Ready, LayerKV)):
            shared(self.inboxes, msg.request_id, _Inbox).put(msg)
        else:
            raise TypeError(f"prefill host got unexpected {type(msg).__name__} from rank {src}")

    def _admit_loop(self) -> None:
        """FIFO admission. Layerwise: reserve buffer room, start the storage read or tell the DE to relay;
        Basic: nothing yet (a batch loads its rows, `_form`)."""
        for a in self.drain(self.admit_q):
            row = _Row(a, self.layout)
            if a.layerwise:
                nbytes = a.hit_blocks * self.layout.block_bytes
                if not self.buffer.reserve(nbytes, self.stop):
                    return
                self._load(row, nbytes)
            self.work_q.put(row)

    def _load(self, row: _Row, nbytes: int) -> None:
        """Start a row's load into the `nbytes` of buffer it holds: the storage read of this host's share of
        the hit blocks, and the DE told to relay its share."""
        a = row.a
        rkv, ticket = RequestKV(self.layout, a.hit_blocks * self.layout.block_tokens, self.buffer.pool), None
        if a.reads(self.role):
            hashes = [b.hash for b in block_chain(a.request.tokens, self.layout)[a.de_blocks:a.hit_blocks]]
            ticket = self.snic.read(self.store, hashes, out=rkv.blocks[a.de_blocks:], layer_major=a.layerwise,
                                    deadline=a.read_by)
        if a.de_blocks:  # the DE reads its share; tell it we have room for its relay
            self.transport.send(a.de, Ready(a.request.id))
        self.expect_read(a, -1)
        row.attach(rkv, ticket, nbytes, *self._layer_source(a, rkv, ticket))

    def _quota(self) -> float | None:
        """The compute quota per attention layer, s; None without intra-engine scheduling (naive)."""
        return None if self.cfg.scheduler == "naive" else self.cfg.compute_quota_ms / 1e3

    def _pack(self, rows: list[_Row]) -> list:
        return pack([Work(r, r.next, r.a.request.prompt_len - r.next) for r in rows], self.fit, self._quota(),
                    self.cfg.prefill_chunk, layers=self.layout.n_layers)

    def _form(self, rows: list[_Row], batches: deque) -> None:
        """Basic: form and load batches while fewer than 1 + `basic_ahead` are formed and not yet computed:
        FIFO over the rows whose DE has room and that no batch holds, packed, then cut to the memory left
        (hbm: the buffer holds every layer of each new row's prompt KV; host: its hit KV, and `pe_hbm_mb`
        bounds the batch's prompt KV)."""
        while len(batches) < 1 + self.cfg.basic_ahead:
            free = [r for r in rows if not r.batched and shared(self.inboxes, r.a.request.id, _Inbox).ready]
            plan = self._pack(free)
            if self.cfg.basic_lands == "host" and self.cfg.pe_hbm_mb is not None:
                plan = fit_free(plan, self.cfg.pe_hbm_mb * 1e6, lambda w: self._basic_bytes(w.key, "hbm"))
            plan = fit_free(plan, self.buffer.budget - self.buffer.used,
                            lambda w: 0 if w.key.rkv is not None else self._basic_bytes(w.key, self.cfg.basic_lands))
            if not plan:
                if free and not batches:  # nothing holds memory, yet the oldest does not fit: never will
                    self.buffer.check_fits(self._basic_bytes(free[0], self.cfg.basic_lands))
                return
            for w, _ in plan:
                w.key.batched = True
                if w.key.rkv is None:
                    nbytes = self._basic_bytes(w.key, self.cfg.basic_lands)
                    self.buffer.reserve(nbytes, self.stop)  # fits: this thread alone reserves for Basic
                    self._load(w.key, nbytes)
            batches.append([(w.key, n) for w, n in plan])

    def _basic_bytes(self, r: _Row, lands: str) -> int:
        """What a Basic row holds: in device memory (hbm) every layer of its prompt's KV, in the PE buffer
        (host) its hit blocks."""
        if lands == "hbm":
            return RequestKV.nbytes(self.layout, r.a.request.prompt_len)
        return r.a.hit_blocks * self.layout.block_bytes

    def _next_pass(self, rows: list[_Row], batches: deque) -> list:
        """[(row, tokens)] of the next pass, or [] when none is ready. Basic: the oldest batch once every row
        is loaded. Layerwise: the ready rows packed, then cut to device memory (`layerwise_layers` layers)."""
        if rows and not rows[0].a.layerwise:  # every Assign carries the run's one layerwise switch
            self._form(rows, batches)
            return batches[0] if batches and all(r.loaded() for r, _ in batches[0]) else []
        ready = self._ready(rows)
        if not ready:
            return []
        plan = self._pack(ready)
        if self.cfg.pe_hbm_mb is not None:
            L = self.layout.n_layers
            plan = fit_memory(plan, self.cfg.pe_hbm_mb * 1e6, self.layout.block_bytes / self.layout.block_tokens,
                              self.cfg.layerwise_layers, L)
        return [(w.key, n) for w, n in plan]

    def _work_loop(self) -> None:
        """Prefill passes: each packs requests FIFO within the compute quota (the one that overflows gets a
        chunk) and computes them as rows of one layerwise prefill."""
        rows: list[_Row] = []
        batches: deque[list] = deque()  # Basic: the batches formed, oldest first
        while not self.stop.is_set():
            try:
                while True:  # take what was admitted; wait a little only when idle
                    rows.append(self.work_q.get(timeout=0.05 if not rows else 0.0))
            except queue.Empty:
                pass
            plan = self._next_pass(rows, batches)
            if not plan:
                time.sleep(0.002)
                continue
            if not plan[0][0].a.layerwise:  # Basic's batch: computed now (or, on a restart, formed again)
                batches.popleft()
                for r, _ in plan:
                    r.batched = False
            cached, new = max(r.next for r, _ in plan), max(n for _, n in plan)
            t0 = time.perf_counter()
            finished = self._pass(plan)
            seconds = time.perf_counter() - t0
            self.passes += 1  # against the fit's prediction, and by padded shape (`dualjax calibrate`)
            self.pass_s += seconds
            self.pass_predicted_s += len(plan) * self.fit.predict(cached, new)
            shape = PassShape(*DEFAULT_BUCKETS.pass_shape(len(plan), cached, new))
            tally = self.pass_shapes.setdefault(shape, PassTally(shape))
            tally.passes += 1
            tally.seconds += seconds
            for r in finished:
                rows.remove(r)
                self.buffer.release(r.nbytes)
                self.inboxes.pop(r.a.request.id, None)

    def _ready(self, rows: list["_Row"]) -> list["_Row"]:
        """Rows a pass can take, FIFO: the DE must have room. The oldest may still be loading
        (layerwise: it computes layer l as layer l arrives); later ones join only fully loaded,
        so a pass never waits for reads queued behind its own rows'."""
        ready = [r for r in rows if shared(self.inboxes, r.a.request.id, _Inbox).ready]
        return [r for i, r in enumerate(ready) if r.loaded() or (i == 0 and r.a.layerwise)]

    def _layer_source(self, a: Assign, rkv: RequestKV, ticket):
        """(fn(layer) -> (valid blocks, relayed KV or None, own KV), fn() -> all loaded?): a layer's hit KV is
        the DE's relay of the first `de_blocks` blocks [de_blocks*T, *record], then what this host read of
        the rest [(hit_blocks - de_blocks)*T, *record]; valid counts leading good blocks over both."""
        T, L, inbox = self.layout.block_tokens, self.layout.n_layers, shared(self.inboxes, a.request.id, _Inbox)
        de = a.de_blocks

        def source(layer):
            relay, valid = None, de
            if de:
                inbox.wait(lambda: layer in inbox.layers, self.stop)
                msg = inbox.layers[layer]
                relay, valid = msg.kv.reshape(-1, *self.layout.record_shape), msg.valid  # [blocks, T, ...] -> tokens
            if ticket and valid == de:
                valid = de + ticket.wait_layer(layer)
            return valid, relay, rkv.layer(layer, a.hit_blocks * T)[de * T:]

        def loaded() -> bool:
            return (not de or len(inbox.layers) == L) and (not ticket or ticket.layers_done >= L)
        return source, loaded

    def _pass(self, plan: list[tuple["_Row", int]]) -> list["_Row"]:
        """One prefill pass over (row, new tokens) pairs; returns the rows whose prefill finished.
        A bad block found on the way restarts that row with fewer hit blocks and drops the pass."""
        L = self.layout.n_layers
        toks = np.zeros((len(plan), max(n for _, n in plan)), np.int32)
        for b, (r, n) in enumerate(plan):
            toks[b, :n] = r.a.request.tokens[r.next:r.next + n]
            r.t_pass = r.t_pass or time.time()
        lw = Layerwise(self.params, self.model_cfg, toks, prefix_len=[r.next for r, _ in plan])
        fresh: list[list[np.ndarray]] = [[] for _ in plan]  # per row: this pass's KV, by layer
        previous = None
        for layer in range(L):
            hits = []  # per row: (relayed KV or None, own KV)
            for r, _ in plan:
                valid, *hit_kv = r.source(layer)
                if valid < r.hit:
                    r.restart(valid, self.layout)
                    return []
                hits.append(hit_kv)
            kv = lw.layer_padded(layer, self._prefix(lw, plan, layer, hits))  # dispatched; runs while we send the last
            kv.copy_to_host_async()  # its device->host copy starts when it is computed, not when we ask
            if previous is not None:
                self._send_layer(plan, fresh, *previous)
            previous = (layer, hits, kv)
        self._send_layer(plan, fresh, *previous)
        logits, finished = None, []
        for b, (r, n) in enumerate(plan):
            for layer in range(L):
                r.done[layer].append(fresh[b][layer])
            r.next += n
            if r.next == r.a.request.prompt_len:
                if logits is None:  # each row's last token's logits, [rows, V]: no program per length
                    logits = np.asarray(lw.logits_at(np.array([m - 1 for _, m in plan], np.int32)))
                self._finish(r, int(np.argmax(logits[b])))  # greedy, on the host: no program to compile
                finished.append(r)
        return finished

    @staticmethod
    def _hit_pieces(r: "_Row", relay, own) -> list[np.ndarray]:
        """A row's hit KV in use ([0, r.start) tokens) as arrays to concatenate: the relayed part, then
        its own; never empty (an empty own part when it has no hit)."""
        de = 0 if relay is None else relay.shape[0]
        pieces = [relay[:r.start]] if relay is not None else []
        if r.start > de or not pieces:
            pieces.append(own[:max(0, r.start - de)])
        return pieces

    def _prefix(self, lw: Layerwise, plan, layer: int, hits) -> np.ndarray:
        """Layer `layer`'s prefix KV of every row: its hit KV (relayed, then its own) then the KV of its
        chunks computed so far, zero-padded, assembled in the pass's own buffer (`lw.prefix_buffer()`,
        which the pass takes uncopied). A lone row with no computed chunk and its hit KV in one piece
        is that piece as it lies in the PE buffer or the relay (a view: no gather; the pass copies it once)."""
        first = plan[0][0]
        if len(plan) == 1 and first.next == first.start:
            pieces = self._hit_pieces(first, *hits[0])
            if len(pieces) == 1:
                return pieces[0][None]
        prefix = lw.prefix_buffer()
        for b, (r, _) in enumerate(plan):
            np.concatenate([*self._hit_pieces(r, *hits[b]), *r.done[layer]], out=prefix[b, :r.next])  # no temporary
        return prefix

    def _send_layer(self, plan, fresh, layer: int, hits, kv) -> None:
        """Send each row's layer KV to its DE (with a row's first chunk, the KV of the hit tokens this host
        read, which the DE lacks) and keep it as host arrays in `fresh`. The layer's KV comes to the host
        once, by the copy started when it was dispatched; rows are views of it."""
        host = np.asarray(kv)
        T = self.layout.block_tokens
        for b, (r, n) in enumerate(plan):
            de = r.a.de_blocks * T
            if r.start > de and r.next == r.start:
                self.transport.send(r.a.de, LayerKV(r.a.request.id, layer, de, hits[b][1][:r.start - de]))
            miss = host[b, :n]
            self.transport.send(r.a.de, LayerKV(r.a.request.id, layer, r.next, miss))
            fresh[b].append(miss)

    def _finish(self, r: "_Row", first: int) -> None:
        times = {"prefill_start": r.t_pass, "prefill_end": time.time(), "restarts": r.restarts}
        self.busy_s += times["prefill_end"] - r.t_pass
        self.transport.send(r.a.de, PrefillDone(r.a.request.id, r.hit, first, times))
        self.transport.send(0, PrefillFinished(r.a.request.id))

    def stats(self) -> HostStats:
        return dataclasses.replace(
            super().stats(), busy_s=self.busy_s, buffer_peak_bytes=self.buffer.peak,
            buffer_budget_bytes=self.buffer.budget, passes=self.passes, pass_s=self.pass_s,
            pass_predicted_s=self.pass_predicted_s, pass_shapes=list(self.pass_shapes.values()),
            pack_fit=dataclasses.astuple(self.fit))
