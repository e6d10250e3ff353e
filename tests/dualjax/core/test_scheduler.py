"""The scheduler's rules (docs/paper.md §7) on hand-worked cases. No MPI, no JAX."""

import math

import numpy as np
import pytest

from dualjax.core.policies import POLICIES, DualPath, Policy, RoundRobin, get_policy
from dualjax.core.scheduler import EngineView, RequestView, Scheduler, Thresholds, Waiting
from dualjax.core.waiting import GroupQueue

TH = Thresholds(alpha_tokens=1000, beta_tokens=5000)


def pe(rank, tokens=0, rq=0, node=None, seq=0):
    return EngineView(rank, "prefill", rank if node is None else node, seq, tokens, rq)


def de(rank, tokens=0, rq=0, node=None, seq=0, free=None):
    return EngineView(rank, "decode", rank if node is None else node, seq, tokens, rq, free)


def req(i=0, prompt=1000, hit=900, gen=100):
    return RequestView(i, i, 0, prompt, hit, gen)


def S(*engines, policy=None):
    return Scheduler(policy or DualPath(), TH, list(engines))


def test_pe_prefers_short_read_queue_then_fewest_tokens():
    # 1: over beta, dropped. 2: C3 (queue 1500 > alpha) though fewest tokens. 3, 4: C2 -> min tokens = 4.
    pes = [pe(1, tokens=6000), pe(2, tokens=10, rq=1500), pe(3, tokens=300, rq=10), pe(4, tokens=200, rq=900)]
    assert S(*pes, de(9)).pick_pe(req()) == 4


def test_pe_falls_back_to_long_queues_and_waits_when_all_are_busy():
    assert S(pe(1, tokens=900, rq=5000), pe(2, tokens=100, rq=2000), de(9)).pick_pe(req()) == 2
    assert S(pe(1, tokens=5001), pe(2, tokens=9000), de(9)).pick_pe(req()) is None


def test_de_picks_lightest_group_then_z_rule():
    # Node 10 has 1000 tokens in all, node 20 has 300: node 20. Inside it, len(r) = 1100,
    # Z = 1.05 * (1100 + 300) / 2 = 735: no DE is under Z (100+1100, 200+1100), so min tokens -> 5.
    des = [de(3, tokens=500, node=10), de(4, tokens=500, node=10), de(5, tokens=100, node=20),
           de(6, tokens=200, node=20)]
    assert S(pe(1), *des).pick_de(req()) == 5
    # Two DEs under Z: the one with fewer requests wins even with more tokens.
    # len(r) = 110; Z = 1.05 * (110 + 100 + 120 + 5000) / 3 = 1865.5: 7 (seq 3) and 8 (seq 1) are under.
    des = [de(7, tokens=100, seq=3, node=1), de(8, tokens=120, seq=1, node=1), de(9, tokens=5000, node=1)]
    assert S(pe(1), *des).pick_de(req(prompt=100, hit=50, gen=10)) == 8


def test_de_z_threshold_looks_ahead_over_the_queue_head_that_fits():
    # Free memory 3000 + 3000: of the queue [1100, 1100, 1100, 5000] the head that fits is the
    # first three (3300 tokens). Z = 1.05 * (3300 + 1000 + 0) / 2 = 2257.5: DE 7 (1000 + 1100 = 2100)
    # is under Z and has fewer requests than DE 8, so it wins over the lighter DE 8.
    des = [de(7, tokens=1000, seq=0, node=1, free=3000), de(8, tokens=0, seq=2, node=1, free=3000)]
    queue = [req(i, prompt=1000, gen=100) for i in range(3)] + [req(3, prompt=4900, gen=100)]
    assert S(pe(1), *des).pick_de(queue[0], Waiting(queue)) == 7
    # Without the lookahead (R = r alone) Z = 1.05 * (1100 + 1000) / 2 = 1102.5: only DE 8 is under it.
    assert S(pe(1), *des).pick_de(queue[0], Waiting(queue[:1])) == 8
    assert S(pe(1), *des).pick_de(queue[0]) == 8


def test_de_needs_memory_for_the_whole_request():
    des = [de(3, tokens=0, free=500, node=1), de(4, tokens=900, free=2000, node=1)]
    assert S(pe(1), *des).pick_de(req(prompt=1000, gen=100)) == 4  # 3 is lighter but cannot hold 1100 tokens
    assert S(pe(1), *des).pick_de(req(prompt=3000, gen=100)) is None


