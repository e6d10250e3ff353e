"""The fast scheduler (`dualjax/core/scheduler.py`: heaps of packed ints, lazy deletion, running sums)
against the plain statement of its rules (`dualjax/core/reference.py`): driven by the same random events,
both must make the same decisions (request, PE, DE, path, plan, PE tokens) in every round and hold the
same state after it (every engine's view, every node's read queue, the waiting queue, each DE group's
queue and load).

Size: 8 policies x 48 scenarios (24 naive, 24 full; 6 cluster shapes, DE memory unlimited, tight or
mixed) x 16 rounds = 6,144 rounds whose states are compared (up to 16 engines each) and 9,798 decisions
(floors asserted per policy). A round's events: 0-4 arrivals, prefills and decodes finishing (`update` with negative
values), stray token changes, read-queue reports around alpha. No MPI, no JAX."""

import math
import random

import pytest

from dualjax.core.policies import DeOnly, DualPath, DualPathRecompute, DualPathSplit, PeOnly, Random, RoundRobin
from dualjax.core.reference import ReferenceScheduler
from dualjax.core.scheduler import EngineView, RequestView, Scheduler, Thresholds, Waiting

SHAPES = [(1, 1, 1, 1), (1, 2, 1, 2), (2, 2, 3, 1), (2, 1, 2, 3), (3, 2, 4, 2), (1, 4, 2, 4)]  # PE nodes x PEs, DE
SCENARIOS, ROUNDS = 48, 16


class Steer(DualPath):
    """Overrides `engines` for every third request, with a choice that depends on the state: the PE whose
    node has the shortest read queue and the DE with the most free memory (often outside the group level 1
    chose; no memory check)."""
    name = "steer"

    def engines(self, request, pes, des):
        if request.id % 3:
            return None
        pe = min(pes, key=lambda v: (v.read_q_tokens, v.tokens))
        return pe.rank, max(des, key=lambda v: math.inf if v.free_tokens is None else v.free_tokens).rank


POLICIES = {"dualpath": DualPath, "pe-only": PeOnly, "de-only": DeOnly, "round-robin": RoundRobin,
            "random": lambda: Random(seed=7), "dualpath-split": DualPathSplit,
            "dualpath-recompute": DualPathRecompute, "steer": Steer}


def fit(cached: int, new: int) -> float:  # a PE's predicted seconds of a one-row pass
    return 2e-3 + 4e-5 * new + 2e-9 * new * (cached + new)


