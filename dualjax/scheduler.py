"""The DualPath scheduler (PAPER.md §7), over plain snapshots: no MPI, no JAX.

Engines report `seq` (unfinished requests), `tokens` (their tokens) and their node's storage
read queue; the scheduler places requests from the global FIFO queue:

* PE: drop engines with tokens > beta; C2 = the rest whose node read queue <= alpha, C3 = those
  above; take min tokens in C2, else in C3; neither -> stop (the request waits).
* DE, two levels: the DE group (node) with the smallest total tokens; inside it, R = the
  longest head of the waiting queue (from r on) that fits the group's free memory and
  Z = 1.05 * (sum of len over R + sum of tokens) / |E|; among DEs with memory for r prefer
  tokens + len(r) <= Z, picking min seq, else min tokens; none with memory -> stop.
* Read path: the policy decides (DualPath: the side whose node has the shorter read queue).

alpha = tokens a storage NIC reads in 3 s, beta = tokens an engine prefills in 5 s, both from
profiled rates. Requests are placed one at a time in FIFO order; a request that fits nowhere
stops the round (no overtaking), as in the paper.
"""

from __future__ import annotations

import dataclasses
from collections import deque

from dualjax.policies import Policy


@dataclasses.dataclass(frozen=True)
class EngineView:
    rank: int
    role: str  # "prefill" | "decode"
    node: int
    seq: int = 0
    tokens: int = 0
    read_q_tokens: int = 0  # of its node's storage NIC
    free_tokens: int | None = None  # DE: KV tokens it can still take; None: no limit


@dataclasses.dataclass(frozen=True)
class RequestView:
    id: int
    agent: int
    turn: int
    prompt_tokens: int
    hit_tokens: int
    gen_len: int

    @property
    def miss_tokens(self) -> int:
        return self.prompt_tokens - self.hit_tokens

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.gen_len


@dataclasses.dataclass(frozen=True)
class Decision:
    request: RequestView
    pe: int
    de: int
    path: str  # "pe" | "de"


@dataclasses.dataclass(frozen=True)
class Thresholds:
    alpha_tokens: float  # tokens one storage NIC reads in 3 s
    beta_tokens: float  # tokens one PE prefills in 5 s

    @classmethod
    def from_rates(cls, snic_bytes_per_s: float, kv_bytes_per_token: float, prefill_tokens_per_s: float):
        return cls(3.0 * snic_bytes_per_s / kv_bytes_per_token, 5.0 * prefill_tokens_per_s)


class Scheduler:
    def __init__(self, policy: Policy, thresholds: Thresholds):
        self.policy, self.th = policy, thresholds

    def schedule(self, waiting: deque, pes: list[EngineView], des: list[EngineView]) -> list[Decision]:
        """Pop from `waiting` (RequestViews, FIFO) every request that can be placed now."""
        pes = {e.rank: e for e in pes}
        des = {e.rank: e for e in des}
        out = []
        while waiting:
            r = waiting[0]
            forced = self.policy.engines(r, list(pes.values()), list(des.values()))
            pe = forced[0] if forced else self.pick_pe(r, pes.values())
            de = forced[1] if forced else self.pick_de(r, des.values(), waiting)
            if pe is None or de is None:
                break
            waiting.popleft()
            path = self.policy.path(r, pes[pe], des[de])
            if path not in ("pe", "de"):
                raise ValueError(f"policy {self.policy.name!r} chose path {path!r}; a path is 'pe' or 'de'")
            out.append(Decision(r, pe, de, path))
            pes[pe] = dataclasses.replace(pes[pe], seq=pes[pe].seq + 1, tokens=pes[pe].tokens + r.miss_tokens)
            free = des[de].free_tokens
            des[de] = dataclasses.replace(des[de], seq=des[de].seq + 1, tokens=des[de].tokens + r.total_tokens,
                                          free_tokens=None if free is None else free - r.total_tokens)
            side = pes if path == "pe" else des  # the chosen side's node queue grows by the hit tokens
            node = side[pe if path == "pe" else de].node
            for d in (pes, des):
                for rank, e in d.items():
                    if e.node == node:
                        d[rank] = dataclasses.replace(e, read_q_tokens=e.read_q_tokens + r.hit_tokens)
        return out

    def pick_pe(self, r: RequestView, pes) -> int | None:
        ok = [e for e in pes if e.tokens <= self.th.beta_tokens]
        c2 = [e for e in ok if e.read_q_tokens <= self.th.alpha_tokens]
        c3 = [e for e in ok if e.read_q_tokens > self.th.alpha_tokens]
        pool = c2 or c3
        return min(pool, key=lambda e: (e.tokens, e.rank)).rank if pool else None

    def pick_de(self, r: RequestView, des, queue=()) -> int | None:
        """`queue`: the waiting requests from r on (r first), for the R lookahead of the Z rule."""
        groups: dict[int, list[EngineView]] = {}
        for e in des:
            groups.setdefault(e.node, []).append(e)
        if not groups:
            return None
        group = min(groups.values(), key=lambda g: (sum(e.tokens for e in g), g[0].node))
        need = r.total_tokens
        fits = [e for e in group if e.free_tokens is None or e.free_tokens >= need]
        if not fits:
            return None
        free = None if any(e.free_tokens is None for e in group) else sum(e.free_tokens for e in group)
        head = 0  # total tokens of R: the longest head of the queue that fits the group's free memory
        for q in (list(queue) or [r]):
            if free is not None and head + q.total_tokens > free:
                break
            head += q.total_tokens
        z = 1.05 * (max(head, need) + sum(e.tokens for e in group)) / len(group)
        under = [e for e in fits if e.tokens + need <= z]
        if under:
            return min(under, key=lambda e: (e.seq, e.rank)).rank
        return min(fits, key=lambda e: (e.tokens, e.rank)).rank
