"""The DualPath scheduler (docs/paper.md §7): no MPI, no JAX, so the runtime and the simulator run it alike.

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
import itertools
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
    def from_rates(cls, snic_bytes_per_s: float, kv_bytes_per_token: float, prefill_tokens_per_s: float,
                   measured_at: tuple[int, int] = (1024, 256)):
        """`prefill_tokens_per_s`: new tokens per second of passes whose rows have `measured_at` = (cached,
        new) tokens (the shape `dualjax.runtime.startup.prefill_tokens_per_s` measures). A PE's tokens are
        its requests' prompt tokens (docs/paper.md §7), so beta counts a row's cached + new tokens per new one."""
        cached, new = measured_at
        return cls(3.0 * snic_bytes_per_s / kv_bytes_per_token, 5.0 * prefill_tokens_per_s * (cached + new) / new)


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
        self.appended = 0  # requests ever appended
        self._stale = False  # _sums no longer match _items (a request left from the middle)
        for r in requests:
            self.append(r)

    def append(self, r: RequestView) -> None:
        self._items.append(r)
        if self._stale:
            self.appended += 1
            return
        self._sums.append((self._sums[-1] if self._sums else 0) + r.total_tokens)
        self.appended += 1

    def remove(self, i: int) -> RequestView:
        """Take the i-th waiting request out (0: the head); the running sums are rebuilt when next needed."""
        if i == 0 and not self._stale:
            return self.popleft()
        r = self._items[i]
        del self._items[i]
        self._stale = True
        return r

    def _rebuild(self) -> None:
        self._sums = list(itertools.accumulate((x.total_tokens for x in self._items), initial=0))[1:]
        self._base, self._head, self._stale = 0, 0, False

    def popleft(self) -> RequestView:
        if self._stale:
            return self.remove(0)
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
        if self._stale:
            self._rebuild()
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

    def __init__(self, policy: Policy, thresholds: Thresholds, engines: list[EngineView], naive: bool = False):
        self.policy, self.th, self.naive = policy, thresholds, naive
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
        self._de_blocked: dict[int, int] = {}  # group -> the request none of its DEs could take, until one changes
        self.group_queues = [Waiting() for _ in self.groups]  # level 1's assignment, FIFO per group
        self.group_queued = np.zeros(len(self.groups), np.int64)  # tokens assigned to a group, not yet placed
        self.assigned: dict[int, int] = {}  # waiting request id -> its DE group
        self._seen = 0  # requests of the waiting queue already given a group
        self._rr = [0, 0]  # naive: next PE, next DE (round robin)
        self.de_list = [i for i, r in enumerate(self.roles) if r == "decode"]

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
            self._de_blocked.pop(self.group_of[i], None)
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
        """Take from `waiting` every request that can be placed now: FIFO, except that a request whose
        DE group has no memory for its group's head waits without holding up the other groups'."""
        if self.naive:
            return self._schedule_naive(waiting)
        self._assign_groups(waiting)
        out, blocked, i = [], set(), 0
        while i < len(waiting) and len(blocked) < len(self.groups):
            r = waiting[i]
            g = self.assigned[r.id]
            if g in blocked:
                i += 1
                continue
            forced = self.policy.engines(r, *self._views()) if self._overrides else None
            pe = forced[0] if forced else self.pick_pe(r)
            if pe is None:
                break
            de = forced[1] if forced else self.pick_de(r, self.group_queues[g], g)
            if de is None:
                blocked.add(g)
                i += 1
                continue
            waiting.remove(i)
            self.group_queues[g].popleft()  # r heads its group's queue: nothing of the group was skipped
            self.group_queued[g] -= r.total_tokens
            del self.assigned[r.id]
            out.append(self._decide(r, pe, de))
        return out

    def _assign_groups(self, waiting: Waiting) -> None:
        """Level 1: each request that joined the queue since the last round goes to the DE group with the
        smallest total tokens, those already queued for it included."""
        new = waiting.appended - self._seen
        self._seen = waiting.appended
        for k in range(len(waiting) - new, len(waiting)):
            r = waiting[k]
            g = int((self.group_tokens + self.group_queued).argmin())  # ties: the lowest node
            self.assigned[r.id] = g
            self.group_queued[g] += r.total_tokens
            self.group_queues[g].append(r)

    def _decide(self, r: RequestView, pe: int, de: int) -> Decision:
        path = self.policy.path(r, self.view(pe), self.view(de))
        if path not in ("pe", "de"):
            raise ValueError(f"policy {self.policy.name!r} chose path {path!r}; a path is 'pe' or 'de'")
        self.update(pe, 1, r.prompt_tokens)
        self.update(de, 1, r.total_tokens)
        self.read_q[self.node_of[self.index[pe if path == "pe" else de]]] += r.hit_tokens
        return Decision(r, pe, de, path)

    def _schedule_naive(self, waiting: Waiting) -> list[Decision]:
        """No alpha, beta or Z: the next PE and the next DE with memory for the request, round robin."""
        out, n_pe, n_de = [], len(self.pe_tokens), len(self.de_list)
        while waiting:
            r = waiting[0]
            forced = self.policy.engines(r, *self._views()) if self._overrides else None
            if forced:
                pe, de = forced
            else:
                pe = self.ranks[_nth(self.pes, self._rr[0] % n_pe)]
                k = next((k for k in range(n_de) if self.free[self.de_list[(self._rr[1] + k) % n_de]]
                          >= r.total_tokens), None)
                if k is None:
                    break
                de = self.ranks[self.de_list[(self._rr[1] + k) % n_de]]
                self._rr = [self._rr[0] + 1, self._rr[1] + k + 1]
            waiting.popleft()
            out.append(self._decide(r, pe, de))
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

    def pick_de(self, r: RequestView, queue: Waiting | None = None, group: int | None = None) -> int | None:
        """Level 2 inside `group` (default: the group with the smallest total tokens). `queue`: the group's
        waiting requests from r on (r first), for the R lookahead of the Z rule."""
        g = int(self.group_tokens.argmin()) if group is None else group  # ties: the lowest node
        if self._de_blocked.get(g) == r.id:  # nothing changed in the group since r fitted nowhere
            return None
        members = self.groups[g]
        need = r.total_tokens
        free, t, seq = _take(self.free, members), _take(self.tokens, members), _take(self.seq, members)
        fits = [i for i, f in enumerate(free) if f >= need]
        if not fits:
            self._de_blocked[g] = r.id
            return None
        head = queue.head_tokens(sum(free)) if queue is not None else need
        z = 1.05 * (max(head, need) + sum(t)) / len(t)
        under = [i for i in fits if t[i] + need <= z]
        i = min(under, key=lambda i: (seq[i], i)) if under else min(fits, key=lambda i: (t[i], i))
        return self.ranks[_nth(members, i)]