def cluster(rng: random.Random, th: Thresholds, memory: str) -> list[EngineView]:
    pe_nodes, pes, de_nodes, des = rng.choice(SHAPES)
    n = pe_nodes * pes + de_nodes * des
    ranks = rng.sample(range(1, 4 * n), n)  # gaps, and a group's DEs not next to each other in rank order
    nodes = rng.sample(range(50), pe_nodes + de_nodes)
    out = []
    for k in range(n):
        if k < pe_nodes * pes:
            out.append(EngineView(ranks[k], "prefill", nodes[k // pes], rng.randint(0, 3),
                                  rng.randint(0, int(1.3 * th.beta_tokens)), rng.randint(0, int(2 * th.alpha_tokens)),
                                  read_tokens_per_s=rng.choice([None, 300.0, 2000.0]),
                                  prefill_tokens_per_s=rng.choice([None, 4000.0]), prefill_s=rng.choice([None, fit])))
        else:
            free = {"unlimited": None, "tight": rng.randint(0, 6000),
                    "mixed": rng.choice([None, rng.randint(0, 20000)])}[memory]
            out.append(EngineView(ranks[k], "decode", nodes[pe_nodes + (k - pe_nodes * pes) // des],
                                  rng.randint(0, 3), rng.randint(0, 5000), rng.randint(0, int(2 * th.alpha_tokens)),
                                  free, read_tokens_per_s=rng.choice([None, 500.0])))
    return out


def arrive(rng: random.Random, rnd: int, n: int, *queues: Waiting) -> int:
    """0-4 random requests of round `rnd`, numbered from `n`, into every queue; the next number."""
    for _ in range(rng.randint(0, 4)):
        block = rng.choice([16, 64])
        prompt = rng.randint(1, 3000)
        r = RequestView(n, rng.randint(0, 5), rnd, prompt, block * rng.randint(0, prompt // block),
                        rng.randint(1, 500), block)
        for q in queues:
            q.append(r)
        n += 1
    return n


def assert_alike(fast, ref, got, want, ranks, w_fast, w_ref, where: str) -> None:
    """One round's decisions, every engine's view and the waiting queue, the same in both schedulers."""
    assert ([(d.request.id, d.pe, d.de, d.path, d.plan, d.pe_tokens) for d in got]
            == [(d.request.id, d.pe, d.de, d.path, d.plan, d.pe_tokens) for d in want]), where
    assert [fast.view(r) for r in ranks] == [ref.view(r) for r in ranks], where
    assert [r.id for r in w_fast] == [r.id for r in w_ref], where


def pair(name: str, seed: int, naive: bool, memories: list[str], de_memory: str = "reserved"):
    """A scenario's start: (rng, thresholds, fast, reference, ranks, nodes, both), `both(method, *args)`
    calling the method on the two schedulers alike."""
    rng = random.Random(seed)
    th = Thresholds(rng.randint(500, 5000), rng.randint(2000, 20000), rng.choice([1.0, 1.5, 5.0]))
    engines = cluster(rng, th, rng.choice(memories))
    fast = Scheduler(POLICIES[name](), th, engines, naive=naive, de_memory=de_memory)
    ref = ReferenceScheduler(POLICIES[name](), th, engines, naive=naive, de_memory=de_memory)

    def both(method: str, *args) -> None:
        getattr(fast, method)(*args)
        getattr(ref, method)(*args)

    return rng, th, fast, ref, [e.rank for e in engines], sorted({e.node for e in engines}), both


def run_scenario(name: str, seed: int, naive: bool, tally: dict) -> None:
    rng, th, fast, ref, ranks, nodes, both = pair(name, seed, naive, ["unlimited", "tight", "mixed"])
    w_fast, w_ref, live, n = Waiting(), Waiting(), [], 0
    for rnd in range(ROUNDS):
        n = arrive(rng, rnd, n, w_fast, w_ref)
        for d in list(live):  # prefills, then decodes, finish
            if d[1] and rng.random() < 0.5:
                both("update", d[0].pe, -1, -d[0].pe_tokens)
                d[1] = False
            elif not d[1] and rng.random() < 0.3:
                both("update", d[0].de, -1, -d[0].request.total_tokens)
                live.remove(d)
        if rng.random() < 0.3:
            both("update", rng.choice(ranks), 0, rng.randint(-400, 400))
        for _ in range(rng.randint(0, 2)):
            both("set_read_queue", rng.choice(nodes), rng.randint(0, int(2 * th.alpha_tokens)))
        got, want = fast.schedule(w_fast), ref.schedule(w_ref)
        where = f"{name} seed={seed} naive={naive} round={rnd}"
        assert_alike(fast, ref, got, want, ranks, w_fast, w_ref, where)
        assert [fast.read_queue(x) for x in nodes] == [ref.read_queue(x) for x in nodes], where
        assert list(fast.group_load) == [ref.load(g, w_ref) for g in ref.groups], where
        if not naive:
            assert ([[r.id for r in q] for q in fast.group_queues]
                    == [[r.id for r in ref.queue(g, w_ref)] for g in ref.groups]), where
        live += [[d, True] for d in got]
        tally["rounds"] += 1
        tally["decisions"] += len(got)
        tally["left waiting"] += bool(got) and len(w_fast) > 0
        tally["overtook"] += sum(d.request.id > min((r.id for r in w_fast), default=math.inf) for d in got)
        tally["split or recomputed"] += sum(d.path == "split" or d.plan.recompute_tokens > 0 for d in got)
        tally["weighted"] += sum(d.pe_tokens != d.request.prompt_tokens for d in got)


@pytest.mark.parametrize("name", POLICIES)
def test_fast_and_reference_schedulers_decide_alike(name):
    """The fast scheduler is rewritten for speed now and then; the reference is the rules as the paper
    gives them. Any departure of one from the other shows as the first round where they differ."""
    tally = dict.fromkeys(["rounds", "decisions", "left waiting", "overtook", "split or recomputed", "weighted"], 0)
    for seed in range(SCENARIOS):
        run_scenario(name, seed, naive=seed % 2 == 1, tally=tally)
    assert tally["rounds"] == SCENARIOS * ROUNDS
    # placements; rounds that leave requests waiting; requests placed ahead of an earlier one (another group's)
    assert tally["decisions"] > 1000 and tally["left waiting"] > 100 and tally["overtook"] > 30, tally
    if name in ("dualpath-split", "dualpath-recompute"):
        assert tally["split or recomputed"] > 200, tally
    if name == "dualpath-recompute":  # recomputed tokens weighed as new ones on the PE
        assert tally["weighted"] > 50, tally
