"""The e2e benchmark's wall-time sizing and the speed probe `sim validate` scales the profile by, by
hand (no runs: the benchmark itself runs in test_runtime)."""

import dataclasses
import os

import pytest

from dualjax.bench.e2e import Run, _cost, _fit_wall, _grow_to, _name, _planned, pass_shapes
from dualjax.cli.validate import _probe_of, _speed_ratio
from dualjax.sim.profiles import get_hardware


def test_the_size_grows_only_as_far_as_the_bound_allows():
    # at 2 agents: warm-up 30 s wall, control 5 s JCT, essential runs 10 control JCTs, 20 s of overheads:
    # n agents cost n / 2 * (30 + 11 * 5) + 20 = 42.5 n + 20 s
    assert _grow_to(2, 10, 30.0, 5.0, 10.0, 20.0, budget_s=1000.0) == 10
    assert _grow_to(2, 10, 30.0, 5.0, 10.0, 20.0, budget_s=42.5 * 6 + 20) == 6
    assert _grow_to(2, 10, 30.0, 5.0, 10.0, 20.0, budget_s=42.5 * 6 + 19) == 5
    assert _grow_to(2, 10, 30.0, 5.0, 10.0, 20.0, budget_s=10.0) == 2  # never below where it started


def test_essential_runs_shrink_the_agents_and_the_rest_are_left_out():
    planned, essential = _planned(quick=False, hbm_only=False)
    assert essential == 8 and len(planned) == 15
    # storage factor 6: 1p1d basic 6 + 1 (it loads, then computes), dualpath 3, 1p2d basic 7, dualpath 2, memory
    # budget basic 7, pe-only 6, dualpath 3, 1p1d basic one batch ahead 6 (its compute overlaps): 41 control JCTs
    assert sum(_cost(r, 6.0) for r in planned[:essential]) == pytest.approx(41.0)
    kept, agents, left = _fit_wall(planned, essential, 6.0, 10.0, 5.0, budget_s=41 * 10 + 8 * 5 + 100, agents=4)
    assert agents == 4 and kept[:essential] == planned[:essential] and len(kept) + len(left) == len(planned)
    # 450 s spent, then each while it fits 550 s: 2p1d basic (4 x 10 + 5) and dualpath (25: 520 s), not the
    # pe-only runs (65, 65, 35), 2p2d dualpath (20: 540 s), not 2p2d round-robin (20)
    assert kept[essential:] == [Run("2p1d", "basic"), Run("2p1d", "dualpath"), Run("2p2d", "dualpath")]
    kept, agents, left = _fit_wall(planned, essential, 6.0, 10.0, 5.0, budget_s=(41 * 10 + 10) / 2 + 9 * 5, agents=4)
    assert agents == 2 and kept == planned[:essential] and left == planned[essential:]


def test_the_hbm_set_is_the_memory_budget_runs_and_basic_both_ways():
    planned, essential = _planned(quick=False, hbm_only=True)
    assert planned == [Run("1p1d", "basic", True), Run("1p1d", "pe-only", True), Run("1p1d", "dualpath", True),
                       Run("1p1d", "basic"), Run("1p1d", "basic", ahead=1)] and essential == 5
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
        return {"jct_s": 1.0, "paths": {}, "snic_max_over_avg": None,
                "hosts": [{"role": "prefill", "buffer_peak_bytes": 0, "pass_shapes": []}]}

    monkeypatch.setattr(e2e, "run_embedded", fake_run)
    base = RunConfig(ClusterSpec(1, 1), model="small", workload="agentic-e2e", agents=2)
    for _ in range(2):
        e2e._run(str(tmp_path), {}, base, "control", policy="basic")
    assert seen == [None, None]
