"""Rank 0: the workload driver. It builds each agent's next prompt from what the model really
generated, asks the store how many leading blocks hit, places the request, and collects
completions (with progress) until every agent has run all its turns."""

from __future__ import annotations

import itertools
import time

import numpy as np
from tqdm import tqdm

from dualjax.config import RunConfig
from dualjax.messages import Assign, Complete, HostStats, Request, Shutdown, StatsRequest
from dualjax.transport import HostFailure, Transport
from dualjax.workload import get_workload, trajectory
from kvstore import BlockStore, block_chain


class Driver:
    def __init__(self, transport: Transport, cfg: RunConfig, vocab: int, layout, store: BlockStore | None,
                 placement, progress: bool = True):
        self.transport, self.cfg, self.layout, self.store, self.placement = transport, cfg, layout, store, placement
        self.spec = get_workload(cfg.workload, agents=cfg.agents, turns=cfg.turns)
        self.trajs = [trajectory(self.spec, a, vocab, cfg.workload_seed) for a in range(self.spec.agents)]
        self.context = [np.zeros(0, np.int32) for _ in range(self.spec.agents)]
        self.records: dict[int, dict] = {}
        self.ids = itertools.count()
        self.progress = progress

    def _submit(self, agent: int, turn: int) -> None:
        step = self.trajs[agent][turn]
        prompt = np.concatenate([self.context[agent], step.append])
        req = Request(next(self.ids), agent, turn, prompt, step.gen_len, time.time())
        hit = 0
        if self.store is not None:
            max_hit = (len(prompt) - 1) // self.layout.block_tokens  # at least one token is computed
            hit = self.store.match_prefix([b.hash for b in block_chain(prompt, self.layout)[:max_hit]])
        pe, de, path = self.placement.place(req, hit)
        if self.store is None:
            path = "none"
        a = Assign(req, pe, de, path, hit, self.cfg.layerwise, time.time())
        self.records[req.id] = {"id": req.id, "agent": agent, "turn": turn, "prompt_tokens": req.prompt_len,
                                "gen_len": req.gen_len, "planned_hit_blocks": hit, "path": path, "pe": pe, "de": de,
                                "arrival": req.arrival, "scheduled": a.scheduled}
        self.transport.send(pe, a)
        self.transport.send(de, a)

    def _complete(self, msg: Complete) -> dict:
        rec = self.records[msg.request_id]
        T = self.layout.block_tokens
        rec.update(hit_tokens=msg.hit_blocks * T, miss_tokens=rec["prompt_tokens"] - msg.hit_blocks * T,
                   generated=msg.tokens, **msg.times)
        agent, turn = rec["agent"], rec["turn"]
        self.context[agent] = np.concatenate([self.context[agent], self.trajs[agent][turn].append,
                                              np.asarray(msg.tokens, np.int32)])
        return rec

    def run(self) -> tuple[list[dict], list[dict]]:
        """Drive the workload to the end; returns (request records, host stats)."""
        total = self.spec.agents * self.spec.turns
        for agent in range(self.spec.agents):  # offline mode: every agent starts at once
            self._submit(agent, 0)
        done = 0
        with tqdm(total=total, desc=f"{self.cfg.cluster.name} {self.cfg.path}", unit="req",
                  disable=not self.progress, leave=False) as bar:
            while done < total:
                got = self.transport.recv(timeout=1.0)
                if got is None:
                    continue
                _, msg = got
                if not isinstance(msg, Complete):
                    raise HostFailure(f"rank 0 got unexpected {type(msg).__name__}")
                rec = self._complete(msg)
                done += 1
                bar.update()
                if rec["turn"] + 1 < self.spec.turns:
                    self._submit(rec["agent"], rec["turn"] + 1)
        return sorted(self.records.values(), key=lambda r: r["id"]), self._collect_stats()

    def _collect_stats(self) -> list[dict]:
        others = range(1, self.cfg.cluster.size)
        for r in others:
            self.transport.send(r, StatsRequest())
        stats = []
        while len(stats) < len(others):
            got = self.transport.recv(timeout=10.0)
            if got is None:
                raise HostFailure("hosts did not report their stats within 10 s")
            if isinstance(got[1], HostStats):
                stats.append({"rank": got[1].rank, "role": got[1].role, **got[1].stats})
        for r in others:
            self.transport.send(r, Shutdown())
        return sorted(stats, key=lambda s: s["rank"])
