"""DE memory as docs/paper.md §3 describes it: the prompt KV waits in the DE buffer (host DRAM) until prefill
ends; it takes the DE's HBM when it moves in for decode, waiting in the buffer while the HBM is full, and
frees it at its last token. What the scheduler counts as a DE's free memory (`de_memory`): resident (the
HBM held now) or reserved (promised from placement)."""

import dataclasses

import numpy as np
import pytest

from dualjax.core.config import ClusterSpec, SimConfig
from dualjax.sim import Simulation, build
from tests.dualjax.sim.test_sim import TOY_HW, TOY_MODEL


def two_agents(de_memory: str) -> Simulation:
    # The toy machine with one decode slot: a DE holds 512 tokens of KV (its slot's capacity, the bucket of the
    # longest context). Two agents of one turn, 300 new tokens each, generating 40 and 5: 340 + 305 tokens,
    # more than the DE holds at once.
    cfg = SimConfig(ClusterSpec(1, 1), hardware="toy", model="toy", policy="dualpath", de_memory=de_memory)
    return Simulation(cfg, dataclasses.replace(TOY_HW, decode_batch=1), TOY_MODEL, [np.array([300])] * 2,
                      [np.array([40]), np.array([5])], np.zeros(2), progress=False).run()


def test_reserved_memory_holds_the_second_request_back_at_placement_by_hand():
    # Agent 0: prefill 0-0.3 s, KV in at 0.3, second token 0.31, its 40th at 0.69. Agent 1 fits no DE while
    # agent 0 holds 340 of 512 tokens: placed at 0.69, prefill 0.69-0.99, second token 1.00, done 1.03.
    c = two_agents("reserved").columns()
    assert c["scheduled"] == pytest.approx([0.0, 0.69]) and c["prefill_end"] == pytest.approx([0.3, 0.99])
    assert c["done"] == pytest.approx([0.69, 1.03]) and c["ttst"] == pytest.approx([0.01, 0.01])


def test_resident_memory_places_both_and_the_kv_waits_in_the_de_buffer_by_hand():
    # Both placed at 0; agent 1's pass follows agent 0's (0.3-0.6); its KV waits in the DE buffer until agent 0's
    # last token frees the HBM at 0.69, moves in then: second token 0.70 (TTST 0.1), done 0.73. Both prompts'
    # KV were in the DE buffer at once (600 KB), the HBM never held more than 340 of 512 tokens.
    sim = two_agents("resident")
    c = sim.columns()
    assert c["scheduled"] == pytest.approx([0.0, 0.0]) and c["prefill_end"] == pytest.approx([0.3, 0.6])
    assert c["second_token"] == pytest.approx([0.31, 0.70]) and c["done"] == pytest.approx([0.69, 0.73])
    assert c["ttst"] == pytest.approx([0.01, 0.1])
    assert sim.sim_summary()["de_buffer_peak_gb"] == pytest.approx(600e3 / 1e9)
    assert sim.link_summary()["de_memory_peak"] == pytest.approx(340 / 512)


@pytest.mark.parametrize("de_memory", ["resident", "reserved"])
def test_every_de_gets_all_its_memory_back(de_memory):
    """On the paper's machine, where DE memory binds: at the end every DE's HBM and the scheduler's free
    memory for it are whole again (every move in matched by a last token), and no KV is left waiting."""
    cfg = SimConfig(ClusterSpec(2, 2), workload="paper-64k", agents=96, turns=6, de_memory=de_memory)
    sim = build(cfg, progress=False).run()
    sch = sim.scheduler
    for de in sim.decoders:
        assert de.kv_free == de.kv_cap and not de.kv_wait
        assert sch.free[sch.index[de.rank]] == de.kv_cap and sch.tokens[sch.index[de.rank]] == 0
    assert sim.link_summary()["de_memory_peak"] <= 1.0
