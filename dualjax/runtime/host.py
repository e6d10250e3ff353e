"""What every host has: its transport, model, store and storage NIC, a message loop, and guarded
threads whose exceptions end the whole job (never a hang)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import queue
import socket
import sys
import threading
import time
import traceback

import jax

import kvstore
import models
from dualjax.core.config import RunConfig
from dualjax.core.records import HostStats, SnicStats, StoreStats
from dualjax.runtime.messages import Assign, EngineState, Shutdown, StatsRequest, Warm
from dualjax.runtime.store import open_store, run_layout, run_model
from dualjax.runtime.transport import HostFailure, Transport

log = logging.getLogger(__name__)


def shared(d: dict, key, make):
    """`d[key]`, made by `make()` when missing: the same object for every thread. `dict.setdefault`
    inserts atomically; a `defaultdict`'s factory runs Python code, so two threads that miss a key
    at once (the thread taking a message in, the one about to wait for it) could each make one, and
    the object the message was given to would be lost, its waiter left waiting for good."""
    got = d.get(key)
    return got if got is not None else d.setdefault(key, make())


def keep_failure(out: str, rank: int, role: str, tb: str) -> str:
    """Keep traceback `tb` of rank `rank` in `out/failed-rank<rank>.txt` if that directory exists here (rank 0's
    --out: never made here); the text kept."""
    text = f"[rank {rank} {role} on {socket.gethostname()}] {tb}"
    with contextlib.suppress(OSError):
        with open(os.path.join(out, f"failed-rank{rank}.txt"), "w") as f:
            f.write(text)
    return text


class Host:
    role = "host"
    prefill_rate: float | None = None  # a PE's measured prefill tokens/s, sent with `Warm`
    fit = None  # a PE's packing fit (`AttentionFit`), sent with `Warm`

    def __init__(self, transport: Transport, cfg: RunConfig, params=None):
        self.created = time.perf_counter()  # start-up is reported apart from the run (`Warm`)
        self.transport, self.cfg, self.rank = transport, cfg, transport.rank
        source = run_model(cfg)
        self.model_cfg = source.config
        self.layout = run_layout(cfg)
        if params is None:  # this host's weights, from its own files, tensor parallel over its devices
            params = source.load_params(models.make_mesh() if len(jax.local_devices()) > 1 else None)
        self.params = params
        self.store = open_store(cfg)
        cap = cfg.snic_mbps * 1e6 if cfg.snic_mbps else None
        self.snic = kvstore.StorageNIC(f"{self.role}{self.rank}", cap) if cfg.use_store else None
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.pending_read_tokens = 0  # hit tokens this host will read, not yet queued at its NIC
        if self.snic:
            self.spawn(self._report_loop, name="report")

    # -- threads -----------------------------------------------------------------------------------
    def spawn(self, fn, *args, name: str) -> threading.Thread:
        t = threading.Thread(target=self._guard, args=(fn, *args), name=f"{self.role}{self.rank}-{name}", daemon=True)
        t.start()
        self.threads.append(t)
        return t

    def _guard(self, fn, *args) -> None:
        try:
            fn(*args)
        except BaseException:  # noqa: BLE001 - any failure ends the job, with this host's traceback
            self.fail(traceback.format_exc())

    def fail(self, tb: str) -> None:
        """End the job with this host's traceback: printed, and kept in `failed-rank<r>.txt` under the
        run's output directory, since mpiexec may end the job before it forwards a rank's stderr."""
        text = keep_failure(self.cfg.out, self.rank, self.role, tb)
        print(text, file=sys.stderr, flush=True)
        self.stop.set()
        self.transport.abort(text)

    def drain(self, q: queue.Queue):
        """Items of `q`, as they come, until the host stops."""
        while not self.stop.is_set():
            try:
                yield q.get(timeout=0.1)
            except queue.Empty:
                continue

    def expect_read(self, a, sign: int = 1) -> None:
        """Count (sign=1) or uncount (-1) the hit tokens of `a` that this host will read but has not
        queued at its NIC yet: they are part of the read queue the scheduler sees."""
        self.pending_read_tokens += sign * a.reads(self.role) * self.layout.block_tokens

    def _report_loop(self, period_s: float = 0.02) -> None:
        """Tell rank 0 this node's storage read queue whenever it changes (the scheduler balances it)."""
        last = None
        while not self.stop.wait(period_s):
            q = self.snic.read_queue()[1] + self.pending_read_tokens
            if q != last:
                self.transport.send(0, EngineState(self.rank, q))
                last = q

    # -- message loop ------------------------------------------------------------------------------
    def warm_up(self) -> None:
        """Compile the programs the workload will need (subclasses); runs before `Warm` is sent."""

    def run(self) -> None:
        """Warm up, tell rank 0, then serve messages until Shutdown; exceptions end the job."""
        try:
            t0 = time.perf_counter()
            self.warm_up()
            now = time.perf_counter()
            fit = dataclasses.astuple(self.fit) if self.fit is not None else None
            self.transport.send(0, Warm(self.rank, now - self.created, now - t0, self.prefill_rate, fit))
            while not self.stop.is_set():
                got = self.transport.recv(timeout=0.1)
                if got is None:
                    continue
                src, msg = got
                if isinstance(msg, Shutdown):
                    break
                if isinstance(msg, StatsRequest):
                    self.transport.send(src, self.stats())
                    continue
                if isinstance(msg, Assign) and msg.deadline_s is not None and self.snic is not None:
                    # a read deadline counts from placement: from receipt here, on this host's NIC clock
                    msg = dataclasses.replace(msg, read_by=self.snic.clock() + msg.deadline_s)
                self.handle(src, msg)
        except HostFailure:  # another host failed and already said why
            pass
        except BaseException:  # noqa: BLE001
            if not self.stop.is_set():
                self.fail(traceback.format_exc())
        finally:
            self.stop.set()
            self.shutdown()

    def handle(self, src: int, msg) -> None:
        raise NotImplementedError

    def stats(self) -> HostStats:
        """What this host reports at the end of the run (subclasses add their own fields)."""
        sent = self.transport.sent_bytes
        out = HostStats(self.rank, self.role, kv_sent_bytes=sent.get("kv", 0),
                        control_sent_bytes=sent.get("control", 0))
        if self.snic:
            s = self.snic.stats()
            out.snic = SnicStats(s.get("bytes_read", 0), s["busy_s"], s["wall0"], s["cap_bytes_per_s"],
                                 self.snic.series[:: max(1, len(self.snic.series) // 2000)])
        if self.store:
            s = self.store.stats()
            out.store = StoreStats(s.get("bytes_written", 0), s.get("blocks_written", 0),
                                   {k: v for k, v in s.items() if isinstance(v, int) and not isinstance(v, bool)})
        return out

    def shutdown(self) -> None:
        for t in self.threads:
            t.join(timeout=5)
        if self.snic:
            self.snic.close()
