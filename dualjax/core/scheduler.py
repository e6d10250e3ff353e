"""The DualPath scheduler (PAPER.md §7): no MPI, no JAX, so the runtime and the simulator run it alike.

It keeps each engine's `seq` (unfinished requests), `tokens` (their tokens), a DE's free memory
and each node's storage read queue (what its owner reports), and places requests from the
global FIFO queue; policies see plain `EngineView` snapshots:

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

import bisect
import dataclasses
import math
from collections import deque

import numpy as np

from dualjax.core.policies import Policy


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


_C3 = 2**40  # added to the key of engines whose node queue is over alpha
_OUT = np.iinfo(np.int64).max


class Waiting:
    """The global FIFO of waiting requests, with running sums of their total tokens so that the
    R lookahead of the DE rule (the longest head that fits a group's free memory) is a bisection."""

    def __init__(self, requests=()):
        self._items: deque[RequestView] = deque()
        self._sums: list[int] = []  # cumulative total_tokens of every request ever appended
        self._base = 0  # cumulative total before the head
        self._head = 0  # index of the head in _sums
        for r in requests:
            self.append(r)

    def append(self, r: RequestView) -> None:
        self._items.append(r)
        self._sums.append((self._sums[-1] if self._sums else 0) + r.total_tokens)

    def popleft(self) -> RequestView:
        r = self._items.popleft()
        self._base = self._sums[self._head]
        self._head += 1
        if self._head > 4096 and self._head * 2 > len(self._sums):
            del self._sums[:self._head]
            self._head = 0
        return r

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self):
        return iter(self._items)

    def __getitem__(self, i: int) -> RequestView:
        return self._items[i]

    def head_tokens(self, free: float) -> int:
        """Total tokens of the longest head whose total is <= `free`."""
        if not self._items:
            return 0
        end = bisect.bisect_right(self._sums, self._base + free, lo=self._head) if free != math.inf else len(self._sums)
        return (self._sums[end - 1] - self._base) if end > self._head else 0


def _compact(indices: list[int]):
    """A slice when the indices are a contiguous run (cheaper to take), else an array."""
    if indices == list(range(indices[0], indices[-1] + 1)):
        return slice(indices[0], indices[-1] + 1)
    return np.array(indices)


def _take(values: list, indices) -> list:
    return values[indices] if isinstance(indices, slice) else [values[i] for i in indices]


def _nth(indices, i: int) -> int:
    return indices.start + i if isinstance(indices, slice) else int(indices[i])


