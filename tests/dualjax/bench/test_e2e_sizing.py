"""The e2e benchmark's wall-time sizing and the speed probe `sim validate` scales the profile by, by
hand (no runs: the benchmark itself runs in test_runtime)."""

import dataclasses
import os

import pytest

from dualjax.bench.e2e import (
    CONTROL,
    Spec,
    _cost,
    _dir,
    _fit_wall,
    _grow_to,
    _naive,
    _name,
    _planned,
    pass_shapes,
    spread,
)
from dualjax.sim.profiles import get_hardware
from dualjax.sim.validate import _probe_of, _speed_ratio


def test_the_size_grows_only_as_far_as_the_bound_allows():
    # at 2 agents: warm-up 30 s wall, control 5 s JCT, essential runs 10 control JCTs, 20 s of overheads:
    # n agents cost n / 2 * (30 + 11 * 5) + 20 = 42.5 n + 20 s
    assert _grow_to(2, 10, 30.0, 5.0, 10.0, 20.0, budget_s=1000.0) == 10
    assert _grow_to(2, 10, 30.0, 5.0, 10.0, 20.0, budget_s=42.5 * 6 + 20) == 6
    assert _grow_to(2, 10, 30.0, 5.0, 10.0, 20.0, budget_s=42.5 * 6 + 19) == 5
    assert _grow_to(2, 10, 30.0, 5.0, 10.0, 20.0, budget_s=10.0) == 2  # never below where it started


def test_essential_runs_shrink_the_agents_and_the_rest_are_left_out():
    planned, essential = _planned(quick=False, hbm_only=False)
    assert essential == 10 and len(planned) == 17
    # storage factor 6: 1p1d basic 6 + 1 (it loads, then computes), dualpath 3, naive 3, 1p2d basic 7, dualpath 2,
    # naive 2, memory budget basic 7, pe-only 6, dualpath 3, 1p1d basic one batch ahead 6 (its compute overlaps):
    # 46 control JCTs
    assert sum(_cost(r, 6.0) for r in planned[:essential]) == pytest.approx(46.0)
    kept, agents, left = _fit_wall(planned, essential, 6.0, 10.0, 5.0, budget_s=46 * 10 + 10 * 5 + 100, agents=4)
    assert agents == 4 and kept[:essential] == planned[:essential] and len(kept) + len(left) == len(planned)
    # 510 s spent, then each while it fits 610 s: 2p1d basic (4 x 10 + 5) and dualpath (25: 580 s), not the
    # pe-only runs (65, 65, 35), 2p2d dualpath (20: 600 s), not 2p2d round-robin (20)
    assert kept[essential:] == [Spec("2p1d", "basic"), Spec("2p1d", "dualpath"), Spec("2p2d", "dualpath")]
    kept, agents, left = _fit_wall(planned, essential, 6.0, 10.0, 5.0, budget_s=(46 * 10 + 10) / 2 + 11 * 5, agents=4)
    assert agents == 2 and kept == planned[:essential] and left == planned[essential:]


def test_repeats_run_round_after_round_with_the_control_again():
    """Each configuration `repeats` times, the essential rounds first, the control again from the second
    round on (its first run is measured before); DualPath's step without scheduling beside it."""
    once, n = _planned(quick=True, hbm_only=False)
    assert [_name(r) for r in once] == ["1p1d-basic", "1p1d-dualpath", "1p1d-round-robin-naive", "1p2d-basic",
                                        "1p2d-dualpath", "1p2d-round-robin-naive"] and n == 6
    runs, essential = _planned(quick=True, hbm_only=False, repeats=3)
    assert essential == len(runs) == 3 * 6 + 2
    assert runs[:6] == once and runs[6] == Spec("1p1d", "basic", capped=False, repeat=1) and _name(runs[6]) == CONTROL
    assert [r._replace(repeat=0) for r in runs[7:13]] == once and {r.repeat for r in runs[13:]} == {2}
    assert len({_dir(r) for r in runs}) == len(runs) and _dir(runs[8]) == "1p1d-dualpath-r1"
    assert _cost(runs[6], 6.0) == 1.0  # the control is the unit
    full, essential = _planned(quick=False, hbm_only=False, repeats=3)
    assert essential == 3 * 10 + 2 and len(full) == 3 * 17 + 2 and all(r.repeat == 0 for r in full[:10])


