"""The decode host (DE): holds prompt KV in its DE buffer, decodes, writes full blocks back.

Per request: reserve DE buffer room (FIFO; a request that does not fit waits) and tell the PE;
on the DE read path (or for the DE's share of a split plan) also read those hit blocks through this
host's storage NIC and relay them to the PE layer by layer (once the PE has room). Layer KV from the
PE is merged into the buffer.
When prefill is done the prompt KV moves into a decode slot (the device memory), waiting in the DE
buffer while every slot is busy, and rank 0 hears of it (`KvIn`: what resident `de_memory` counts);
all slots decode together (fixed
shapes, so a request's tokens do not depend on its neighbours); every block that fills (prompt
or generated tokens) is written to the store by a writer thread, and `Complete` goes to rank 0
only after the request's blocks are in the store, so its next turn can hit them.
"""

from __future__ import annotations

import collections
import dataclasses
import queue
import threading
import time

import numpy as np

from dualjax.core.lengths import decode_capacity as lengths_capacity
from dualjax.core.lengths import longest_context
from dualjax.core.records import HostStats
from dualjax.core.workload import PRESETS, get_workload, load_workload, max_context, turn_lengths
from dualjax.runtime.buffers import HostBuffer, RequestKV
from dualjax.runtime.host import Host, shared
from dualjax.runtime.messages import Assign, Complete, KvIn, LayerKV, PrefillDone, Ready
from dualjax.runtime.warmup import prompt_lengths, warm_decode
from kvstore import block_chain
from models import DecodeCache, greedy
from models.buckets import DEFAULT_BUCKETS


def decode_capacity(cfg, model_cfg) -> int:
    """Tokens per decode slot (`dualjax.core.lengths.decode_capacity`, as the simulator's): the workload's
    longest context, bucketed, at most the model's context; the same on every run of
    that workload, so decode programs (and hence tokens) do not depend on the run. A preset's
    contexts come from its turn lengths alone (no token ids drawn); a file is read as it is."""
    if cfg.workload in PRESETS:
        spec = get_workload(cfg.workload, agents=cfg.agents, turns=cfg.turns)
        lengths = (turn_lengths(spec, agent, cfg.workload_seed) for agent in range(spec.agents))
        longest = longest_context(lengths)
    else:
        longest = max_context(load_workload(cfg.workload, model_cfg.vocab, cfg.workload_seed, cfg.agents))
    return lengths_capacity(longest, model_cfg.max_seq_len, DEFAULT_BUCKETS)


class _Live:
    """A request on this DE, from admission to completion."""

    def __init__(self, a: Assign, rkv: RequestKV, nbytes: int):
        self.a, self.rkv, self.nbytes = a, rkv, nbytes
        self.prefill: PrefillDone | None = None
        self.tokens: list[int] = []
        self.token_times: list[float] = []
        self.times: dict = {}
        self.ids = block_chain(a.request.tokens, rkv.layout)


@dataclasses.dataclass(frozen=True)
class _WriteBack:
    """Writer queue: full blocks to cache in the store, then DE buffer bytes to release."""

    ids: list  # [BlockId] * n
    blocks: np.ndarray  # [n, L, T, *record]
    release: int = 0


@dataclasses.dataclass(frozen=True)
class _Finished:
    """Writer queue: a request whose write-backs are all queued before this; tell rank 0."""

    live: _Live


