"""Resident DE memory (`de_memory="resident"`, docs/paper.md §3): placement takes a DE's load but not its
memory, which the owner's `kv_in` takes when a request's KV moves in. The fast scheduler and the plain
reference must still decide alike, driven by the same random events as in test_reference_scheduler.py
plus the moves in (each live request's KV moves in after its prefill, before it finishes)."""

import pytest

from dualjax.core.scheduler import Waiting
from tests.dualjax.core.test_reference_scheduler import arrive, assert_alike, pair

SCENARIOS, ROUNDS = 16, 16


def run_scenario(name: str, seed: int, naive: bool, tally: dict) -> None:
    rng, th, fast, ref, ranks, nodes, both = pair(name, seed, naive, ["tight", "mixed"], "resident")
    w_fast, w_ref, live, n = Waiting(), Waiting(), [], 0
    for rnd in range(ROUNDS):
        n = arrive(rng, rnd, n, w_fast, w_ref)
        for d in list(live):  # [decision, stage]: 0 prefilling, 1 KV waiting in the DE buffer, 2 decoding
            if d[1] == 0 and rng.random() < 0.5:
                both("update", d[0].pe, -1, -d[0].pe_tokens)
                d[1] = 1
            elif d[1] == 1 and rng.random() < 0.5:
                both("kv_in", d[0].de, d[0].request.total_tokens)
                d[1] = 2
            elif d[1] == 2 and rng.random() < 0.3:
                both("update", d[0].de, -1, -d[0].request.total_tokens)
                live.remove(d)
        for _ in range(rng.randint(0, 2)):
            both("set_read_queue", rng.choice(nodes), rng.randint(0, int(2 * th.alpha_tokens)))
        got, want = fast.schedule(w_fast), ref.schedule(w_ref)
        assert_alike(fast, ref, got, want, ranks, w_fast, w_ref, f"{name} seed={seed} naive={naive} round={rnd}")
        live += [[d, 0] for d in got]
        tally["decisions"] += len(got)
        tally["moved in"] += sum(d[1] == 2 for d in live)


@pytest.mark.parametrize("name", ["dualpath", "round-robin", "dualpath-recompute", "steer"])
def test_fast_and_reference_schedulers_decide_alike_with_resident_memory(name):
    tally = {"decisions": 0, "moved in": 0}
    for seed in range(SCENARIOS):
        run_scenario(name, seed, naive=seed % 2 == 1, tally=tally)
    assert tally["decisions"] > 200 and tally["moved in"] > 100, tally
