"""Rank 0: the workload driver and the scheduler's host.

It starts agents (all at once offline, or at their arrival times online), builds each next
prompt from what the model really generated, asks the store how many leading blocks hit, and
queues the request. The scheduler places queued requests (FIFO) on engines and picks the read
path through the policy; the scheduler's engine state is what rank 0 assigned (requests, tokens)
and what hosts report (their storage read queues). Progress is shown while it runs.
"""

from __future__ import annotations

import heapq
import itertools
import time

import numpy as np
from tqdm import tqdm

from dualjax.core.batching import AttentionFit
from dualjax.core.config import RunConfig
from dualjax.core.lengths import max_hit_blocks
from dualjax.core.policies import Policy, layerwise_for
from dualjax.core.records import HostStats
from dualjax.core.scheduler import EngineView, RequestView, Scheduler, Thresholds, Waiting
from dualjax.core.streams import stream
from dualjax.core.workload import Agent
from dualjax.runtime.messages import (
    Assign,
    Complete,
    EngineState,
    KvIn,
    PrefillFinished,
    Request,
    Shutdown,
    StatsRequest,
)
from dualjax.runtime.transport import HostFailure, Transport
from kvstore import BlockStore, block_chain


class Driver:
    def __init__(self, transport: Transport, cfg: RunConfig, agents: list[Agent], layout, store: BlockStore | None,
                 policy: Policy, thresholds: Thresholds, de_capacity_tokens: int | None = None, progress: bool = True,
                 fits: dict[int, AttentionFit] | None = None):
        """`fits`: each PE's packing fit by rank (what policies see as a PE view's `prefill_s`)."""
        self.transport, self.cfg, self.layout, self.store, self.policy = transport, cfg, layout, store, policy
        self.agents = agents
        c, fits = cfg.cluster, fits or {}  # one engine per host: a host is its own node
        pes = [EngineView(r, "prefill", r, prefill_s=fits[r].predict if r in fits else None) for r in c.prefill_ranks]
        self.scheduler = Scheduler(policy, thresholds, pes +
                                   [EngineView(r, "decode", r, free_tokens=de_capacity_tokens) for r in c.decode_ranks],
                                   naive=cfg.scheduler == "naive", de_memory=cfg.de_memory)
        self.context = [np.zeros(0, np.int32) for _ in agents]
        self.waiting = Waiting()
        self.requests: dict[int, Request] = {}
        self.records: dict[int, dict] = {}
        self.ids = itertools.count()
        self.timers: list[tuple[float, int, int]] = []  # (due, agent, turn)
        self.progress = progress

    # -- requests ----------------------------------------------------------------------------------
    def _submit(self, agent: int, turn: int) -> None:
        step = self.agents[agent].turns[turn]
        prompt = step.prompt if step.prompt is not None else np.concatenate([self.context[agent], step.append])
        req = Request(next(self.ids), agent, turn, prompt, step.gen_len, time.time())
        hit = 0
        if self.store is not None:
            max_hit = max_hit_blocks(len(prompt), self.layout.block_tokens)  # at least one token is computed
            hit = self.store.match_prefix([b.hash for b in block_chain(prompt, self.layout)[:max_hit]])
        self.requests[req.id] = req
        self.waiting.append(RequestView(req.id, agent, turn, req.prompt_len, hit * self.layout.block_tokens,
                                        req.gen_len, self.layout.block_tokens))
        self.records[req.id] = {"id": req.id, "agent": agent, "turn": turn, "prompt_tokens": req.prompt_len,
                                "gen_len": req.gen_len, "planned_hit_blocks": hit, "arrival": req.arrival}

    def _dispatch(self) -> None:
        for d in self.scheduler.schedule(self.waiting):
            r, req = d.request, self.requests[d.request.id]
            path = d.path if self.store is not None else "none"
            layerwise = layerwise_for(self.policy, self.cfg.layerwise)
            a = Assign.placed(d, req, path, layerwise, time.time())  # the plan in blocks
            self.records[r.id].update(path=path, pe=d.pe, de=d.de, scheduled=a.scheduled, pe_load=d.pe_tokens,
                                      de_tokens=d.plan.de_tokens, recomputed_tokens=d.plan.recompute_tokens)
            if a.deadline_s is not None:  # what its read abandons is recomputed (`_complete`)
                self.records[r.id]["read_deadline"] = a.deadline_s
            self.transport.send(d.pe, a)
            self.transport.send(d.de, a)

    def _complete(self, msg: Complete) -> dict:
        rec, req = self.records[msg.request_id], self.requests.pop(msg.request_id)
        T = self.layout.block_tokens
        rec.update(hit_tokens=msg.hit_blocks * T, miss_tokens=rec["prompt_tokens"] - msg.hit_blocks * T,
                   de_tokens=min(rec["de_tokens"], msg.hit_blocks * T), generated=msg.tokens, **msg.times)
        if rec.pop("read_deadline", None) is not None:  # the stored blocks not loaded were recomputed
            rec["recomputed_tokens"] = rec["planned_hit_blocks"] * T - msg.hit_blocks * T
        self.scheduler.update(rec["de"], -1, -(req.prompt_len + req.gen_len))
        agent, turn = rec["agent"], rec["turn"]
        self.context[agent] = np.concatenate([req.tokens, np.asarray(msg.tokens, np.int32)])
        if turn + 1 < len(self.agents[agent].turns):
            think, pause = self.agents[agent].think_s, self.agents[agent].turns[turn + 1].pause_s
            if pause is None:
                pause = stream("think-time", self.cfg.workload_seed, agent, turn).exponential(think) if think else 0.0
            heapq.heappush(self.timers, (time.time() + pause, agent, turn + 1))
        return rec

    # -- the loop ----------------------------------------------------------------------------------
    def run(self) -> tuple[list[dict], list[dict]]:
        """Drive the workload to the end; returns (request records, host stats)."""
        t0 = time.time()
        for a, agent in enumerate(self.agents):
            heapq.heappush(self.timers, (t0 + agent.start, a, 0))
        total, done = sum(len(a.turns) for a in self.agents), 0
        with tqdm(total=total, desc=f"{self.cfg.cluster.name} {self.policy.name}", unit="req",
                  disable=not self.progress, leave=False) as bar:
            while done < total:
                while self.timers and self.timers[0][0] <= time.time():
                    _, agent, turn = heapq.heappop(self.timers)
                    self._submit(agent, turn)
                self._dispatch()
                wait = 0.5 if not self.timers else max(0.0, min(0.5, self.timers[0][0] - time.time()))
                got = self.transport.recv(timeout=wait)
                if got is None:
                    continue
                msg = got[1]
                if isinstance(msg, Complete):
                    self._complete(msg)
                    done += 1
                    bar.update()
                elif isinstance(msg, PrefillFinished):  # the request's tokens leave the PE's load
                    rec = self.records[msg.request_id]
                    self.scheduler.update(rec["pe"], -1, -rec["pe_load"])
                elif isinstance(msg, KvIn):  # the request's KV is in its DE's device memory now
                    req = self.requests[msg.request_id]
                    self.scheduler.kv_in(self.records[msg.request_id]["de"], req.prompt_len + req.gen_len)
                elif isinstance(msg, EngineState):
                    self.scheduler.set_read_queue(msg.rank, msg.read_q_tokens)
                else:
                    raise HostFailure(f"rank 0 got unexpected {type(msg).__name__}")
        return sorted(self.records.values(), key=lambda r: r["id"]), self._collect_stats()

    def _collect_stats(self) -> list[HostStats]:
        others = range(1, self.cfg.cluster.size)
        for r in others:
            self.transport.send(r, StatsRequest())
        stats = []
        while len(stats) < len(others):
            got = self.transport.recv(timeout=30.0)
            if got is None:
                raise HostFailure("hosts did not report their stats within 30 s")
            if isinstance(got[1], HostStats):
                stats.append(got[1])
        for r in others:
            self.transport.send(r, Shutdown())
        return sorted(stats, key=lambda s: s.rank)