class Scheduler:
    """Engine state (requests, tokens, DE free memory, node read queues) and the placement rules.

    The owner reports changes with `update` and `set_read_queue`; `schedule` places waiting
    requests and applies its own decisions to the state. State lives in arrays so that a
    decision costs the same at 2 engines and at 1,152 (the simulator's paper scale)."""

    def __init__(self, policy: Policy, thresholds: Thresholds, engines: list[EngineView]):
        self.policy, self.th = policy, thresholds
        engines = sorted(engines, key=lambda e: e.rank)
        if not any(e.role == "prefill" for e in engines) or not any(e.role == "decode" for e in engines):
            raise ValueError("the scheduler needs at least one prefill and one decode engine")
        self.ranks = [e.rank for e in engines]
        self.index = {r: i for i, r in enumerate(self.ranks)}
        self.roles = [e.role for e in engines]
        # Per-engine scalars as Python lists (cheap to update one at a time); PE tokens also as an
        # array for the vectorised PE choice.
        self.seq = [e.seq for e in engines]
        self.tokens = [e.tokens for e in engines]
        self.free = [math.inf if e.free_tokens is None else e.free_tokens for e in engines]
        nodes = sorted({e.node for e in engines})
        self.node_ids = nodes
        self.node_index = {n: i for i, n in enumerate(nodes)}
        self.node_of = np.array([self.node_index[e.node] for e in engines])
        self.read_q = np.zeros(len(nodes), np.int64)
        for e in engines:  # engines of a node share its queue
            n = self.node_index[e.node]
            self.read_q[n] = max(self.read_q[n], e.read_q_tokens)
        pes = [i for i, r in enumerate(self.roles) if r == "prefill"]
        self.pes = _compact(pes)
        self.pe_pos = {i: k for k, i in enumerate(pes)}
        self.pe_tokens = np.array([self.tokens[i] for i in pes], np.int64)
        self.pe_nodes = self.node_of[self.pes]
        groups: dict[int, list[int]] = {}
        for i, r in enumerate(self.roles):
            if r == "decode":
                groups.setdefault(int(self.node_of[i]), []).append(i)
        self.group_of = {i: g for g, n in enumerate(sorted(groups)) for i in groups[n]}
        self.groups = [_compact(groups[n]) for n in sorted(groups)]
        self.group_tokens = np.array([sum(_take(self.tokens, m)) for m in self.groups], np.int64)
        self._overrides = type(policy).engines is not Policy.engines
        self._pe_open = int((self.pe_tokens <= thresholds.beta_tokens).sum())  # PEs not over beta
        self._de_blocked = None  # id of the request no DE could take, until a DE's load changes

    # -- state -------------------------------------------------------------------------------------
    def view(self, rank: int) -> EngineView:
        i = self.index[rank]
        return EngineView(rank, self.roles[i], self.node_ids[self.node_of[i]], self.seq[i], self.tokens[i],
                          int(self.read_q[self.node_of[i]]), None if self.free[i] == math.inf else self.free[i])

    def _views(self) -> tuple[list[EngineView], list[EngineView]]:
        views = [self.view(r) for r in self.ranks]
        return [v for v in views if v.role == "prefill"], [v for v in views if v.role == "decode"]

    def update(self, rank: int, seq: int = 0, tokens: int = 0) -> None:
        """Add `seq` requests and `tokens` tokens to an engine (negative when they leave); a DE's free
        memory moves the other way."""
        i = self.index[rank]
        self.seq[i] += seq
        before = self.tokens[i]
        self.tokens[i] = after = before + tokens
        if self.roles[i] == "decode":
            self._de_blocked = None
            self.free[i] -= tokens
            self.group_tokens[self.group_of[i]] += tokens
        else:
            self.pe_tokens[self.pe_pos[i]] = after
            beta = self.th.beta_tokens
            self._pe_open += (after <= beta) - (before <= beta)

    def set_read_queue(self, node: int, tokens: int) -> None:
        self.read_q[self.node_index[node]] = tokens

    def read_queue(self, node: int) -> int:
        return int(self.read_q[self.node_index[node]])

    # -- placement ---------------------------------------------------------------------------------
    def schedule(self, waiting: Waiting) -> list[Decision]:
        """Pop from `waiting` every request that can be placed now, in FIFO order."""
        out = []
        while waiting:
            r = waiting[0]
            if self._de_blocked == r.id:
                break
            forced = self.policy.engines(r, *self._views()) if self._overrides else None
            pe = forced[0] if forced else self.pick_pe(r)
            de = None if pe is None else forced[1] if forced else self.pick_de(r, waiting)
            if de is None:
                break
            waiting.popleft()
            path = self.policy.path(r, self.view(pe), self.view(de))
            if path not in ("pe", "de"):
                raise ValueError(f"policy {self.policy.name!r} chose path {path!r}; a path is 'pe' or 'de'")
            out.append(Decision(r, pe, de, path))
            self.update(pe, 1, r.miss_tokens)
            self.update(de, 1, r.total_tokens)
            self.read_q[self.node_of[self.index[pe if path == "pe" else de]]] += r.hit_tokens
        return out

    def pick_pe(self, r: RequestView) -> int | None:
        if not self._pe_open:  # every PE is over beta
            return None
        t = self.pe_tokens
        # One key orders C2 before C3 and tokens within each; engines over beta are out.
        key = t + np.where(self.read_q <= self.th.alpha_tokens, 0, _C3)[self.pe_nodes]
        key[t > self.th.beta_tokens] = _OUT
        i = int(key.argmin())  # ties: the lowest rank
        return None if key[i] == _OUT else self.ranks[_nth(self.pes, i)]

    def pick_de(self, r: RequestView, queue: Waiting | None = None) -> int | None:
        """`queue`: the waiting requests from r on (r first), for the R lookahead of the Z rule."""
        if self._de_blocked == r.id:  # nothing changed on the DE side since r fitted nowhere
            return None
        members = self.groups[int(self.group_tokens.argmin())]  # ties: the lowest node
        need = r.total_tokens
        free, t, seq = _take(self.free, members), _take(self.tokens, members), _take(self.seq, members)
        fits = [i for i, f in enumerate(free) if f >= need]
        if not fits:
            self._de_blocked = r.id
            return None
        head = queue.head_tokens(sum(free)) if queue is not None else need
        z = 1.05 * (max(head, need) + sum(t)) / len(t)
        under = [i for i in fits if t[i] + need <= z]
        i = min(under, key=lambda i: (seq[i], i)) if under else min(fits, key=lambda i: (t[i], i))
        return self.ranks[_nth(members, i)]
