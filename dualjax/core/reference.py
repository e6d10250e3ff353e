"""The scheduler's rules (docs/paper.md §7) written plainly, to read and to check the fast one against.

`dualjax.core.scheduler.Scheduler` keeps heaps of packed ints so that a decision costs the same at 2 and
at 1,152 engines; this `ReferenceScheduler` recomputes everything from lists with `min` and makes the same
decisions from the same state and events (tests/dualjax/core/test_reference_scheduler.py). Same surface:
`schedule(waiting)`, `update`, `set_read_queue`, `read_queue`, `view`. Each round:

1. DE level 1: each request that joined the waiting queue since the last round goes to the DE group (a
   node's DEs) with the smallest load, its DEs' tokens plus the requests queued for it and not yet placed.
2. Requests are placed one at a time: the earliest request (global FIFO order) that heads its group's
   queue, over the groups still candidates, so a blocked group holds up only its own requests.
   * A policy that overrides `engines` may name both engines; no other rule applies then.
   * PE: drop PEs with tokens > beta; C2 = the rest whose node read queue <= alpha, C3 = the others;
     min tokens in C2, else in C3; neither -> the round stops.
   * DE, level 2 inside the group: none with free memory for r -> the group sits out the rest of the
     round, and the next rounds until one of its DEs changes or a request joins it. Else R = the longest head of the
     group's queue (r first, counted even if it alone exceeds it) that fits the group's free memory,
     Z = 1.05 * (len over R + tokens of its DEs) / |DEs|; among DEs with memory for r, min seq over
     those with tokens + len(r) <= Z, else min tokens.
3. The policy's `path` ("pe", "de" or a `Plan`); the PE's tokens take r's prompt (each recomputed token
   weighs `new_token_weight`), the DE's prompt + generation (and, with reserved `de_memory`, its free
   memory; with resident, `kv_in` takes that when r's KV moves into the DE), each node's read queue
   its side's hit tokens.
Ties go to the lowest rank and the lowest node. len(r) = r.total_tokens (prompt + generation).
Naive: FIFO, the next PE and the next DE with memory for r in turn (no alpha, beta or Z); none -> stop.
"""

from __future__ import annotations

import dataclasses
import math

from dualjax.core.policies import Policy, choose_engines, decide
from dualjax.core.scheduler import Decision, EngineView, Thresholds


@dataclasses.dataclass
class Engine:
    rank: int
    role: str
    node: int
    seq: int
    tokens: int
    free: float  # KV tokens a DE can still take; math.inf: no limit
    read_rate: float
    prefill_rate: float | None
    prefill_s: object


