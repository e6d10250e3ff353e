"""Intra-engine balance (docs/paper.md §10): per forward of an expert-parallel PE group, the max over its
members of their batches' attention time over the members' mean (a member without a batch computes no
attention). It is what the compute quota exists to bound."""

import dataclasses

import numpy as np
import pytest

from dualjax.core.config import ClusterSpec, SimConfig
from dualjax.sim import Simulation
from tests.dualjax.sim.test_sim import TOY_HW, TOY_MODEL

# two PE GPUs stepping as one expert-parallel group; attention 1e-6 s x new x (cached + new / 2)
HW = dataclasses.replace(TOY_HW, gpus_per_node=2, ep_gpus=2, prefill_fit=(1e-6, 1e-3, 0.0))


def run(appends: list[int], starts: list[float]) -> Simulation:
    cfg = SimConfig(ClusterSpec(1, 1), hardware="toy", model="toy", policy="dualpath")
    return Simulation(cfg, HW, TOY_MODEL, [np.array([a]) for a in appends], [np.array([3])] * len(appends),
                      np.array(starts), progress=False).run()


def test_one_busy_member_of_two_is_twice_the_mean_and_equal_batches_are_even_by_hand():
    # A group pass starts as soon as a member has a row: agent 0 alone at 0, one member computes, the other
    # has no batch: max / mean = x / (x / 2) = 2. Agents 1 and 2 arrive while it computes, one on each member
    # (fewest tokens first), and share the next pass: equal prompts 1; 100 and 300 new tokens, attention
    # 1e-6 x 100 x 50 = 5 ms and 1e-6 x 300 x 150 = 45 ms: 45 / 25 = 1.8. Mean over the run's passes; the
    # first 5 % of the run (about 11 ms) holds the first pass only.
    one = run([100], [0.0]).pe_summary()["attention_max_over_avg"]
    assert one == {"mean": pytest.approx(2.0), "p99": pytest.approx(2.0), "first_5pct": pytest.approx(2.0),
                   "passes": 1}
    even = run([100, 100, 100], [0.0, 0.01, 0.01])
    assert [r for _, r in even.attention_balance] == pytest.approx([2.0, 1.0])
    assert even.pe_summary()["attention_max_over_avg"]["mean"] == pytest.approx(1.5)
    assert even.pe_summary()["attention_max_over_avg"]["first_5pct"] == pytest.approx(2.0)
    uneven = run([100, 100, 300], [0.0, 0.01, 0.01])
    assert [r for _, r in uneven.attention_balance] == pytest.approx([2.0, 1.8])


def test_engines_that_step_alone_have_no_group_balance():
    cfg = SimConfig(ClusterSpec(1, 1), hardware="toy", model="toy", policy="dualpath")
    sim = Simulation(cfg, dataclasses.replace(TOY_HW, prefill_fit=(1e-6, 1e-3, 0.0)), TOY_MODEL, [np.array([100])],
                     [np.array([3])], np.zeros(1), progress=False).run()
    assert sim.pe_summary()["attention_max_over_avg"] == {"mean": None, "p99": None, "first_5pct": None, "passes": 0}
