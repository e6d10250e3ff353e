"""Tokens where they are made (docs/paper.md §10): the first at the end of the PE's prefill pass, the second
at the DE's first decode step after the prompt's KV reached its HBM; TTST = second - first, so the P->D
hand-off is in TTST, not in TTFT."""

import dataclasses

import numpy as np
import pytest

from dualjax.core.config import ClusterSpec, SimConfig
from dualjax.sim import Simulation
from tests.dualjax.sim.test_sim import TOY_HW, TOY_MODEL


def test_the_first_token_is_the_pe_s_and_the_hand_off_is_in_ttst_by_hand():
    # One agent, one turn of 100 new tokens on the toy machine (1 ms per new token, 10 ms per decode step,
    # 1,000 bytes of KV per token) with a 0.5 MB/s compute NIC: the pass computes 0-0.1 s and streams its
    # 100 KB of KV to the DE from its start, 0-0.2 s. First token 0.1 (the pass's end), KV in the DE's HBM
    # at 0.2 (no loopback on this machine), second token one step later: 0.21. TTFT 0.1, TTST 0.11; TPOT
    # spans from the first token: 4 more tokens end at 0.24, (0.24 - 0.1) / 4.
    hw = dataclasses.replace(TOY_HW, cnic_bytes_per_s=0.5e6)
    cfg = SimConfig(ClusterSpec(1, 1), hardware="toy", model="toy", policy="dualpath")
    c = Simulation(cfg, hw, TOY_MODEL, [np.array([100])], [np.array([5])], np.zeros(1), progress=False).run().columns()
    assert c["prefill_end"][0] == c["first_token"][0] == pytest.approx(0.1)
    assert c["second_token"][0] == pytest.approx(0.21) and c["done"][0] == pytest.approx(0.24)
    assert c["ttft"][0] == pytest.approx(0.1) and c["ttst"][0] == pytest.approx(0.11)
    assert c["tpot"][0] == pytest.approx(0.14 / 4)


def test_every_first_token_is_its_prefill_end_and_every_second_follows_the_kv():
    """On the paper's machine: first token = prefill end for every request, and the second comes no earlier
    than the KV's arrival in the DE's HBM allows: after the first, and before the last."""
    from dualjax.sim import build
    sim = build(SimConfig(ClusterSpec(2, 2), workload="paper-64k", agents=8, turns=3), progress=False).run()
    c = sim.columns()
    assert (c["first_token"] == c["prefill_end"]).all()
    two = c["gen_len"] > 1
    assert (c["ttst"][two] > 0).all() and (c["second_token"][two] < c["done"][two]).all()