def test_spread_and_what_scheduling_buys():
    assert spread([3.0, 1.0, 2.0]) == {"values": [3.0, 1.0, 2.0], "n": 3, "min": 1.0, "median": 2.0, "max": 3.0,
                                        "spread": 1.0}
    # per round naive / dualpath: 12/10, 10/10, 18/12 = 1.2, 1.0, 1.5; medians 12 / 10
    done = {"1p1d-dualpath": [(Spec("1p1d", "dualpath", repeat=k), {"jct_s": t}) for k, t in enumerate([10, 10, 12])],
            "1p1d-round-robin-naive": [(Spec("1p1d", "round-robin", scheduler="naive", repeat=k), {"jct_s": t})
                                       for k, t in enumerate([12, 10, 18])]}
    got = _naive(done)
    assert set(got) == {"1p1d"} and got["1p1d"]["of_medians"] == pytest.approx(1.2)
    assert got["1p1d"]["per_round"]["values"] == pytest.approx([1.2, 1.0, 1.5])
    assert got["1p1d"]["per_round"]["median"] == pytest.approx(1.2)


def test_the_hbm_set_is_the_memory_budget_runs_and_basic_both_ways():
    planned, essential = _planned(quick=False, hbm_only=True)
    assert planned == [Spec("1p1d", "basic", True), Spec("1p1d", "pe-only", True), Spec("1p1d", "dualpath", True),
                       Spec("1p1d", "basic"), Spec("1p1d", "basic", ahead=1)] and essential == 5
    assert [_name(r) for r in planned[-2:]] == ["1p1d-basic", "1p1d-basic-ahead1"]


def test_pass_shapes_sum_over_the_prefill_hosts_most_frequent_first():
    tally = [{"rows": 1, "new": 256, "prefix": 1024, "passes": 3}, {"rows": 2, "new": 256, "prefix": 1024, "passes": 1}]
    report = {"hosts": [{"role": "prefill", "pass_shapes": tally}, {"role": "decode"},
                        {"role": "prefill", "pass_shapes": tally[1:]}]}
    assert pass_shapes(report) == [(1, 256, 1024, 3), (2, 256, 1024, 2)]


def test_the_speed_ratio_sets_the_bare_probe_against_the_profiles_table():
    hw = dataclasses.replace(get_hardware("paper-h800"), pass_table=((1, 256, 1024, 0.1), (2, 256, 1024, 0.15)))
    # table: 3 x 0.1 + 2 x 0.15 = 0.6 s; probes around the control 1.1 and 1.3 s: the machine ran 2x slower
    shapes = [[1, 256, 1024, 3], [2, 256, 1024, 2]]
    assert _speed_ratio(hw, shapes, [1.1, 1.3]) == pytest.approx(2.0)
    assert _speed_ratio(hw, None, None) == 1.0  # an older result without a probe: the profile as measured
    # each run's own probe, else the control's
    real = {"speed_probe": {"shapes": shapes, "bare_s": [1.0, 1.2]}, "runs": {"1p1d-basic": {"probe_bare_s": [2, 3]}}}
    assert _probe_of(real, "1p1d-basic") == [2, 3] and _probe_of(real, "1p2d-basic") == [1.0, 1.2]
    assert _probe_of({}, "1p1d-basic") is None


