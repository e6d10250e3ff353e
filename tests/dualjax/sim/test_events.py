"""The simulator's cost per request: the events a request takes follow from the mechanisms it goes through."""

import gc
import heapq

import pytest

from dualjax.core.config import ClusterSpec, SimConfig
from dualjax.sim import build


def _run(agents: int):
    cfg = SimConfig(ClusterSpec(2, 4), workload="paper-32k", agents=agents, turns=4)
    return build(cfg, progress=False).run()


def _mechanism_events(sim) -> tuple[int, int]:
    """(events every request takes whatever else runs, requests): an agent's first arrival, a group pass, and
    per request its KV's arrival at the DE, its first token (after the loopback into HBM) and, generating more
    than one token, the decode batch's step event. A storage read's end is no event: the read queues shrink
    before the next placement."""
    c = sim.columns()
    n = sim.n_requests
    multi = int((c["gen_len"] > 1).sum())
    passes = sum(g.passes for g in sim.groups)
    return len(sim.starts) + passes + 2 * n + multi, n


def test_a_lone_agent_takes_one_event_per_mechanism():
    sim = _run(agents=1)
    assert sim.events_done == _mechanism_events(sim)[0]


def test_concurrent_requests_add_at_most_one_batch_change_each():
    sim = _run(agents=64)
    base, n = _mechanism_events(sim)
    assert base <= sim.events_done <= base + n  # a join re-times its DE's batch: one superseded step event


@pytest.mark.parametrize("policy,basic_lands", [("dualpath", "hbm"), ("basic", "hbm"), ("basic", "host")])
def test_read_queues_shrink_by_every_read_ended_before_a_stop(policy, basic_lands):
    """Reads end without an event of their own (but Basic's into the PE buffer, which wake their PE): at
    each stop none that ended is still due, and once every request is done every node's read queue is empty."""
    cfg = SimConfig(ClusterSpec(2, 4), hardware="paper-h800", model="deepseek-v3.2", workload="paper-64k",
                    agents=64, turns=4, policy=policy, basic_lands=basic_lands)
    sim = build(cfg, progress=False)
    in_flight = 0
    for k in range(1, 240):
        sim.run(until=k * 0.25)
        assert all(t > k * 0.25 for t, *_ in sim.reads_due)
        in_flight += bool(sim.reads_due)
    sim.run()
    assert (in_flight > 0) == (basic_lands == "hbm")  # Basic's reads into the PE buffer are events
    assert not sim.reads_due
    assert [sim.scheduler.read_queue(n.id) for n in sim.nodes] == [0] * len(sim.nodes)


@pytest.mark.parametrize("policy", ["dualpath", "basic", "dualpath-split", "dualpath-recompute"])
def test_the_event_loop_makes_no_reference_cycles(policy):
    """`run` pauses the cyclic garbage collector, which is safe only while the loop leaves no cycles behind:
    everything it drops is freed by reference counting, so a collection afterwards finds nothing."""
    gc.collect()
    cfg = SimConfig(ClusterSpec(2, 4), workload="paper-32k", agents=64, turns=4, policy=policy)
    sim = build(cfg, progress=False)
    assert gc.isenabled()
    sim.run(until=5.0)  # part way: requests waiting, reads and passes in flight
    sim.run()
    assert gc.isenabled()  # restored
    assert gc.collect() == 0


def test_events_due_now_run_in_the_order_queued_among_those_of_the_heap():
    """`at` queues an event due now beside the heap (`Simulation.due`); the loop must still run the events
    due at one time in the order they were queued, whichever of the two holds them."""
    sim = build(SimConfig(ClusterSpec(2, 4), workload="paper-32k", agents=1, turns=1), progress=False)
    sim.seeded, log = True, []  # no agents: only the events below

    def ev(name, *then):
        log.append((sim.now, name))
        for later in then:
            if later.startswith("heap"):  # queued on the heap for now, as a decode step due at once is
                heapq.heappush(sim.events, (sim.now, sim.tick(), ev, (later,)))
            else:
                sim.at(sim.now, ev, later)

    sim.at(1.0, ev, "a", "a1", "heap-a2", "a3")
    sim.at(1.0, ev, "b", "b1")
    sim.at(2.0, ev, "c", "c1")
    sim.at(0.0, ev, "z")
    sim.run(until=3.0)
    assert log == [(0.0, "z"), (1.0, "a"), (1.0, "b"), (1.0, "a1"), (1.0, "heap-a2"), (1.0, "a3"), (1.0, "b1"),
                   (2.0, "c"), (2.0, "c1")]
