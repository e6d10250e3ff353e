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
* Read path: the policy decides (DualPath: the side whose node has the shorter read queue), or a
  `Plan` splits the hit blocks between the two sides and recomputes a tail of them: each node's read
  queue takes its side's share, and the PE's tokens count every recomputed token as a new one
  (`Thresholds.new_token_weight` prompt tokens).

A DE's free memory (the DE rule's "free device memory") is counted one of two ways (`de_memory`):
resident (the run settings' default, docs/paper.md §3): what its device memory holds now: a request's
prompt + generation tokens leave it when its prompt KV moves in for decode (`kv_in`, which the owner
reports) and come back at its last token; placement takes none (the prompt KV waits in the DE buffer
in host DRAM until prefill ends, so the DE buffer bounds how far placement runs ahead). reserved (the
class's default, as it needs no `kv_in`): memory promised to placed requests, taken at placement. A
DE's tokens (its load, the Z rule) are taken at placement either way.

alpha = tokens a storage NIC reads in 3 s, beta = tokens an engine prefills in 5 s, both from
profiled rates. Requests are placed one at a time in FIFO order; a request whose DE group has
no memory for it holds up its own group's queue (no overtaking inside a group), not the others'.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import operator
import typing
from array import array

import numpy as np

from dualjax.core.fastinit import direct_init
from dualjax.core.policies import Plan, Policy, choose_engines, decide
from dualjax.core.waiting import GroupQueue, Waiting

ALPHA_S, BETA_S = 3.0, 5.0  # alpha: tokens a storage NIC reads in 3 s; beta: tokens a PE prefills in 5 s
DE_MEMORY = ("resident", "reserved")  # what a DE's free memory counts (module docstring)


@direct_init
@dataclasses.dataclass(frozen=True, slots=True)
class EngineView:
    rank: int
    role: str  # "prefill" | "decode"
    node: int
    seq: int = 0
    tokens: int = 0
    read_q_tokens: int = 0  # of its node's storage NIC
    free_tokens: int | None = None  # DE: KV tokens it can still take; None: no limit
    read_tokens_per_s: float | None = None  # its node's storage NIC (scheduler: alpha / 3 s unless given)
    prefill_tokens_per_s: float | None = None  # a PE: prompt tokens it prefills per second (beta / 5 s)
    # a PE: predicted seconds of a one-row pass, prefill_s(cached, new) (its packing fit); None: unknown
    prefill_s: typing.Callable[[int, int], float] | None = dataclasses.field(default=None, compare=False, repr=False)


@direct_init
@dataclasses.dataclass(frozen=True, slots=True)
class RequestView:
    id: int
    agent: int
    turn: int
    prompt_tokens: int
    hit_tokens: int
    gen_len: int
    block_tokens: int = 64  # the store's block: a Plan splits and recomputes whole blocks

    @property
    def miss_tokens(self) -> int:
        return self.prompt_tokens - self.hit_tokens

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.gen_len


@direct_init
@dataclasses.dataclass(frozen=True, slots=True)
class Decision:
    request: RequestView
    pe: int
    de: int
    path: str  # "pe" | "de" | "split" (the request table's label)
    plan: Plan = Plan()  # who reads which hit blocks, and the tail recomputed
    pe_tokens: int = 0  # what the PE's tokens took: the owner gives them back when its prefill ends


@dataclasses.dataclass(frozen=True)
class Thresholds:
    alpha_tokens: float  # tokens one storage NIC reads in 3 s
    beta_tokens: float  # tokens one PE prefills in 5 s
    new_token_weight: float = 1.0  # prompt tokens one recomputed (new rather than cached) token counts as

    @classmethod
    def from_rates(cls, snic_bytes_per_s: float, kv_bytes_per_token: float, prefill_tokens_per_s: float,
                   measured_at: tuple[int, int] = (1024, 256)):
        """`prefill_tokens_per_s`: new tokens per second of passes whose rows have `measured_at` = (cached,
        new) tokens (the shape `dualjax.runtime.startup.prefill_tokens_per_s` measures). A PE's tokens are
        its requests' prompt tokens (docs/paper.md §7), so beta counts a row's cached + new tokens per new
        one, and a recomputed token, new work where a loaded one was cached, counts as that many."""
        cached, new = measured_at
        ratio = (cached + new) / new
        return cls(ALPHA_S * snic_bytes_per_s / kv_bytes_per_token, BETA_S * prefill_tokens_per_s * ratio, ratio)

    @property
    def read_tokens_per_s(self) -> float:
        return self.alpha_tokens / ALPHA_S

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.beta_tokens / BETA_S


_C3 = 2**40  # added to the key of engines whose node queue is over alpha
_PE_SLOT = 2**20  # a PE's heap entry is key * _PE_SLOT + its position: one int orders as (key, position)
_GROUP_SLOT = 2**20  # a DE group's head entry is order * _GROUP_SLOT + the group: it orders as (order, group)


def _taker(indices: list[int]):
    """A function that takes `indices` of a list, in one C call: a slice when they are a contiguous run."""
    if indices == list(range(indices[0], indices[-1] + 1)):
        return operator.itemgetter(slice(indices[0], indices[-1] + 1))
    return operator.itemgetter(*indices)  # two or more: a tuple


def _first_least(indices: list[int], values: list) -> int:
    """The first of `indices` with the least value: `min(indices, key=values.__getitem__)` at less than
    half its cost in CPython 3.11 (a call of `min` with a key parses its keyword arguments)."""
    best, least = indices[0], values[indices[0]]
    for i in indices:
        if values[i] < least:
            best, least = i, values[i]
    return best


class Scheduler:
    """Engine state (requests, tokens, DE free memory, node read queues) and the placement rules.

    The owner reports changes with `update` and `set_read_queue`; `schedule` places waiting
    requests and applies its own decisions to the state. State lives in arrays so that a
    decision costs the same at 2 engines and at 1,152 (the simulator's paper scale)."""

    def __init__(self, policy: Policy, thresholds: Thresholds, engines: list[EngineView], naive: bool = False,
                 de_memory: str = "reserved"):
        if de_memory not in DE_MEMORY:
            raise ValueError(f"de_memory must be {' or '.join(DE_MEMORY)}, not {de_memory!r}")
        self.policy, self.th, self.naive, self.de_memory = policy, thresholds, naive, de_memory
        self._reserve = de_memory == "reserved"  # placement takes a DE's memory (else `kv_in` does)
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
        self.read_rate = [e.read_tokens_per_s or thresholds.read_tokens_per_s for e in engines]
        self.prefill_rate = [(e.prefill_tokens_per_s or thresholds.prefill_tokens_per_s) if e.role == "prefill"
                             else None for e in engines]
        self.prefill_s = [e.prefill_s for e in engines]
        nodes = sorted({e.node for e in engines})
        self.node_ids = nodes
        self.node_index = {n: i for i, n in enumerate(nodes)}
        self.node_of = [self.node_index[e.node] for e in engines]
        self.read_q = [0] * len(nodes)
        for e in engines:  # engines of a node share its queue
            n = self.node_index[e.node]
            self.read_q[n] = max(self.read_q[n], e.read_q_tokens)
        self._overrides = type(policy).engines is not Policy.engines
        self._rr = [0, 0]  # naive: next PE, next DE (round robin)
        # rounds with requests waiting that the PE rule ended (every PE over beta), and rounds in which the DE
        # rule refused a request (no DE of its group with memory for it): what holds requests in the queue
        self.stops = {"pe_rule": 0, "de_rule": 0}
        self._index_pes()
        self._index_groups()

    def _index_pes(self) -> None:
        """The PEs' positions, nodes and tokens, and pick_pe's heap."""
        pes = [i for i, r in enumerate(self.roles) if r == "prefill"]
        self.pe_ranks = [self.ranks[i] for i in pes]
        self.pe_pos: list[int | None] = [None] * len(self.ranks)  # engine -> its position among the PEs
        for k, i in enumerate(pes):
            self.pe_pos[i] = k
        self.pe_tokens = [self.tokens[i] for i in pes]
        self.pe_nodes = [self.node_of[i] for i in pes]
        self.node_pes: dict[int, list[int]] = {}  # node -> its PEs' positions
        for k, n in enumerate(self.pe_nodes):
            self.node_pes.setdefault(n, []).append(k)
        self._pe_open = sum(t <= self.th.beta_tokens for t in self.pe_tokens)  # PEs not over beta
        # pick_pe's order as a heap of ints key * _PE_SLOT + position (an int compares at a fraction of a
        # tuple's cost) with stale entries left in it: key = tokens, plus _C3 while the node's read queue is
        # over alpha; _pe_entry[k] is position k's valid entry, None over beta.
        if len(pes) >= _PE_SLOT:
            raise ValueError(f"the scheduler orders at most {_PE_SLOT - 1} prefill engines, not {len(pes)}")
        self._pe_heap: list[int] = []
        self._pe_entry: list[int | None] = [None] * len(pes)
        for k in range(len(pes)):
            self._pe_push(k)

    def _index_groups(self) -> None:
        """The DE groups (a node's DEs), level 1's queues and load, and the heap of their heads."""
        groups: dict[int, list[int]] = {}
        for i, r in enumerate(self.roles):
            if r == "decode":
                groups.setdefault(self.node_of[i], []).append(i)
        self.group_of: list[int | None] = [None] * len(self.ranks)  # engine -> its DE group
        for g, n in enumerate(sorted(groups)):
            for i in groups[n]:
                self.group_of[i] = g
        self.groups = [_taker(groups[n]) for n in sorted(groups)]  # takes a group's members of a per-engine list
        self.group_ranks = [[self.ranks[i] for i in groups[n]] for n in sorted(groups)]
        self.group_tokens = [sum(take(self.tokens)) for take in self.groups]
        self._de_blocked: dict[int, int] = {}  # group -> the request none of its DEs could take, until one changes
        self.group_queues = [GroupQueue() for _ in self.groups]  # level 1's assignment, FIFO per group
        # Level 1's key per group: its tokens plus those assigned to it and not yet placed (a placement moves
        # them from one to the other). An int64 `array` (a scalar update costs a fifth of a numpy one) that a
        # numpy view shares for the argmin.
        self.group_load = array("q", self.group_tokens)
        self._load_view = np.frombuffer(self.group_load, np.int64)
        self._order: dict[int, int] = {}  # waiting request id -> its place in the global FIFO
        self._queue: Waiting | None = None  # the queue `schedule` places from (the first one it is given)
        self._seen = 0  # requests of the waiting queue already given a group
        # Heap of order of the head * _GROUP_SLOT + group (ints) over the groups whose head may be placeable;
        # _in_heads[g]: group g's entry in the heap (None: not in it); _pending: groups a DE change may have
        # unblocked.
        if len(self.groups) >= _GROUP_SLOT:
            raise ValueError(f"the scheduler orders at most {_GROUP_SLOT - 1} DE groups, not {len(self.groups)}")
        self._heads: list[int] = []
        self._in_heads: list[int | None] = [None] * len(self.groups)
        self._pending: set[int] = set()
        self.de_list = [i for i, r in enumerate(self.roles) if r == "decode"]

    # -- state -------------------------------------------------------------------------------------
    def view(self, rank: int) -> EngineView:
        i = self.index[rank]
        n, free = self.node_of[i], self.free[i]
        return EngineView(rank, self.roles[i], self.node_ids[n], self.seq[i], self.tokens[i], self.read_q[n],
                          None if free == math.inf else free, self.read_rate[i], self.prefill_rate[i],
                          self.prefill_s[i])

    def _views(self) -> tuple[list[EngineView], list[EngineView]]:
        views = [self.view(r) for r in self.ranks]
        return [v for v in views if v.role == "prefill"], [v for v in views if v.role == "decode"]

    def update(self, rank: int, seq: int = 0, tokens: int = 0, placed: bool = False, memory: int | None = None) -> None:
        """Add `seq` requests and `tokens` tokens to an engine (negative when they leave); a DE's free
        memory moves the other way by `memory` tokens (default: `tokens`). `placed`: a DE's tokens of a
        request placed from its group's queue, which its group's load (level 1) counts already."""
        i = self.index[rank]
        self.seq[i] += seq
        before = self.tokens[i]
        self.tokens[i] = after = before + tokens
        if self.roles[i] == "decode":
            g = self.group_of[i]
            if g in self._de_blocked:
                del self._de_blocked[g]
                self._pending.add(g)  # its head may fit now: back among the candidates at the next round
            self.free[i] -= tokens if memory is None else memory
            self.group_tokens[g] += tokens
            if not placed:
                self.group_load[g] += tokens
        else:
            k = self.pe_pos[i]
            self.pe_tokens[k] = after
            beta = self.th.beta_tokens
            self._pe_open += (after <= beta) - (before <= beta)
            self._pe_push(k)

    def kv_in(self, rank: int, tokens: int) -> None:
        """A request's prompt KV moved into DE `rank`'s device memory for decode; `tokens`: its prompt +
        generation. Resident memory: the DE's free memory falls by them now (they come back with the
        request's `update` at its last token). Reserved: placement took them already, nothing changes."""
        if not self._reserve:
            self.update(rank, memory=tokens)

    def _pe_push(self, k: int) -> None:
        """PE position k's key changed: its old heap entry goes stale, a new one goes in (none over beta). An
        entry that equals the position's valid one is valid again (the same key and position, so the same
        choice)."""
        t = self.pe_tokens[k]
        if t <= self.th.beta_tokens:
            key = t if self.read_q[self.pe_nodes[k]] <= self.th.alpha_tokens else t + _C3
            self._pe_entry[k] = e = key * _PE_SLOT + k
            heapq.heappush(self._pe_heap, e)
        else:
            self._pe_entry[k] = None
        if len(self._pe_heap) > 4 * len(self._pe_entry) + 64:  # drop the stale entries and the copies
            entry = self._pe_entry
            self._pe_heap = sorted({e for e in self._pe_heap if entry[e % _PE_SLOT] == e})

    def set_read_queue(self, node: int, tokens: int) -> None:
        self._set_read_q(self.node_index[node], tokens)

    def _set_read_q(self, n: int, tokens: int) -> None:
        """Node n's read queue; its PEs' keys change when it crosses alpha."""
        alpha = self.th.alpha_tokens
        over = self.read_q[n] > alpha
        self.read_q[n] = tokens
        if (tokens > alpha) != over:
            for k in self.node_pes.get(n, ()):
                self._pe_push(k)

    def read_queue(self, node: int) -> int:
        return self.read_q[self.node_index[node]]

    # -- placement ---------------------------------------------------------------------------------
    def schedule(self, waiting: Waiting) -> list[Decision]:
        """Take from `waiting` every request that can be placed now, in FIFO order, except that a request
        whose DE group has no memory for it waits without holding up the other groups' (inside a group,
        no overtaking); no PE under beta stops the round. Only the heads of the groups' queues are
        candidates, taken in FIFO order from a heap, so a round costs its placements and the groups
        that changed, not the length of the queue. `waiting` is the same queue every round (the scheduler
        tracks the requests that joined it since the last)."""
        if self._queue is None:
            self._queue = waiting
        elif waiting is not self._queue:
            raise ValueError("a Scheduler places the requests of one Waiting queue: pass the same one every round")
        if self.naive:
            return self._schedule_naive(waiting)
        self._assign_groups(waiting)
        for g in self._pending:
            self._push_head(g)
        self._pending.clear()
        if not self._pe_open and not self._overrides:  # every PE over beta: the first head would stop the round
            if waiting:
                self.stops["pe_rule"] += 1
            return []
        out, heads, pe, refused = [], self._heads, None, False  # pe: pick_pe's answer until the state changes
        while heads:
            g = heads[0] % _GROUP_SLOT
            if self._in_heads[g] != heads[0]:  # an old entry of a group placed or blocked since
                heapq.heappop(heads)
                continue
            queue = self.group_queues[g]
            r = queue[0]
            forced = choose_engines(self.policy, r, *self._views()) if self._overrides else None
            if not forced and pe is None:
                pe = self.pick_pe(r)
                if pe is None:
                    self.stops["pe_rule"] += 1
                    break
            heapq.heappop(heads)
            self._in_heads[g] = None
            de = forced[1] if forced else self.pick_de(r, queue, g)
            if de is None:  # blocked until one of its DEs changes (`update`)
                refused = True
                continue
            waiting.discard(r)
            queue.popleft()
            del self._order[r.id]
            out.append(self._decide(r, forced[0] if forced else pe, de, g))
            pe = None
            self._push_head(g)
        if refused:
            self.stops["de_rule"] += 1
        return out

    def _push_head(self, g: int) -> None:
        """Make group g's head a candidate (once)."""
        queue = self.group_queues[g]
        if queue and self._in_heads[g] is None:
            self._in_heads[g] = e = self._order[queue[0].id] * _GROUP_SLOT + g
            heapq.heappush(self._heads, e)

    def _assign_groups(self, waiting: Waiting) -> None:
        """Level 1: each request that joined the queue since the last round goes to the DE group with the
        smallest total tokens, those already queued for it included."""
        new = waiting.appended - self._seen
        load, view = self.group_load, self._load_view
        for k, r in enumerate(waiting.newest(new) if new else (), start=self._seen):
            g = int(view.argmin())  # ties: the lowest node
            self._order[r.id] = k
            load[g] += r.prompt_tokens + r.gen_len
            self.group_queues[g].append(r)
            self._push_head(g)
        self._seen = waiting.appended

    def _decide(self, r: RequestView, pe: int, de: int, group: int | None = None) -> Decision:
        """Apply a placement; `group`: the DE group whose queue `r` was placed from (its load counts r)."""
        plan, path = decide(self.policy, r, self.view(pe), self.view(de))
        pe_tokens = r.prompt_tokens
        if plan.recompute_tokens:  # a recomputed token weighs as a new one
            pe_tokens += round(plan.recompute_tokens * (self.th.new_token_weight - 1.0))
        self.update(pe, 1, pe_tokens)
        total = r.prompt_tokens + r.gen_len
        placed = group is not None and self.group_of[self.index[de]] == group
        if group is not None and not placed:  # a policy's own DE, outside the group r was queued for
            self.group_load[group] -= total
        self.update(de, 1, total, placed=placed, memory=None if self._reserve else 0)
        if share := r.hit_tokens - plan.recompute_tokens - plan.de_tokens:  # the PE's reads (`Plan.pe_tokens`)
            n = self.node_of[self.index[pe]]
            self._set_read_q(n, self.read_q[n] + share)
        if share := plan.de_tokens:
            n = self.node_of[self.index[de]]
            self._set_read_q(n, self.read_q[n] + share)
        return Decision(r, pe, de, path, plan, pe_tokens)

    def _schedule_naive(self, waiting: Waiting) -> list[Decision]:
        """No alpha, beta or Z: the next PE and the next DE with memory for the request, round robin."""
        out, n_pe, n_de = [], len(self.pe_tokens), len(self.de_list)
        while waiting:
            r = waiting[0]
            forced = choose_engines(self.policy, r, *self._views()) if self._overrides else None
            if forced:
                pe, de = forced
            else:
                pe = self.pe_ranks[self._rr[0] % n_pe]
                k = next((k for k in range(n_de) if self.free[self.de_list[(self._rr[1] + k) % n_de]]
                          >= r.total_tokens), None)
                if k is None:
                    self.stops["de_rule"] += 1
                    break
                de = self.ranks[self.de_list[(self._rr[1] + k) % n_de]]
                self._rr = [self._rr[0] + 1, self._rr[1] + k + 1]
            waiting.popleft()
            out.append(self._decide(r, pe, de))
        return out

    def pick_pe(self, r: RequestView) -> int | None:
        """C2 (node read queue <= alpha) before C3, fewest tokens within each, engines over beta out (one
        key orders them: the heap's); ties: the lowest rank."""
        if not self._pe_open:  # every PE is over beta
            return None
        heap, entry = self._pe_heap, self._pe_entry
        while entry[heap[0] % _PE_SLOT] != heap[0]:
            heapq.heappop(heap)
        return self.pe_ranks[heap[0] % _PE_SLOT]

    def pick_de(self, r: RequestView, queue: Waiting | GroupQueue | None = None,
                group: int | None = None) -> int | None:
        """Level 2 inside `group` (default: the group with the smallest total tokens). `queue`: the group's
        waiting requests from r on (r first), for the R lookahead of the Z rule."""
        # ties: the lowest node
        g = self.group_tokens.index(min(self.group_tokens)) if group is None else group
        if self._de_blocked.get(g) == r.id:  # nothing changed in the group since r fitted nowhere
            return None
        take = self.groups[g]
        need = r.prompt_tokens + r.gen_len
        free, t, seq = take(self.free), take(self.tokens), take(self.seq)
        fits = [i for i, f in enumerate(free) if f >= need]
        if not fits:
            self._de_blocked[g] = r.id
            self._pending.discard(g)  # blocked until one of its DEs changes, whatever marked it before
            return None
        head = queue.head_tokens(sum(free)) if queue is not None else need
        z = 1.05 * ((head if head >= need else need) + sum(t)) / len(t)
        under = [i for i in fits if t[i] + need <= z]
        # min keeps the first of equal keys: ties go to the lowest rank
        i = _first_least(under, seq) if under else _first_least(fits, t)
        return self.group_ranks[g][i]
