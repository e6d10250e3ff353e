"""A request's plan in its three units (docs/architecture.md): the scheduler's `Plan` (tokens), the
runtime's `Assign` (blocks) and the simulator's `Row` (tokens) translate each way without loss, and both
sides read the same tokens from the same side."""

import numpy as np

from dualjax.core.policies import Plan
from dualjax.core.scheduler import Decision, RequestView
from dualjax.runtime.messages import Assign, Request
from dualjax.sim.prefill import Row


def _cases(n: int = 500, seed: int = 59):
    """Random requests (whole-block hits, at most prompt - 1 tokens) and random plans that fit them."""
    rng = np.random.default_rng(seed)
    for i in range(n):
        T = int(rng.choice([4, 16, 64]))
        prompt = int(rng.integers(1, 40 * T))
        hit = int(rng.integers(0, (prompt - 1) // T + 1)) * T
        de = int(rng.integers(0, hit // T + 1)) * T
        recompute = int(rng.integers(0, (hit - de) // T + 1)) * T
        deadline = None if rng.random() < 0.5 else float(rng.uniform(0, 2))
        r = RequestView(i, 0, 0, prompt, hit, 3, T)
        yield r, Decision(r, 1, 2, "split", Plan(de, recompute, deadline), int(rng.integers(0, prompt + 1)))


def test_plans_round_trip_through_assign_and_row():
    """Plan -> Assign -> Plan gives the plan back (its deadline only layerwise); Plan -> Row -> Plan
    gives it back without its deadline, which the simulation keeps apart."""
    for r, d in _cases():
        req = Request(r.id, 0, 0, np.zeros(r.prompt_tokens, np.int32), 3, 0.0)
        for layerwise in (True, False):
            a = Assign.placed(d, req, d.path, layerwise, 0.0)
            want = d.plan if layerwise else Plan(d.plan.de_tokens, d.plan.recompute_tokens)
            assert a.plan(r.block_tokens) == want, (r, d.plan, a)
        row = Row.placed(d, d.path, None)
        assert row.plan(r.hit_tokens) == Plan(d.plan.de_tokens, d.plan.recompute_tokens), (r, d.plan)


def test_both_sides_read_and_compute_the_same_tokens():
    """What each host reads and what the PE computes agree between the runtime's blocks and the
    simulator's tokens: DE reads de_tokens, the PE the loaded hit tokens after them, and the PE computes
    the prompt less the loaded tokens."""
    for r, d in _cases():
        T = r.block_tokens
        a = Assign.placed(d, Request(r.id, 0, 0, np.zeros(r.prompt_tokens, np.int32), 3, 0.0), d.path, True, 0.0)
        row = Row.placed(d, d.path, None)
        assert a.reads("decode") * T == row.de_tokens == d.plan.de_tokens
        assert a.reads("prefill") * T == row.cached - row.de_tokens == d.plan.pe_tokens(r)
        assert r.prompt_tokens - a.hit_blocks * T == row.remaining
        assert a.stored_blocks * T == r.hit_tokens and row.pe_load == d.pe_tokens