def test_dualpath_reads_on_the_side_with_the_shorter_queue():
    p = DualPath()
    assert p.path(req(), pe(1, rq=100), de(2, rq=50)) == "de"
    assert p.path(req(), pe(1, rq=50), de(2, rq=100)) == "pe"
    assert p.path(req(), pe(1, rq=70), de(2, rq=70)) == "pe"


def test_schedule_is_fifo_updates_loads_and_stops_at_the_first_misfit():
    waiting = Waiting([req(0, prompt=1000, hit=900), req(1, prompt=1000, hit=900), req(2, prompt=10**6, hit=0)])
    s = S(pe(1), de(2, free=5000))
    out = s.schedule(waiting)
    # r0: queues 0 vs 0 -> PE reads (PE queue 900). r1: PE 900 > DE 0 -> DE reads. r2 needs 1e6+100 tokens of
    # DE memory: it waits, and so would anything behind it.
    assert [(d.request.id, d.pe, d.de, d.path) for d in out] == [(0, 1, 2, "pe"), (1, 1, 2, "de")]
    assert [r.id for r in waiting] == [2]
    # The state carries the decisions: loads, the DE's memory and both read queues.
    # A PE's tokens are its requests' prompt tokens (docs/paper.md §7), not their misses.
    assert (s.view(1).seq, s.view(1).tokens, s.view(1).read_q_tokens) == (2, 2000, 900)
    assert (s.view(2).tokens, s.view(2).free_tokens, s.view(2).read_q_tokens) == (2200, 2800, 900)
    s.update(2, -1, -1100)
    s.set_read_queue(1, 0)
    assert (s.view(2).seq, s.view(2).free_tokens, s.view(1).read_q_tokens) == (1, 3900, 0)


def test_waiting_head_that_fits_memory():
    w = Waiting([req(i, prompt=100 * (i + 1), gen=0) for i in range(4)])  # totals 100, 200, 300, 400
    assert [w.head_tokens(f) for f in (50, 100, 299, 300, 999, 1000, math.inf)] == [0, 100, 100, 300, 600, 1000, 1000]
    w.popleft()
    assert (len(w), w[0].id, w.head_tokens(500), w.head_tokens(math.inf)) == (3, 1, 500, 900)
    w.append(req(9, prompt=50, gen=0))
    assert w.head_tokens(math.inf) == 950 and [r.id for r in w] == [1, 2, 3, 9]


def test_group_queue_lookahead_matches_the_waiting_queue():
    # A DE group's queue (a deque with running sums) answers the R lookahead as `Waiting` does, through appends,
    # heads taken and the compaction of its sums (past 4,096 heads taken).
    rng = np.random.default_rng(3)
    g, w, rid = GroupQueue(), Waiting(), 0
    for step in range(12_000):
        if rng.random() < 0.52 or not w:
            r = req(rid, prompt=int(rng.integers(1, 5000)), gen=int(rng.integers(0, 500)))
            g.append(r)
            w.append(r)
            rid += 1
        else:
            assert g.popleft() is w.popleft()
        assert len(g) == len(w) and (not g or g[0] is w[0])
        if step % 7 == 0:
            for free in (0, int(rng.integers(0, 20_000)), int(rng.integers(0, 10**6)), math.inf):
                assert g.head_tokens(free) == w.head_tokens(free)
    assert g.head < len(g.sums) < rid  # compacted along the way


def test_schedule_spreads_requests_over_engines_by_tokens():
    out = S(pe(1), pe(2), de(3), de(4)).schedule(Waiting(req(i, prompt=1000, hit=0) for i in range(4)))
    assert [d.pe for d in out] == [1, 2, 1, 2]
    assert sorted(d.de for d in out[:2]) == [3, 4]


def test_thresholds_come_from_rates():
    # alpha: 3 s x 1e9 B/s / 1e5 B per token. beta: 5 s x 2,000 new tokens/s measured over rows of 1,024
    # cached + 256 new tokens = 5 x 2,000 x 1,280 / 256 request tokens (a PE's tokens are prompt tokens).
    th = Thresholds.from_rates(snic_bytes_per_s=1e9, kv_bytes_per_token=1e5, prefill_tokens_per_s=2000)
    assert th.alpha_tokens == pytest.approx(30000) and th.beta_tokens == pytest.approx(50000)
    assert Thresholds.from_rates(1e9, 1e5, 2000, measured_at=(0, 1)).beta_tokens == pytest.approx(10000)


