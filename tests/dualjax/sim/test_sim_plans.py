"""Plans in the simulator, by hand on the toy machine of test_sim.py (storage 1 MB/s per node, 1,000 B of
KV per token: 1 ms a token; prefill 1 ms a new token; free transfers): each side reads its share on its
own node, recomputed tokens are prefill work, and the scheduler's bookkeeping returns to zero."""

import dataclasses

import numpy as np
import pytest

from dualjax.core.config import ClusterSpec, SimConfig
from dualjax.core.policies import Plan, Policy
from dualjax.sim import Simulation
from tests.dualjax.sim.test_sim import TOY_HW, TOY_MODEL

# One agent: turn 0 prefills 300 tokens (0.3 s) and decodes 4 steps (done at 0.34); turn 1 arrives at 0.34
# with 325 prompt tokens, 256 of them (4 blocks) in the store, 69 missing. L = 4 layers.
T0_DONE, HIT, MISS = 0.34, 256, 69


class Fixed(Policy):
    """Turn 1's plan: the DE reads `de` hit tokens, `tail` are recomputed."""
    name = "fixed"

    def __init__(self, de=0, tail=0, layerwise=True):
        self.de, self.tail, self.layerwise = de, tail, layerwise

    def path(self, request, pe, de):
        return Plan(self.de, self.tail) if request.hit_tokens else "pe"


def run(policy, hw=TOY_HW) -> Simulation:
    cfg = SimConfig(ClusterSpec(1, 1), hardware="toy", model="toy")
    return Simulation(cfg, hw, TOY_MODEL, [np.array([300, 20])], [np.array([5, 5])], np.zeros(1), policy=policy,
                      progress=False).run()


def layerwise_end(t0, t1, new):
    """A layerwise pass over one loading row (`PrefillSide._member_pass`): layer l computes once it arrived."""
    dur = new * 1e-3
    return max(t0 + dur, t0 + (t1 - t0) / 4 + dur, t1 + dur / 4)


@pytest.mark.parametrize("de,tail,reads", [
    (0, 0, (256, 0)),      # the PE path: 0.256 s on the PE's storage NIC
    (128, 0, (128, 128)),  # a split in the middle: 0.128 s on each NIC, at once
    (192, 0, (64, 192)),
    (0, 128, (128, 0)),    # half the hit recomputed: 128 more new tokens
    (64, 192, (0, 64)),    # a split of what is loaded, the rest recomputed
    (0, 256, (0, 0)),      # all of it recomputed: no read
])
def test_each_side_reads_its_share_and_the_pe_computes_the_tail(de, tail, reads):
    sim = run(Fixed(de, tail))
    c = sim.columns()
    assert (c["hit_tokens"][1], c["de_tokens"][1], c["recomputed_tokens"][1]) == (HIT - tail, de, tail)
    assert c["path"][1] == ("pe" if not de else "de" if de == HIT - tail else "split")
    read = max(reads) * 1e-3
    want = layerwise_end(T0_DONE, T0_DONE + read, MISS + tail) if read else T0_DONE + (MISS + tail) * 1e-3
    assert c["prefill_end"][1] == pytest.approx(want)
    assert [h.snic.bytes_read for h in sim.host_stats()] == [r * 1000 for r in reads]
    assert [h.kv_sent_bytes for h in sim.host_stats() if h.role == "decode"] == [de * 1000]  # the DE's relay
    # the DE writes back what the store lacks: the same with any plan (a recomputed tail is there already)
    assert [h.store.bytes_written for h in sim.host_stats() if h.role == "decode"] == [(4 + 1) * 64 * 1000]


@pytest.mark.parametrize("plan", [Fixed(128, 64), Fixed(0, 256), Fixed(256, 0, layerwise=False),
                                  Fixed(128, 64, layerwise=False)])
def test_the_scheduler_gives_back_every_share_and_token(plan):
    sim = run(plan)
    sch = sim.scheduler
    assert [sch.read_queue(n) for n in sch.node_ids] == [0, 0]
    assert [(sch.view(r).seq, sch.view(r).tokens) for r in sch.ranks] == [(0, 0), (0, 0)]


def test_basic_loads_both_shares_before_the_pass():
    # Basic: the DE's 128 tokens are read into the DE buffer once placed (0.34-0.468) and relayed when the
    # batch forms (free transfers); the PE's 128 are read into HBM at the same time; then 69 new tokens.
    c = run(Fixed(128, 0, layerwise=False)).columns()
    assert c["prefill_start"][1] == pytest.approx(T0_DONE + 0.128)
    assert c["prefill_end"][1] == pytest.approx(T0_DONE + 0.128 + MISS * 1e-3)


def test_recompute_policy_recomputes_when_the_storage_nic_is_slow():
    # at 0.1 MB/s loading 256 tokens takes 2.56 s, computing them with the misses 0.325 s: all recomputed;
    # at 2 MB/s a token loads in 0.5 ms and computes in 1 ms: none
    slow, fast = (dataclasses.replace(TOY_HW, snic_bytes_per_s=rate) for rate in (1e5, 2e6))
    c = run("dualpath-recompute", slow).columns()
    assert (c["recomputed_tokens"][1], c["hit_tokens"][1]) == (HIT, 0)
    assert run("dualpath-recompute", fast).columns()["recomputed_tokens"][1] == 0
