"""The paper's Oracle (docs/paper.md §10): DualPath with every storage read, host <-> device copy and P -> D
transfer free. It runs the same scheduler and compute as DualPath with less to wait for, so it can never
finish later."""

import dataclasses
import math

import numpy as np
import pytest

from dualjax.core.config import ClusterSpec, SimConfig
from dualjax.sim import Simulation, simulate
from dualjax.sim.profiles import PAPER_H800, get_hardware, oracle_of
from tests.dualjax.sim.test_sim import TOY_HW, TOY_MODEL

# The small settings the simulator's tests use: DeepSeek-V3.2 on paper-h800 nodes (two nodes per
# expert-parallel group), storage-bound (a capped storage NIC) and not, across clusters, workloads and agents.
SETTINGS = [
    dict(cluster="2p2d", workload="paper-64k", agents=16, turns=6),
    dict(cluster="2p2d", workload="paper-64k", agents=64, turns=8, snic_mbps=300),
    dict(cluster="2p4d", workload="paper-32k", agents=32, turns=5),
    dict(cluster="2p4d", workload="paper-48k", agents=48, turns=4, snic_mbps=1000),
    dict(cluster="4p2d", workload="paper-32k", agents=24, turns=4),
    dict(cluster="2p2d", workload="paper-32k", agents=8, turns=3, aps=0.5),
]


@pytest.mark.parametrize("setting", SETTINGS, ids=lambda s: "-".join(str(v) for v in s.values()))
def test_oracle_never_finishes_after_dualpath(setting):
    """Oracle's JCT <= DualPath's on the same cluster, workload and agents (the ablation's oracle step)."""
    cfg = SimConfig(**setting)
    dual = simulate(cfg, progress=False)
    oracle = simulate(dataclasses.replace(cfg, snic_mbps=None), hardware=oracle_of(PAPER_H800), progress=False)
    assert oracle["requests"] == dual["requests"]
    assert oracle["jct_s"] <= dual["jct_s"] * (1 + 1e-9)


def test_the_oracle_profile_is_paper_h800_with_free_io():
    """`--hardware oracle` is the ablation's Oracle: the same machine, I/O free, model traffic on its line."""
    hw = get_hardware("oracle")
    assert hw == oracle_of(PAPER_H800) and hw.free_io
    assert hw.cnic_bytes_per_s == PAPER_H800.cnic_bytes_per_s and hw.flops_per_s == PAPER_H800.flops_per_s


def test_oracle_reads_nothing_and_holds_no_buffer():
    """No storage read, no host buffer: the report has no storage traffic and no buffer budget; the
    store's hits still count (the KV is there, for free)."""
    cfg = SimConfig(ClusterSpec(2, 2), workload="paper-64k", agents=8, turns=4, hardware="oracle")
    r = simulate(cfg, progress=False)
    assert r["sim"]["pe_buffer_budget_gb"] == r["sim"]["de_buffer_budget_gb"] == 0.0
    assert all(h["buffer_budget_bytes"] is None for h in r["hosts"])
    assert r["sim"]["pe_buffer_peak_gb"] == r["sim"]["de_buffer_peak_gb"] == 0.0
    assert all(h["storage_bytes"] == 0 for h in r["hosts"]) and r["snic_max_over_avg"] is None
    assert r["hit_rate"] > 0.5


def test_oracle_timeline_by_hand():
    # The toy machine (1 ms per new token of prefill, 10 ms per decode step, 1 MB/s of storage). Turn 1 hits
    # 64 tokens: DualPath reads them (64 ms on the idle NIC) before its last layer computes; the Oracle reads
    # nothing, so turn 1's prefill of its 61 misses ends 61 ms after it arrives (at 0.14 s): 0.201.
    cfg = SimConfig(ClusterSpec(1, 1), hardware="toy", model="toy", policy="dualpath")
    sim = Simulation(cfg, oracle_of(TOY_HW), TOY_MODEL, [np.array([100, 20])], [np.array([5, 5])], np.zeros(1),
                     progress=False).run()
    c = sim.columns()
    assert c["prefill_end"] == pytest.approx([0.1, 0.201]) and c["hit_tokens"].tolist() == [0, 64]
    assert math.isinf(sim.scheduler.th.alpha_tokens)
