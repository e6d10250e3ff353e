"""Read deadlines in the simulator, by hand on the toy machine of test_sim_plans.py (storage 1 MB/s per
node, 1,000 B of KV per token: 1 ms a token, 64 ms a block; prefill 1 ms a new token): turn 1 is placed at
0.34 s and reads 256 hit tokens (4 blocks) on one side, which would end at 0.596 s. A deadline d after
placement delivers floor(d / 0.064) whole blocks, the NIC frees at 0.34 + d, and the PE recomputes the
rest with the 69 miss tokens."""

import numpy as np
import pytest

from dualjax.core.config import ClusterSpec, SimConfig
from dualjax.core.policies import Plan, Policy
from dualjax.sim import Simulation
from tests.dualjax.sim.test_sim import TOY_HW, TOY_MODEL
from tests.dualjax.sim.test_sim_plans import HIT, MISS, T0_DONE, layerwise_end


class Deadline(Policy):
    name = "deadline"

    def __init__(self, deadline_s, side="pe", layerwise=True):
        self.deadline_s, self.side, self.layerwise = deadline_s, side, layerwise

    def path(self, request, pe, de):
        if not request.hit_tokens:
            return "pe"
        return Plan(de_tokens=request.hit_tokens if self.side == "de" else 0, deadline_s=self.deadline_s)


def sim_of(policy) -> Simulation:
    cfg = SimConfig(ClusterSpec(1, 1), hardware="toy", model="toy")
    return Simulation(cfg, TOY_HW, TOY_MODEL, [np.array([300, 20])], [np.array([5, 5])], np.zeros(1), policy=policy,
                      progress=False)


@pytest.mark.parametrize("side", ["pe", "de"])
@pytest.mark.parametrize("deadline,blocks", [
    (0.0, 0),     # fires before the read starts: nothing loaded, all 4 blocks recomputed
    (0.15, 2),    # mid-read: 150 tokens' time carries 2 whole blocks (128 tokens); the third is dropped
    (0.192, 3),   # exactly at the third block's end: 3 blocks
    (0.3, 4),     # after the read's end (0.256 s): everything, as without a deadline
])
def test_a_deadline_delivers_the_whole_blocks_the_nic_carries_by_then(side, deadline, blocks):
    sim = sim_of(Deadline(deadline, side)).run()
    c, got = sim.columns(), blocks * 64
    node = 0 if side == "pe" else 1
    assert (c["hit_tokens"][1], c["recomputed_tokens"][1], c["de_tokens"][1]) == (
        got, HIT - got, got if side == "de" else 0)
    assert sim.host_stats()[node].snic.bytes_read == got * 1000
    snic = sim.nodes[node].snic
    nic_end = T0_DONE + min(deadline, HIT * 1e-3)  # cut: the NIC frees at the deadline
    assert snic.free_at == pytest.approx(nic_end if deadline else 0.0)
    assert snic.busy_s == pytest.approx(nic_end - T0_DONE)
    want = (layerwise_end(T0_DONE, T0_DONE + got * 1e-3, MISS + HIT - got) if got
            else T0_DONE + (MISS + HIT) * 1e-3)
    assert c["prefill_end"][1] == pytest.approx(want)
    # the scheduler's books close: every read queue and engine load back to zero
    sch = sim.scheduler
    assert [sch.read_queue(n) for n in sch.node_ids] == [0, 0]
    assert [(sch.view(r).seq, sch.view(r).tokens) for r in sch.ranks] == [(0, 0), (0, 0)]
    # the DE writes back the same blocks whatever was abandoned (they are in the store)
    assert [h.store.bytes_written for h in sim.host_stats() if h.role == "decode"] == [(4 + 1) * 64 * 1000]


def test_the_read_queue_gives_back_the_abandoned_blocks_at_the_deadline():
    # deadline 0.15 s: 128 tokens delivered by 0.468 s, 128 abandoned at 0.49 s
    sim = sim_of(Deadline(0.15))
    for until, queued in ((0.45, 256), (0.48, 128), (0.495, 0)):
        sim.run(until=until)
        assert sim.scheduler.read_queue(0) == queued, until


def test_no_deadline_and_an_infinite_one_are_the_same_run():
    a, b = sim_of(Deadline(None)).run().columns(), sim_of(Deadline(float("inf"))).run().columns()
    for k in ("prefill_end", "done", "hit_tokens", "recomputed_tokens"):
        assert np.array_equal(a[k], b[k], equal_nan=True), k


def test_basic_ignores_the_deadline():
    c = sim_of(Deadline(0.0, layerwise=False)).run().columns()
    assert (c["hit_tokens"][1], c["recomputed_tokens"][1]) == (HIT, 0)


def test_a_queue_depth_nic_delivers_at_the_rate_the_read_joins_at():
    from dualjax.sim.deadline import deliverable, hold
    from dualjax.sim.resources import DepthLink
    link = DepthLink(1000.0, 1.0)  # alone on it, a read gets 1,000 x 1 / (1 + 1) = 500 B/s
    got, start = deliverable(link, 0.0, 1000.0, 100.0, 0.5)
    assert (got, start) == (200.0, 0.0)  # 250 B by 0.5 s: 2 whole 100-B blocks
    assert link.reserve(0.0, got) == pytest.approx(0.4)  # the blocks kept end within the deadline
    hold(link, 0.0, 0.5)
    assert (link.free_at, list(link.ends), link.busy_s) == (0.5, [0.5], pytest.approx(0.5))
