"""The prefill host (PE): computes the miss tokens of each request layer by layer.

Per request, FIFO: reserve PE buffer room; then either read the hit blocks itself through its
storage NIC (PE read path) or receive them layer by layer from the DE (DE read path); for each
layer run `Layerwise.layer` over the hit KV and send the layer's KV to the DE: hit **and** miss
tokens on the PE path, only the miss tokens on the DE path (PAPER.md §3). With layerwise
prefill the layer-l+1 KV is still arriving while layer l computes; without it (the Basic
baseline) everything is loaded first. Long miss spans are computed in chunks of at most
`prefill_chunk` tokens, so attention memory stays bounded. If a block turns out bad mid-way
(fewer valid blocks than planned), the request restarts with fewer hit blocks and still yields
the reference tokens.
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
    role, reads_on = "prefill", "pe"

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
            self.expect_read(msg)
            self.admit_q.put(msg)
        elif isinstance(msg, (Ready, LayerKV)):
            self.inboxes[msg.request_id].put(msg)
        else:
            raise TypeError(f"prefill host got unexpected {type(msg).__name__} from rank {src}")

    def _admit_loop(self) -> None:
        """FIFO admission: reserve buffer room, start the storage read or tell the DE to relay."""
        for a in self.drain(self.admit_q):
            nbytes = a.hit_blocks * self.layout.block_bytes
            if not self.buffer.reserve(nbytes, self.stop):
                return
            rkv, ticket = RequestKV(self.layout, a.hit_blocks * self.layout.block_tokens), None
            if a.path == "pe" and a.hit_blocks:
                hashes = [b.hash for b in block_chain(a.request.tokens, self.layout)[:a.hit_blocks]]
                ticket = self.snic.read(self.store, hashes, out=rkv.blocks, layer_major=a.layerwise)
            elif a.path == "de":  # the DE reads; tell it we have room for its relay
                self.transport.send(a.de, Ready(a.request.id))
            self.expect_read(a, -1)
            self.work_q.put((a, rkv, ticket, nbytes))

    def _work_loop(self) -> None:
        for a, rkv, ticket, nbytes in self.drain(self.work_q):
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
        req = a.request
        t0 = time.time()
        inbox = self.inboxes[req.id]
        inbox.wait(lambda: inbox.ready, self.stop)  # our KV goes into the DE's buffer: wait for its room
        source, wait_all = self._layer_source(a, rkv, ticket)
        if not a.layerwise:
            wait_all()  # Basic: the whole prefix is loaded before any compute
        t_loaded = time.time()
        hit, restarts = a.hit_blocks, 0
        while True:
            hit, last = self._compute(a, source, hit)
            if last is not None:
                break
            restarts += 1
        first = int(np.asarray(greedy(last.logits()[0, -1])))
        times = {"prefill_start": t0, "prefill_loaded": t_loaded, "prefill_end": time.time(), "restarts": restarts}
        self.busy_s += times["prefill_end"] - t0
        self.transport.send(a.de, PrefillDone(req.id, hit, first, times))
        self.transport.send(0, PrefillFinished(req.id))

    def _compute(self, a: Assign, source, hit: int):
        """The miss tokens over `hit` blocks, in chunks of at most `prefill_chunk` tokens (each over
        the hits and the chunks before it, so attention memory stays bounded), each chunk layer by
        layer. Returns (hit, Layerwise of the last chunk), or (fewer hit blocks, None) when a block
        turned out bad: the caller starts again with fewer."""
        req, L = a.request, self.layout.n_layers
        start = hit * self.layout.block_tokens
        done: list[list[np.ndarray]] = [[] for _ in range(L)]  # per layer: KV of the chunks computed
        for c0 in range(start, req.prompt_len, self.cfg.prefill_chunk):
            c1 = min(c0 + self.cfg.prefill_chunk, req.prompt_len)
            lw = Layerwise(self.params, self.model_cfg, req.tokens[None, c0:c1], prefix_len=[c0])
            previous = None
            for layer in range(L):
                valid, hit_kv = source(layer)
                if a.path != "none" and valid < hit:
                    return valid, None
                prefix = np.concatenate([hit_kv[:start], *done[layer]]) if done[layer] else hit_kv[:start]
                kv = lw.layer(layer, prefix[None])  # dispatched; runs while we send the previous layer
                if previous is not None:
                    done[layer - 1].append(self._send_layer(a, start, c0, *previous))
                previous = (layer, hit_kv, kv)
            done[L - 1].append(self._send_layer(a, start, c0, *previous))
        return hit, lw

    def _send_layer(self, a: Assign, start: int, c0: int, layer: int, hit_kv, kv) -> np.ndarray:
        """Send a chunk's layer KV to the DE (and, on the PE path with the first chunk, the hit
        tokens' KV too); returns the chunk's KV as a host array."""
        if a.path != "de" and start and c0 == start:
            self.transport.send(a.de, LayerKV(a.request.id, layer, 0, np.ascontiguousarray(hit_kv[:start])))
        miss = np.asarray(kv[0])
        self.transport.send(a.de, LayerKV(a.request.id, layer, c0, miss))
        return miss

    def stats(self) -> dict:
        return {**super().stats(), "busy_s": self.busy_s, "buffer_peak_bytes": self.buffer.peak}
