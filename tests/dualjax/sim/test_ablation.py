"""The ablation's steps as the paper defines them (docs/paper.md §10): without the scheduling algorithm the
read path is chosen blind to load too, since the §7 read-path rule is part of that algorithm."""

import dataclasses

import numpy as np

from dualjax.core.config import ClusterSpec, SimConfig
from dualjax.sim import build
from dualjax.sim.ablation import PAPER_STEPS, STEPS, ablation

CFG = SimConfig(ClusterSpec(2, 2), workload="paper-64k", agents=16, turns=5, snic_mbps=2000)


def columns(step: str) -> dict:
    return build(dataclasses.replace(CFG, layerwise=None, **dict(STEPS)[step]), progress=False).run().columns()


def test_the_paper_steps_are_in_order_and_the_naive_ones_schedule_nothing():
    """The paper's five steps in its order; every dual-path variant is naive at both levels."""
    names = [n for n, _ in STEPS]
    assert [n for n in names if n in PAPER_STEPS] == list(PAPER_STEPS)
    naive = {n: c for n, c in STEPS if c["scheduler"] == "naive"}
    assert naive == {"dual-path": dict(policy="round-robin", scheduler="naive"),
                     "dual-path-random": dict(policy="random", scheduler="naive"),
                     "dual-path-queue": dict(policy="dualpath", scheduler="naive")}


def test_the_dual_path_step_alternates_sides_request_by_request():
    """Naive placement is FIFO, so the k-th request placed is request k: the alternating step reads request k
    on the PE side when k is even and on the DE side when odd, whatever the read queues are."""
    c = columns("dual-path")
    hit = c["hit_tokens"] > 0
    expected = np.where(np.arange(len(hit)) % 2 == 0, "pe", "de")
    assert hit.sum() > 40 and (c["path"][hit] == expected[hit]).all()


def test_the_queue_step_follows_the_read_queues_and_the_blind_ones_do_not_depend_on_them():
    """Same engines (naive), three path rules: the random step's sides are its seeded coins, so a slower
    storage NIC changes its timings but not one path; the queue step reads both sides."""
    rnd = columns("dual-path-random")
    slow = build(dataclasses.replace(CFG, layerwise=None, snic_mbps=200, **dict(STEPS)["dual-path-random"]),
                 progress=False).run().columns()
    key = [np.lexsort((c["turn"], c["agent"])) for c in (rnd, slow)]  # ids follow the timings: by (agent, turn)
    (a, b), hit = ([c["path"][k] for c, k in zip((rnd, slow), key)]), rnd["hit_tokens"][key[0]] > 0
    assert (a[hit] == b[hit]).all() and {"pe", "de"} <= set(a[hit])
    assert not np.allclose(np.sort(rnd["done"]), np.sort(slow["done"]))
    queue = columns("dual-path-queue")
    assert {"pe", "de"} <= set(queue["path"][queue["hit_tokens"] > 0])


def test_ablation_runs_the_steps_asked_for():
    r = ablation(dataclasses.replace(CFG, agents=4, turns=2), log=lambda *_: None,
                 steps=("dual-path", "dual-path-queue"))
    assert set(r["jct_s"]) == {"dual-path", "dual-path-queue"}
    assert r["steps"]["dual-path"]["policy"] == "round-robin" and r["steps"]["dual-path-queue"]["policy"] == "dualpath"