class ReferenceScheduler:
    def __init__(self, policy: Policy, thresholds: Thresholds, engines: list[EngineView], naive: bool = False,
                 de_memory: str = "reserved"):
        self.policy, self.th, self.naive, self.de_memory = policy, thresholds, naive, de_memory
        th = thresholds
        self.engines = [Engine(e.rank, e.role, e.node, e.seq, e.tokens,
                               math.inf if e.free_tokens is None else e.free_tokens,
                               e.read_tokens_per_s or th.read_tokens_per_s,
                               (e.prefill_tokens_per_s or th.prefill_tokens_per_s) if e.role == "prefill" else None,
                               e.prefill_s) for e in sorted(engines, key=lambda e: e.rank)]
        self.pes = [e for e in self.engines if e.role == "prefill"]
        self.des = [e for e in self.engines if e.role == "decode"]
        if not self.pes or not self.des:
            raise ValueError("the scheduler needs at least one prefill and one decode engine")
        self.read_q = {e.node: 0 for e in self.engines}  # a node's engines share its storage read queue
        for e in engines:
            self.read_q[e.node] = max(self.read_q[e.node], e.read_q_tokens)
        self.groups = sorted({e.node for e in self.des})  # a DE group is a node's DEs
        self.group_of: dict[int, int] = {}  # waiting request id -> its DE group (level 1)
        self.blocked: dict[int, int] = {}  # DE group -> the request at its head that fitted none of its DEs
        self.next_pe = self.next_de = 0  # naive: round robin

    def engine(self, rank: int) -> Engine:
        return next(e for e in self.engines if e.rank == rank)

    def view(self, rank: int) -> EngineView:
        e = self.engine(rank)
        return EngineView(e.rank, e.role, e.node, e.seq, e.tokens, self.read_q[e.node],
                          None if e.free == math.inf else e.free, e.read_rate, e.prefill_rate, e.prefill_s)

    def update(self, rank: int, seq: int = 0, tokens: int = 0, placed: bool = False, memory: int | None = None) -> None:
        """Add `seq` requests and `tokens` tokens (negative when they leave); a DE's free memory moves the
        other way by `memory` (default `tokens`). `placed` is the fast scheduler's bookkeeping: loads are
        recomputed here."""
        e = self.engine(rank)
        e.seq += seq
        e.tokens += tokens
        if e.role == "decode":
            e.free -= tokens if memory is None else memory
            self.blocked.pop(e.node, None)

    def kv_in(self, rank: int, tokens: int) -> None:
        """A request's KV moved into DE `rank`: resident memory takes its `tokens` now (reserved: at placement)."""
        if self.de_memory == "resident":
            self.update(rank, memory=tokens)

    def set_read_queue(self, node: int, tokens: int) -> None:
        self.read_q[node] = tokens

    def read_queue(self, node: int) -> int:
        return self.read_q[node]

    def queue(self, group: int, waiting) -> list:
        """The group's waiting requests, FIFO."""
        return [r for r in waiting if self.group_of.get(r.id) == group]

    def load(self, group: int, waiting) -> int:
        return (sum(e.tokens for e in self.des if e.node == group)
                + sum(r.total_tokens for r in self.queue(group, waiting)))

    # -- the rules ---------------------------------------------------------------------------------
    def schedule(self, waiting) -> list[Decision]:
        if self.naive:
            return self._schedule_naive(waiting)
        for r in waiting:  # level 1
            if r.id not in self.group_of:
                g = min(self.groups, key=lambda g: self.load(g, waiting))
                self.group_of[r.id] = g
                self.blocked.pop(g, None)
        out, sat_out = [], set(self.blocked)  # the groups left out of this round
        while True:
            heads = {}
            for r in waiting:
                heads.setdefault(self.group_of[r.id], r)
            r = next((r for g, r in heads.items() if g not in sat_out), None)
            if r is None:
                return out
            g = self.group_of[r.id]
            forced = choose_engines(self.policy, r, *self._views()) if self._overrides() else None
            if forced:
                pe, de = forced
            else:
                pe = self.pick_pe()
                if pe is None:
                    return out
                de = self.pick_de(r, self.queue(g, waiting))
                if de is None:
                    self.blocked[g] = r.id
                    sat_out.add(g)
                    continue
            waiting.discard(r)
            del self.group_of[r.id]
            out.append(self._place(r, pe, de))

    def pick_pe(self) -> int | None:
        open_ = [e for e in self.pes if e.tokens <= self.th.beta_tokens]
        c2 = [e for e in open_ if self.read_q[e.node] <= self.th.alpha_tokens]
        c3 = [e for e in open_ if self.read_q[e.node] > self.th.alpha_tokens]
        for c in (c2, c3):
            if c:
                return min(c, key=lambda e: e.tokens).rank  # min keeps the first: the lowest rank
        return None

    def pick_de(self, r, queue: list) -> int | None:
        """Level 2 in the group of `queue` (its waiting requests, r first)."""
        group = [e for e in self.des if e.node == self.group_of[r.id]]
        need = r.total_tokens
        fits = [e for e in group if e.free >= need]
        if not fits:
            return None
        free, head = sum(e.free for e in group), 0
        for x in queue:  # R: the longest head that fits the group's free memory
            if head + x.total_tokens > free:
                break
            head += x.total_tokens
        z = 1.05 * (max(head, need) + sum(e.tokens for e in group)) / len(group)
        under = [e for e in fits if e.tokens + need <= z]
        return min(under, key=lambda e: e.seq).rank if under else min(fits, key=lambda e: e.tokens).rank

    def _schedule_naive(self, waiting) -> list[Decision]:
        out = []
        while waiting:
            r = next(iter(waiting))
            forced = choose_engines(self.policy, r, *self._views()) if self._overrides() else None
            if forced:
                pe, de = forced
            else:
                pe = self.pes[self.next_pe].rank
                turn = self.des[self.next_de:] + self.des[:self.next_de]
                de = next((e for e in turn if e.free >= r.total_tokens), None)
                if de is None:
                    return out
                self.next_pe = (self.next_pe + 1) % len(self.pes)
                self.next_de = (self.des.index(de) + 1) % len(self.des)
                de = de.rank
            waiting.discard(r)
            out.append(self._place(r, pe, de))
        return out

    def _place(self, r, pe: int, de: int) -> Decision:
        plan, path = decide(self.policy, r, self.view(pe), self.view(de))
        pe_tokens = r.prompt_tokens + round(plan.recompute_tokens * (self.th.new_token_weight - 1.0))
        self.update(pe, 1, pe_tokens)
        self.update(de, 1, r.total_tokens, memory=r.total_tokens if self.de_memory == "reserved" else 0)
        self.read_q[self.engine(pe).node] += plan.pe_tokens(r)
        self.read_q[self.engine(de).node] += plan.de_tokens
        return Decision(r, pe, de, path, plan, pe_tokens)

    def _overrides(self) -> bool:
        return type(self.policy).engines is not Policy.engines

    def _views(self) -> tuple[list[EngineView], list[EngineView]]:
        return [self.view(e.rank) for e in self.pes], [self.view(e.rank) for e in self.des]
