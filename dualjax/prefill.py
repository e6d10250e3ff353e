"""The prefill host (PE): computes the miss tokens of each request layer by layer.

Per request, FIFO: reserve PE buffer room; then either read the hit blocks itself through its
storage NIC (PE read path) or receive them layer by layer from the DE (DE read path); for each
layer run `Layerwise.layer` over the hit KV and send the layer's KV to the DE: hit **and** miss
tokens on the PE path, only the miss tokens on the DE path (PAPER.md §3). With layerwise
prefill the layer-l+1 KV is still arriving while layer l computes; without it (the Basic
baseline) everything is loaded first. If a block turns out bad mid-way (fewer valid blocks
than planned), the request restarts with fewer hit blocks and still yields the reference tokens.
"""

from __future__ import annotations

import collections
import queue
import threading
import time

import numpy as np

from dualjax.buffers import HostBuffer, RequestKV
from dualjax.host import Host
from dualjax.messages import Assign, LayerKV, PrefillDone, PrefillFinished, Ready
from kvstore import block_chain
from models import Layerwise, greedy


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


class PrefillHost(Host):
    role = "prefill"

    def __init__(self, transport, cfg, params=None):
        super().__init__(transport, cfg, params)
        self.buffer = HostBuffer("PE", int(cfg.pe_buffer_mb * 2**20))
        self.buffer.check_fits(self.layout.block_bytes)
        self.inboxes: dict[int, _Inbox] = collections.defaultdict(_Inbox)
        self.admit_q: queue.Queue = queue.Queue()
        self.work_q: queue.Queue = queue.Queue()
        self.busy_s = 0.0
        self.spawn(self._admit_loop, name="admit")
        self.spawn(self._work_loop, name="worker")

    def handle(self, src, msg) -> None:
        if isinstance(msg, Assign):
            if msg.path == "pe":
                self.pending_read_tokens += msg.hit_blocks * self.layout.block_tokens
            self.admit_q.put(msg)
        elif isinstance(msg, (Ready, LayerKV)):
            self.inboxes[msg.request_id].put(msg)
        else:
            raise TypeError(f"prefill host got unexpected {type(msg).__name__} from rank {src}")

    def _admit_loop(self) -> None:
        """FIFO admission: reserve buffer room, start the storage read or tell the DE to relay."""
        while not self.stop.is_set():
            try:
                a: Assign = self.admit_q.get(timeout=0.1)
            except queue.Empty:
                continue
            nbytes = a.hit_blocks * self.layout.block_bytes
            if not self.buffer.reserve(nbytes, self.stop):
                return
            rkv, ticket = RequestKV(self.layout, a.hit_blocks * self.layout.block_tokens), None
            if a.path == "pe" and a.hit_blocks:
                hashes = [b.hash for b in block_chain(a.request.tokens, self.layout)[:a.hit_blocks]]
                ticket = self.snic.read(self.store, hashes, out=rkv.blocks, layer_major=a.layerwise)
            if a.path == "pe":
                self.pending_read_tokens -= a.hit_blocks * self.layout.block_tokens
            elif a.path == "de":
                self.transport.send(a.de, Ready(a.request.id))
            self.work_q.put((a, rkv, ticket, nbytes))

    def _work_loop(self) -> None:
        while not self.stop.is_set():
            try:
                a, rkv, ticket, nbytes = self.work_q.get(timeout=0.1)
            except queue.Empty:
                continue
            self.maybe_inject_failure()
            try:
                self._prefill(a, rkv, ticket)
            finally:
                self.buffer.release(nbytes)
                self.inboxes.pop(a.request.id, None)

    def _layer_source(self, a: Assign, rkv: RequestKV, ticket):
        """fn(layer) -> (valid blocks, hit KV [planned*T, 2, K, H]) for this request's path."""
        T, inbox = self.layout.block_tokens, self.inboxes[a.request.id]

        def from_store(layer):
            valid = ticket.wait_layer(layer) if ticket else 0
            return valid, rkv.layer(layer, a.hit_blocks * T)

        def from_relay(layer):
            inbox.wait(lambda: layer in inbox.layers, self.stop)
            msg = inbox.layers[layer]
            return msg.valid, msg.kv

        if a.path == "de" and a.hit_blocks:
            return from_relay, lambda: inbox.wait(lambda: len(inbox.layers) == self.layout.n_layers, self.stop)
        return from_store, (lambda: ticket.wait()) if ticket else (lambda: None)

    def _prefill(self, a: Assign, rkv: RequestKV, ticket) -> None:
        req, T, L = a.request, self.layout.block_tokens, self.layout.n_layers
        t0 = time.time()
        inbox = self.inboxes[req.id]
        inbox.wait(lambda: inbox.ready, self.stop)  # our KV goes into the DE's buffer: wait for its room
        source, wait_all = self._layer_source(a, rkv, ticket)
        if not a.layerwise:
            wait_all()  # Basic: the whole prefix is loaded before any compute
        t_loaded = time.time()
        hit, restarts = a.hit_blocks, 0
        while True:
            hit, done = self._layers(a, source, hit)
            if done is not None:
                break
            restarts += 1
        first = int(np.asarray(greedy(done.logits()[0, -1])))
        times = {"prefill_start": t0, "prefill_loaded": t_loaded, "prefill_end": time.time(), "restarts": restarts}
        self.busy_s += times["prefill_end"] - t0
        self.transport.send(a.de, PrefillDone(req.id, hit, first, times))
        self.transport.send(0, PrefillFinished(req.id))

    def _layers(self, a: Assign, source, hit: int):
        """One pass over the layers with `hit` blocks; returns (hit, Layerwise) or (fewer, None)."""
        req, T = a.request, self.layout.block_tokens
        lw = Layerwise(self.params, self.model_cfg, req.tokens[None, hit * T:], prefix_len=[hit * T])
        previous = None
        for layer in range(self.layout.n_layers):
            valid, prefix = source(layer)
            if a.path != "none" and valid < hit:
                return valid, None
            kv = lw.layer(layer, prefix[None, :hit * T])  # dispatched; runs while we send the previous layer
            if previous is not None:
                self._send_layer(a, hit, *previous)
            previous = (layer, prefix, kv)
        self._send_layer(a, hit, *previous)
        return hit, lw

    def _send_layer(self, a: Assign, hit: int, layer: int, prefix, kv) -> None:
        T = self.layout.block_tokens
        if a.path != "de" and hit:  # PE path: the hit tokens' KV goes to the DE too
            self.transport.send(a.de, LayerKV(a.request.id, layer, 0, np.ascontiguousarray(prefix[:hit * T])))
        self.transport.send(a.de, LayerKV(a.request.id, layer, hit * T, np.asarray(kv[0])))

    def stats(self) -> dict:
        return {**super().stats(), "busy_s": self.busy_s, "buffer_peak_bytes": self.buffer.peak}