def test_de_groups_take_their_own_queues():
    # Level 1: r0 -> node 10 (0 vs 0, the lowest), r1 -> node 20 (10 now holds r0's 1,100 queued tokens),
    # r2 -> 10, r3 -> 20. Level 2 in node 10: R = its own queue [r0, r2] = 2,200 tokens, not the global
    # four (4,400): Z = 1.05 * (2200 + 0 + 0) / 2 = 1155; both DEs are under it, ties -> the lowest rank.
    s = S(pe(1), de(3, node=10), de(4, node=10), de(5, node=20), de(6, node=20))
    out = s.schedule(Waiting(req(i, prompt=1000, hit=900) for i in range(4)))
    assert [(d.request.id, d.de) for d in out] == [(0, 3), (1, 5), (2, 4), (3, 6)]


def test_a_request_that_fits_no_group_holds_up_only_its_own_group():
    # r0 (2,100 tokens) goes to node 10 (0 vs 0), whose DE holds 1,000: it waits. r1, r2, r3 go to node 20
    # (0 < 2,100 queued for node 10, then 510 and 620 < 2,100) and are placed; the old global FIFO stopped
    # every request (PE placement included) behind r0.
    s = S(pe(1), pe(2), de(3, node=10, free=1000), de(4, node=20, free=10**6))
    queue = Waiting([req(0, prompt=2000), req(1, prompt=500, gen=10), req(2, prompt=100, gen=10),
                     req(3, prompt=500, gen=10)])
    out = s.schedule(queue)
    assert [(d.request.id, d.de) for d in out] == [(1, 4), (2, 4), (3, 4)]
    assert [d.pe for d in out] == [1, 2, 2] and [r.id for r in queue] == [0]  # PE tokens 500, 100: r3 -> 2
    assert s.schedule(queue) == []  # nothing changed on node 10
    s.update(3, 0, -2000)  # node 10's DE frees memory: r0 goes
    assert [(d.request.id, d.de) for d in s.schedule(queue)] == [(0, 3)]


def test_a_second_waiting_queue_is_refused():
    # the scheduler counts the requests that joined its queue since the last round: another queue would
    # leave its requests unseen (never placed), so it is an error, not a silent wait
    s = S(pe(1), de(2))
    queue = Waiting([req(0)])
    assert [d.request.id for d in s.schedule(queue)] == [0]
    with pytest.raises(ValueError, match="one Waiting queue"):
        s.schedule(Waiting([req(1)]))


def test_naive_scheduler_round_robins_engines_without_the_rules():
    # Over beta (5,000 tokens) and alpha no longer matter: PEs 1, 2, 1, 2; DEs 3, 4, 3, 4, skipping DE 4 when
    # it lacks memory for a request.
    s = S(pe(1, tokens=9000), pe(2), de(3), de(4, free=1500), policy=DualPath())
    s.naive = True
    out = s.schedule(Waiting([req(0), req(1), req(2), req(3)]))
    assert [d.pe for d in out] == [1, 2, 1, 2]
    assert [d.de for d in out] == [3, 4, 3, 3]  # r1 took 1,100 of DE 4's 1,500: r3 skips it


def test_policies_by_name_and_custom_ones():
    assert set(POLICIES) >= {"basic", "pe-only", "de-only", "round-robin", "dualpath"}
    assert get_policy("basic").layerwise is False and get_policy("dualpath").layerwise is True
    with pytest.raises(KeyError, match="dualpath"):
        get_policy("fastest")
    rr = RoundRobin()
    assert [rr.path(req(), pe(1), de(2)) for _ in range(4)] == ["pe", "de", "pe", "de"]
    r = get_policy("random")
    assert [r.path(req(i), pe(1), de(2)) for i in range(8)] == [r.path(req(i), pe(1), de(2)) for i in range(8)]

    class Sideways(Policy):
        name = "sideways"

        def path(self, request, pe, de):
            return "left"

    with pytest.raises(ValueError, match="sideways"):
        S(pe(1), de(2), policy=Sideways()).schedule(Waiting([req()]))

    class Pinned(DualPath):
        def engines(self, request, pes, des):
            return 2, 4

    out = S(pe(1), pe(2), de(3), de(4), policy=Pinned()).schedule(Waiting([req()]))
    assert (out[0].pe, out[0].de) == (2, 4)