class DecodeHost(Host):
    role = "decode"

    def __init__(self, transport, cfg, params=None):
        super().__init__(transport, cfg, params)
        self.buffer = HostBuffer("DE", int(cfg.de_buffer_mb * 2**20))
        self.buffer.check_fits(self.layout.block_bytes)
        self.cache = DecodeCache.create(self.model_cfg, cfg.decode_slots, decode_capacity(cfg, self.model_cfg))
        self.live: dict[int, _Live] = {}
        self.pe_ready: dict[int, threading.Event] = {}  # may precede admission; `shared` between threads
        self.admit_q: queue.Queue = queue.Queue()
        self.ready_q: collections.deque[_Live] = collections.deque()
        self.write_q: queue.Queue = queue.Queue()
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.busy_s = 0.0
        self.steps = 0
        self.spawn(self._admit_loop, name="admit")
        self.spawn(self._decode_loop, name="decode")
        self.spawn(self._write_loop, name="writer")

    def warm_up(self) -> None:
        self.cache = warm_decode(self.cache, self.params, prompt_lengths(self.cfg, self.model_cfg),
                                 self.layout.block_tokens)

    def handle(self, src, msg) -> None:
        if isinstance(msg, Assign):
            self.expect_read(msg)
            self.admit_q.put(msg)
        elif isinstance(msg, LayerKV):
            self.live[msg.request_id].rkv.write(msg.layer, msg.start, msg.kv)
        elif isinstance(msg, Ready):
            shared(self.pe_ready, msg.request_id, threading.Event).set()
        elif isinstance(msg, PrefillDone):
            live = self.live[msg.request_id]
            live.prefill = msg
            # the first token is the PE's: its last prefill pass sampled it (docs/paper.md §10); the second
            # comes with this host's first step after the KV is in a decode slot (`_fill_slots`)
            live.times.update(msg.times, first_token=msg.times["prefill_end"])
            with self.lock:
                self.ready_q.append(live)
            self.wake.set()
        else:
            raise TypeError(f"decode host got unexpected {type(msg).__name__} from rank {src}")

    # -- admission and the DE read path -----------------------------------------------------------
    def _admit_loop(self) -> None:
        for a in self.drain(self.admit_q):
            nbytes = RequestKV.nbytes(self.layout, a.request.prompt_len)
            if not self.buffer.reserve(nbytes, self.stop):
                return
            live = _Live(a, RequestKV(self.layout, a.request.prompt_len, self.buffer.pool), nbytes)
            self.live[a.request.id] = live
            self.transport.send(a.pe, Ready(a.request.id))
            if a.de_blocks:  # the leading hit blocks this DE reads and relays (all of them on the DE path)
                hashes = [b.hash for b in live.ids[:a.de_blocks]]
                ticket = self.snic.read(self.store, hashes, out=live.rkv.blocks[:a.de_blocks], layer_major=a.layerwise,
                                        deadline=a.read_by)
                self.spawn(self._relay, live, ticket, name=f"relay{a.request.id}")
            self.expect_read(a, -1)

    def _relay(self, live: _Live, ticket) -> None:
        """Send each layer of the blocks this DE reads to the PE as soon as it is in the DE buffer."""
        a = live.a
        ready = shared(self.pe_ready, a.request.id, threading.Event)
        while not ready.wait(0.1):
            if self.stop.is_set():
                return
        del self.pe_ready[a.request.id]
        if not a.layerwise:
            ticket.wait()
        for layer in range(self.layout.n_layers):
            valid = ticket.wait_layer(layer)
            # the layer's slice of the hit blocks as it lies in the buffer: the transport sends it without a gather
            self.transport.send(a.pe, LayerKV(a.request.id, layer, 0, live.rkv.layer_view(layer, a.de_blocks), valid))

    # -- decoding ---------------------------------------------------------------------------------
    def _decode_loop(self) -> None:
        slots: list[_Live | None] = [None] * self.cfg.decode_slots
        while not self.stop.is_set():
            self._fill_slots(slots)
            if not any(slots):
                self.wake.wait(0.05)
                self.wake.clear()
                continue
            t0 = time.time()
            feed = np.array([s.tokens[-1] if s else 0 for s in slots], np.int32)
            for i, s in enumerate(slots):
                if s is None and self.cache.lengths[i]:
                    self.cache = self.cache.evict(i)  # a free slot does not advance
            logits, self.cache = self.cache.step(self.params, feed)
            nxt = np.asarray(greedy(logits))
            now = time.time()
            self.busy_s += now - t0
            self.steps += 1
            for i, s in enumerate(slots):
                if s is None:
                    continue
                self._maybe_write_block(s, i)  # every token so far now has KV in the cache
                s.tokens.append(int(nxt[i]))
                s.token_times.append(now)
                if len(s.tokens) >= s.a.request.gen_len:
                    slots[i] = None
                    self._finish(s)

    def _fill_slots(self, slots: list) -> None:
        for i in range(len(slots)):
            if slots[i] is not None:
                continue
            with self.lock:
                if not self.ready_q:
                    return
                live = self.ready_q.popleft()
            done, T = live.prefill, self.layout.block_tokens
            self.cache = self.cache.insert(i, live.rkv.sequence())
            self.transport.send(0, KvIn(live.a.request.id))  # its device memory is taken now (`de_memory`)
            live.tokens, live.token_times = [done.first_token], [live.times["first_token"]]
            full = live.a.request.prompt_len // T
            # Prompt blocks the store lacks, straight from the DE buffer; the buffer is freed after. The store
            # holds the plan's recomputed blocks already, unless a bad block restarted the prefill before them.
            have = live.a.stored_blocks if done.hit_blocks == live.a.hit_blocks else done.hit_blocks
            new = list(range(have, full)) if self.store else []
            self.write_q.put(_WriteBack([live.ids[b] for b in new], live.rkv.blocks[new], live.nbytes))
            if live.a.request.gen_len <= 1:
                self._finish(live)
            else:
                slots[i] = live

    def _maybe_write_block(self, live: _Live, slot: int) -> None:
        """After a step the slot holds KV for one more token: write its block once full."""
        T, n = self.layout.block_tokens, int(self.cache.lengths[slot])
        if not self.store or n % T or n <= live.a.request.prompt_len // T * T:
            return
        seq = np.concatenate([live.a.request.tokens, np.asarray(live.tokens, np.int32)])
        ids = block_chain(seq[:n], self.layout)[-1:]
        self.write_q.put(_WriteBack(ids, np.asarray(self.cache.row(slot, n - T, n))[None]))

    def _finish(self, live: _Live) -> None:
        live.times["done"] = time.time()
        self.write_q.put(_Finished(live))

    def _write_loop(self) -> None:
        """Write-backs and completions in queue order. A write that fails (disk full, I/O error,
        permission) leaves its blocks uncached (the store logs and counts it); the request still
        completes and its next turn recomputes what is missing."""
        for item in self.drain(self.write_q):
            if isinstance(item, _WriteBack):
                if item.ids:
                    self.store.cache(item.ids, item.blocks)
                if item.release:
                    self.buffer.release(item.release)
                continue
            live = item.live
            self.live.pop(live.a.request.id, None)
            times = dict(live.times, token_times=live.token_times, stored=time.time())
            self.transport.send(0, Complete(live.a.request.id, live.tokens, live.prefill.hit_blocks, times))

    def stats(self) -> HostStats:
        return dataclasses.replace(super().stats(), busy_s=self.busy_s, decode_steps=self.steps,
                                   buffer_peak_bytes=self.buffer.peak, buffer_budget_bytes=self.buffer.budget)