def test_a_run_again_under_the_same_name_starts_from_an_empty_directory(tmp_path, monkeypatch):
    """The control re-run at fewer agents must not find the first control's stored blocks (its first
    turns would hit where the simulator's miss)."""
    from dualjax.bench import e2e
    from dualjax.core.config import ClusterSpec, RunConfig
    seen = []

    def fake_run(cfg, progress):
        seen.append(sorted(p.name for p in (tmp_path / "control").rglob("*")) if (tmp_path / "control").exists()
                    else None)
        os.makedirs(cfg.store_dir, exist_ok=True)
        open(os.path.join(cfg.store_dir, "block"), "w").close()  # what a run leaves behind
        return {"jct_s": 1.0, "paths": {}, "snic_max_over_avg": None, "runtime": {"startup": {"max_s": 0.0}},
                "hosts": [{"role": "prefill", "buffer_peak_bytes": 0, "pass_shapes": []}]}

    monkeypatch.setattr(e2e, "run_embedded", fake_run)
    base = RunConfig(ClusterSpec(1, 1), model="small", workload="agentic-e2e", agents=2)
    for _ in range(2):
        e2e._run(str(tmp_path), {}, base, "control", policy="basic")
    assert seen == [None, None]


def test_the_benchmark_groups_repeats_into_medians(tmp_path, monkeypatch):
    """The whole benchmark over fake runs (JCT by configuration and round, no JAX): the tables hold each
    configuration's median, `jct_repeats_s` every repeat, `naive_over_dualpath` the same-round ratios."""
    from dualjax.bench import e2e
    jct = {("1p1d", "basic", "full", True): 40.0, ("1p1d", "dualpath", "full", True): 20.0,
           ("1p1d", "round-robin", "naive", True): 24.0, ("1p2d", "basic", "full", True): 32.0,
           ("1p2d", "dualpath", "full", True): 15.0, ("1p2d", "round-robin", "naive", True): 15.0,
           ("1p1d", "basic", "full", False): 5.0}
    rounds = iter(range(10_000))

    def fake_run(cfg, progress):
        key = (cfg.cluster.name, cfg.policy, cfg.scheduler, cfg.snic_mbps is not None)
        t = jct[key] * (1 + 0.1 * (next(rounds) % 3))  # noise of up to 20 %
        return {"jct_s": t, "paths": {}, "snic_max_over_avg": 1.0, "snic_max_over_avg_all_windows": 1.0,
                "runtime": {"startup": {"max_s": 0.0}, "prefill_tokens_per_s": 1.0},
                "hosts": [{"role": "prefill", "buffer_peak_bytes": 0, "pass_shapes": [], "pack_fit": [0, 0, 0],
                           "storage_bytes": 4e6}]}
    monkeypatch.setattr(e2e, "run_embedded", fake_run)
    monkeypatch.setattr(e2e, "speed_probe", lambda model, shapes: 1.0)
    monkeypatch.setattr(e2e, "plot_compare", lambda *a: None)
    monkeypatch.setattr(e2e, "comparison", lambda runs: [])
    monkeypatch.setattr(e2e, "load_run", lambda d, cols: None)
    got = e2e.main(["--quick", "--repeats", "3", "--out", str(tmp_path), "--max-wall-s", "inf"])
    assert got["skipped"] == {} and len(got["ran"]) == 20
    spread = got["jct_repeats_s"]
    assert {k: v["n"] for k, v in spread.items()} == {e2e.CONTROL: 3} | dict.fromkeys(
        ["1p1d-basic", "1p1d-dualpath", "1p1d-round-robin-naive", "1p2d-basic", "1p2d-dualpath",
         "1p2d-round-robin-naive"], 3)
    for config, s in spread.items():
        assert s["min"] <= s["median"] <= s["max"] and s["median"] == sorted(s["values"])[1]
    assert got["jct_s"]["1p1d"] == {p: spread[f"1p1d-{p}"]["median"]
                                    for p in ("basic", "dualpath", "round-robin-naive")}
    ratios = got["naive_over_dualpath"]["1p1d"]["per_round"]["values"]
    assert len(ratios) == 3 and all(1.2 * 0.8 < r < 1.2 * 1.2 for r in ratios)  # 24 / 20, each within the noise
    assert got["naive_over_dualpath"]["1p2d"]["of_medians"] == pytest.approx(1.0)
    assert {w["config"] for n, w in got["runs"].items() if n.endswith("-r2")} == set(spread) - {"warmup"}
