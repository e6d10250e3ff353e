"""The scheduler's FIFO queues of waiting requests: `Waiting`, the global queue an owner (the runtime's
driver, the simulator) appends arrivals to, and `GroupQueue`, one DE group's share of it (the scheduler's
level 1). Both keep running sums of their requests' total tokens, so that the R lookahead of the DE rule
(the longest head that fits a group's free memory) is a bisection. The requests are `RequestView`s
(`dualjax.core.scheduler`, which imports this module). No MPI, no JAX."""

from __future__ import annotations

import bisect
import itertools
import math
from collections import OrderedDict, deque


def _longest_head(sums: list[int], head: int, free: float) -> int:
    """Total tokens of the longest head whose total is <= `free`, over running sums where sums[head] is the
    total before the head and sums[head + k] the total with its first k requests."""
    base = sums[head]
    end = bisect.bisect_right(sums, base + free, lo=head + 1) if free != math.inf else len(sums)
    return sums[end - 1] - base


def _past_head(sums: list[int], head: int) -> int:
    """The head left: the index of the total before the new head, the sums cut now and then."""
    head += 1
    if head > 4096 and head * 2 > len(sums):
        del sums[:head]
        return 0
    return head


class Waiting:
    """The global FIFO of waiting requests (keyed by id, in arrival order), with running sums of their
    total tokens, built when first needed, so that the R lookahead of the DE rule (the longest head that
    fits a group's free memory) is a bisection. A request leaves from the head (`popleft`) or from
    anywhere (`discard`: the head of one DE group's queue placed while an earlier request of another
    group waits), both in constant time."""

    def __init__(self, requests=()):
        self._items: OrderedDict = OrderedDict()
        self._sums: list[int] = [0]  # running total_tokens of the requests appended since the last rebuild
        self._head = 0  # index in _sums of the total before the head
        self.appended = 0  # requests ever appended
        self._stale = True  # _sums do not match _items (not built yet, or a request left from the middle)
        for r in requests:
            self.append(r)

    def append(self, r) -> None:
        if r.id in self._items:
            raise ValueError(f"request {r.id} is already waiting")
        self._items[r.id] = r
        self.appended += 1
        if not self._stale:
            self._sums.append(self._sums[-1] + r.total_tokens)

    def discard(self, r) -> None:
        """Take `r` out of the queue; the running sums are rebuilt when next needed unless it was the head."""
        if not self._stale and next(iter(self._items)) == r.id:
            self.popleft()
            return
        del self._items[r.id]
        self._stale = True

    def _rebuild(self) -> None:
        self._sums = list(itertools.accumulate((x.total_tokens for x in self._items.values()), initial=0))
        self._head, self._stale = 0, False

    def popleft(self):
        r = self._items.popitem(last=False)[1]
        if not self._stale:
            self._head = _past_head(self._sums, self._head)
        return r

    def newest(self, n: int) -> list:
        """The last `n` requests appended that are still waiting, oldest first."""
        if n == 1 and self._items:  # a round after one arrival: the common case, at less than half the cost
            return [next(reversed(self._items.values()))]
        return list(itertools.islice(reversed(self._items.values()), n))[::-1]

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self):
        return iter(self._items.values())

    def __getitem__(self, i: int):
        """The i-th waiting request (0: the head, constant time; others walk the queue)."""
        if i == 0 and self._items:
            return next(iter(self._items.values()))
        n = len(self._items)
        if not -n <= i < n:
            raise IndexError(f"waiting request {i} of {n}")
        return next(itertools.islice(self._items.values(), i % n, None))

    def head_tokens(self, free: float) -> int:
        """Total tokens of the longest head whose total is <= `free`."""
        if not self._items:
            return 0
        if self._stale:
            self._rebuild()
        return _longest_head(self._sums, self._head, free)


class GroupQueue(deque):
    """One DE group's waiting requests (level 1's assignment), FIFO: the head, length and iteration at deque
    speed, and running sums of their total tokens for the R lookahead (`head_tokens`, as `Waiting`'s). The
    scheduler takes requests from its head only."""

    __slots__ = ("sums", "head")

    def __init__(self):
        super().__init__()
        self.sums = [0]  # cumulative total tokens of the requests appended (since the last compaction)
        self.head = 0  # index in sums of the total before the head

    def append(self, r) -> None:
        deque.append(self, r)
        self.sums.append(self.sums[-1] + r.prompt_tokens + r.gen_len)

    def popleft(self):
        self.head = _past_head(self.sums, self.head)
        return deque.popleft(self)

    def head_tokens(self, free: float) -> int:
        """Total tokens of the longest head whose total is <= `free`."""
        return _longest_head(self.sums, self.head, free)
