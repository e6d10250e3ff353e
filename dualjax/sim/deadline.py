"""Read deadlines in the simulator (`Plan.deadline_s`, docs/policies.md "Read deadlines").

A storage NIC is FIFO at a known rate, so when a read is issued its start and its end are known. A read
with a deadline that would end after it delivers only the whole blocks its NIC carries by then
(`floor((deadline - start) * rate / block bytes)`, none if it would start at or after the deadline),
holds the NIC until the deadline (the block in flight then is dropped) and frees it after; the
blocks it abandons leave its node's read queue at the deadline and become the row's recomputed tail:
new tokens of its passes, `recomputed_tokens` rather than `hit_tokens` in the request table. The
buffer room reserved for them stays held until the prefill ends, as in the runtime.
"""

from __future__ import annotations

import math
from heapq import heappush

from dualjax.sim.resources import DepthLink


def _rate(link, t: float) -> float:
    """The rate a read queued on `link` at `t` gets (a `DepthLink`: at the depth it would join)."""
    if isinstance(link, DepthLink):
        k = sum(1 for e in link.ends if e > t) + 1
        return link.rate * k / (k + link.half)
    return link.rate


def deliverable(link, t: float, nbytes: float, block_bytes: float, deadline: float) -> tuple[float, float]:
    """(bytes delivered, start) of a read of `nbytes` queued on `link` at `t` that must end by `deadline`:
    all of them if it ends in time, else the whole blocks carried by then."""
    start = t if t > link.free_at else link.free_at
    if link.free or start + nbytes / link.rate <= deadline:
        return nbytes, start
    if start >= deadline:
        return 0.0, start
    blocks = math.floor((deadline - start) * _rate(link, t) / block_bytes * (1 + 1e-12))
    return min(nbytes, blocks * block_bytes), start


def hold(link, t: float, deadline: float, reserved: bool = True) -> None:
    """The NIC keeps reading the abandoned block in flight, from when it is free after `t`, until
    `deadline`, then frees. `reserved`: the read just reserved its delivered blocks on `link` (a
    `DepthLink`'s last queued end is then its own, and moves to the deadline)."""
    begin = t if t > link.free_at else link.free_at
    if link.free or begin >= deadline:
        return
    link.busy_s += deadline - begin
    link.free_at = deadline
    if isinstance(link, DepthLink):
        if reserved and link.ends:
            link.ends[-1] = deadline
        else:
            link.ends.append(deadline)


def cut_read(sim, row, node, tokens: int) -> tuple[int, float | None]:
    """A layerwise read of `tokens` hit tokens by `node` for `row`, under the row's deadline if it has one:
    (tokens to read, the deadline when the read is cut else None). The abandoned tokens become the row's
    recomputed tail and leave the node's read queue at the deadline."""
    deadline = sim.deadlines.pop(row.rid, None)
    if deadline is None:
        return tokens, None
    block, kvb, link = sim.block_tokens, sim.kvb, node.snic
    got, start = deliverable(link, sim.now, tokens * kvb, block * kvb, deadline)
    got = int(round(got / kvb)) // block * block
    if got == tokens:
        return tokens, None
    lost = tokens - got
    row.cached -= lost
    row.remaining += lost
    c, rid = sim.cols, row.rid
    if row.de_tokens:  # the DE's read (a deadline is on one side's read only)
        row.de_tokens -= lost
        c.de_tokens[rid] -= lost
    c.hit_tokens[rid] -= lost
    c.recomputed_tokens[rid] += lost
    heappush(sim.reads_due, (deadline if deadline > sim.now else sim.now, sim.tick(), node.id, lost))
    if not got and start < deadline:  # nothing delivered; the NIC still reads until the deadline
        hold(link, sim.now, deadline, reserved=False)
    return got, deadline if start < deadline else None
