"""`sim validate` reads an e2e result's repeats: runs grouped by the configuration they recorded,
each configuration's spread, the step without scheduling set against DualPath, and the rows left out
of the error bound (by hand: no runs, no simulations)."""

import pytest

from dualjax.sim.validate import CONTROL_NAME, _configurations, _speedups, _spread, _table


def _run(config, repeat, jct, cluster="1p1d", policy="dualpath", scheduler="full", unwarmed=()):
    return {"jct_s": jct, "config": config, "repeat": repeat, "unwarmed_passes": list(unwarmed),
            "settings": {"cluster": cluster, "policy": policy, "scheduler": scheduler, "snic_mbps": 2.0}}


REAL = {"runs": {
    "warmup": _run("warmup", 0, 9.0, policy="basic"),
    "control-uncapped-1p1d-basic": _run("control-uncapped-1p1d-basic", 0, 7.0, policy="basic"),
    "control-uncapped-1p1d-basic-r1": _run("control-uncapped-1p1d-basic", 1, 8.0, policy="basic"),
    "1p1d-dualpath": _run("1p1d-dualpath", 0, 20.0),
    "1p1d-dualpath-naive": _run("1p1d-dualpath-naive", 0, 24.0, scheduler="naive"),
    "1p1d-dualpath-r1": _run("1p1d-dualpath", 1, 22.0),
    "1p1d-dualpath-naive-r1": _run("1p1d-dualpath-naive", 1, 22.0, scheduler="naive", unwarmed=[[5, 256, 512, 1]]),
    "1p1d-dualpath-r2": _run("1p1d-dualpath", 2, 30.0),
}}


def test_repeats_group_by_their_configuration():
    got = {name: (settings, jcts, runs, unwarmed) for name, settings, jcts, runs, unwarmed in _configurations(REAL)}
    assert set(got) == {CONTROL_NAME, "1p1d-dualpath", "1p1d-dualpath-naive"}  # the warm-up is no configuration
    assert got["1p1d-dualpath"][1] == {0: 20.0, 1: 22.0, 2: 30.0}
    assert got["1p1d-dualpath"][2] == ["1p1d-dualpath", "1p1d-dualpath-r1", "1p1d-dualpath-r2"]  # their probes
    assert got[CONTROL_NAME][1] == {0: 7.0, 1: 8.0}
    assert got["1p1d-dualpath-naive"][0]["scheduler"] == "naive" and got["1p1d-dualpath-naive"][3] == [[5, 256, 512, 1]]


def test_a_result_from_before_repeats_is_one_repeat_a_run():
    old = {run: {k: v for k, v in w.items() if k not in ("config", "repeat")} for run, w in REAL["runs"].items()
           if not run.endswith(("-r1", "-r2"))}
    got = {name: jcts for name, _, jcts, _, _ in _configurations({"runs": old})}
    assert got == {CONTROL_NAME: {0: 7.0}, "1p1d-dualpath": {0: 20.0}, "1p1d-dualpath-naive": {0: 24.0}}


def test_naive_is_set_against_dualpath_and_the_table_shows_the_range():
    jct = {"1p1d-basic": 40.0, "1p1d-dualpath": 22.0, "1p1d-round-robin-naive": 23.0, "1p2d-round-robin-naive": 9.0}
    assert sorted(_speedups(jct)) == [("1p1d", "1p1d-basic", "1p1d-dualpath"),
                                      ("1p1d-naive-over-dualpath", "1p1d-round-robin-naive", "1p1d-dualpath")]
    older = {"1p1d-dualpath": 22.0, "1p1d-dualpath-naive": 23.0}  # the step kept DualPath's read rule then
    assert _speedups(older) == [("1p1d-naive-over-dualpath", "1p1d-dualpath-naive", "1p1d-dualpath")]
    spread = {"a": _spread([20.0, 22.0, 30.0]), "b": _spread([7.0])}
    assert spread["a"]["median"] == 22.0 and spread["a"]["spread"] == pytest.approx(10 / 22)
    rows = _table({"a": 22.0, "b": 7.0}, {"a": 25.0, "b": 10.0}, {"a": 25 / 22 - 1, "b": 3 / 7}, spread,
                  {"a": 1.0, "b": 1.1}, {"b": "why"})
    assert [(r["run"], r["within_spread"], r["left_out"]) for r in rows] == [("a", True, None), ("b", False, "why")]
    assert rows[0]["real_min_median_max_s"] == [20.0, 22.0, 30.0]