def test_engines_of_a_node_share_its_read_queue():
    # PEs 1 and 2 share node 10; DEs 3 and 4 share node 20. The first request is read on the PE side, so
    # node 10's queue (900) covers PE 2 as well, and the second request goes to the DE side.
    s = S(pe(1, node=10), pe(2, node=10), de(3, node=20), de(4, node=20))
    out = s.schedule(Waiting([req(0), req(1)]))
    assert [(d.pe, d.path) for d in out] == [(1, "pe"), (2, "de")]
    assert [s.view(r).read_q_tokens for r in (1, 2, 3, 4)] == [900, 900, 900, 900]


def test_scheduler_and_memory_settings_reach_real_runs_and_simulations():
    from dualjax.core.config import ConfigError, RunConfig, SimConfig, to_argv
    assert to_argv(RunConfig(scheduler="naive", pe_hbm_mb=5.0)) == ["--scheduler", "naive", "--pe-hbm-mb", "5.0"]
    assert SimConfig(scheduler="naive").scheduler == "naive"
    with pytest.raises(ConfigError, match="scheduler"):
        RunConfig(scheduler="greedy")
    with pytest.raises(ConfigError, match="pe_hbm_mb"):
        SimConfig(pe_hbm_mb=0)


def test_pick_pe_follows_every_change_of_tokens_and_read_queues():
    # pick_pe keeps its order incrementally (a heap); after any sequence of changes it must name the PE the
    # rule does: min tokens among those <= beta, C2 (node queue <= alpha) before C3, ties to the lowest rank.
    rng = np.random.default_rng(0)
    s = S(*(pe(r, node=10 + r // 3) for r in range(1, 10)), de(20))
    for _ in range(2000):
        if rng.random() < 0.7:
            s.update(int(rng.integers(1, 10)), 0, int(rng.integers(-3000, 3000)))
        else:
            s.set_read_queue(int(rng.integers(10, 13)), int(rng.integers(0, 2000)))
        views = [s.view(r) for r in range(1, 10)]
        open_ = [v for v in views if v.tokens <= TH.beta_tokens]
        best = min(open_, key=lambda v: (v.read_q_tokens > TH.alpha_tokens, v.tokens, v.rank), default=None)
        assert s.pick_pe(req()) == (best.rank if best else None)


def test_waiting_takes_requests_out_from_anywhere():
    w = Waiting([req(i, prompt=100, gen=0) for i in range(5)])
    w.discard(w[2])
    w.discard(w[0])
    assert [r.id for r in w] == [1, 3, 4] and w.head_tokens(250) == 200 and [r.id for r in w.newest(2)] == [3, 4]
    with pytest.raises(ValueError, match="already waiting"):
        w.append(req(3))


def test_snapshots_are_the_frozen_dataclasses_they_declare():
    """`direct_init` replaces the generated __init__ of the snapshots a placement builds: each must still
    be the frozen dataclass its fields declare (defaults, equality, hash, repr, replace, immutability)."""
    import dataclasses

    from dualjax.core.policies import Plan, direct_init
    from dualjax.core.scheduler import Decision
    made = [EngineView(2, "decode", 2, 1, 500, 7, 900, 60.0), EngineView(1, "prefill", 1),
            RequestView(3, 4, 5, 600, 512, 70), RequestView(3, 4, 5, 600, 512, 70, block_tokens=32),
            Plan(de_tokens=64), Plan(64, 128), Decision(req(), 1, 2, "de", Plan(64), 10)]
    for v in made:
        cls, fields = type(v), dataclasses.fields(v)
        twin = dataclasses.make_dataclass(cls.__name__, [(f.name, f.type, f) for f in fields], frozen=True)
        ref = twin(*[getattr(v, f.name) for f in fields])
        assert repr(v) == repr(ref) and hash(v) == hash(ref) and cls.__slots__ == tuple(f.name for f in fields)
        assert v == dataclasses.replace(v) and v != dataclasses.replace(v, **{fields[0].name: -1})
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(v, fields[0].name, -1)
    assert EngineView(1, "prefill", 1).seq == 0 and Decision(req(), 1, 2, "pe").plan == Plan()
    with pytest.raises(TypeError, match="plain fields"):
        direct_init(dataclasses.make_dataclass("Listy", [("xs", list, dataclasses.field(default_factory=list))],
                                               slots=True))
    with pytest.raises(TypeError, match="slotted"):
        direct_init(dataclasses.make_dataclass("Dicty", [("x", int)]))


def test_level_one_load_follows_placements_completions_and_pinned_engines():
    """Level 1 keeps each DE group's load (its tokens + those queued for it) as placements move requests
    from one to the other, completions leave and a policy pins a DE outside the group a request was queued for."""
    class PinnedSome(DualPath):
        def engines(self, request, pes, des):
            return (1, 6) if request.id % 3 == 0 else None

    rng = np.random.default_rng(1)
    s = S(pe(1), de(3, node=10, free=20000), de(4, node=10, free=20000), de(5, node=20, free=20000),
          de(6, node=20, free=20000), policy=PinnedSome())
    w, placed, n, pinned = Waiting(), [], 0, 0
    for _ in range(300):
        for _ in range(int(rng.integers(0, 3))):
            w.append(req(n, prompt=int(rng.integers(100, 1000)), hit=0, gen=int(rng.integers(1, 300))))
            n += 1
        out = s.schedule(w)
        for d in out:  # prefilled at once: the DEs' memory is what binds
            s.update(d.pe, -1, -d.pe_tokens)
        placed += out
        pinned += sum(d.de == 6 for d in out)
        for _ in range(min(len(placed), int(rng.integers(0, 3)))):
            d = placed.pop(int(rng.integers(0, len(placed))))
            s.update(d.de, -1, -d.request.total_tokens)
        for g, queue in enumerate(s.group_queues):
            assert s.group_load[g] == s.group_tokens[g] + sum(r.total_tokens for r in queue)
    assert n > 200 and pinned > 50


def test_resident_memory_is_taken_when_the_kv_moves_in_and_reserved_at_placement():
    # One DE with 2,500 tokens of memory, requests of 1,100 (1,000 prompt + 100 generated). Reserved: two
    # placements take 2,200, the third waits. Resident: placement takes none, all three are placed; their
    # load (tokens) is taken either way. Two KV moves in take 2,200 and leave 300; one request done gives
    # its 1,100 back in both readings.
    for reading, free_after_placing in (("reserved", 300), ("resident", 2500)):
        sch = Scheduler(DualPath(), TH, [pe(1), de(2, free=2500)], de_memory=reading)
        placed = sch.schedule(Waiting([req(i, prompt=1000, gen=100) for i in range(3)]))
        assert len(placed) == (2 if reading == "reserved" else 3), reading
        assert sch.view(2).free_tokens == free_after_placing and sch.view(2).tokens == 1100 * len(placed)
        sch.kv_in(2, 1100)
        sch.kv_in(2, 1100)
        assert sch.view(2).free_tokens == 300
        sch.update(2, -1, -1100)
        assert sch.view(2).free_tokens == 1400 and sch.view(2).tokens == 1100 * (len(placed) - 1)


def test_resident_memory_stops_placement_once_the_kv_in_memory_fills_it():
    """Resident: a DE whose device memory holds KV moved in has that much less for the DE rule."""
    sch = Scheduler(DualPath(), TH, [pe(1), de(2, free=2500)], de_memory="resident")
    waiting = Waiting([req(0, prompt=1900, gen=100)])
    assert len(sch.schedule(waiting)) == 1
    sch.kv_in(2, 2000)
    waiting.append(req(1, prompt=1000, gen=100))
    assert sch.schedule(waiting) == [] and sch.view(2).free_tokens == 500
    sch.update(2, -1, -2000)
    assert [d.request.id for d in sch.schedule(waiting)] == [1]
    with pytest.raises(ValueError, match="de_memory"):
        Scheduler(DualPath(), TH, [pe(1), de(2)], de_memory="pinned")
    from dualjax.core.config import ConfigError, RunConfig, SimConfig, to_argv
    assert to_argv(RunConfig(de_memory="reserved")) == ["--de-memory", "reserved"]
    assert SimConfig().de_memory == RunConfig().de_memory == "resident"
    with pytest.raises(ConfigError, match="de_memory"):
        SimConfig(de_memory="pinned")
