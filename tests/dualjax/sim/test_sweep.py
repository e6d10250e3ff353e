"""`dualjax sim sweep`'s library (dualjax/sim/sweep.py): a grid's points written as `dualjax sim --out` writes a
run, a summary whose rows are the points' reports, resumption that runs only what is missing, the same rows on
one process or several, the regimes, and the split of points between MPI ranks."""

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from dualjax.core.config import ClusterSpec, SimConfig
from dualjax.outputs import load_run
from dualjax.sim import sweep as sw
from dualjax.sim.sweep import REGIMES, SweepError, grid, read_summary, run_tasks, share

TINY = dict(workloads=["paper-32k"], clusters=["2p2d"], agents=2, turns=2)


def tiny(**kw):
    return grid(["dualpath", "pe-only"], **{**TINY, **kw})


def test_each_point_is_a_run_and_its_summary_row_is_its_report(tmp_path):
    """A point's directory loads as a simulated run, and its summary row carries that run's own figures
    (read here from report.json and the request table, not from the sweep)."""
    points = tiny(snic_mbps=[None, 300.0])
    result = sw.sweep(points, str(tmp_path), jobs=1, progress=False, plot=str(tmp_path / "s.png"))
    rows = {r["point"]: r for r in read_summary(str(tmp_path / "summary.parquet"))}
    assert len(rows) == len(points) == 4 and (tmp_path / "s.png").exists() and result["ran"] == 4
    for p in points:
        report, requests = load_run(str(tmp_path / p.id), ["ttft", "recomputed_tokens"])
        r = rows[p.id]
        assert report["kind"] == "simulated" and report["policy"] == r["policy"] == p.config.policy
        assert r["jct_s"] == report["jct_s"] and r["requests"] == len(requests["ttft"])
        assert (r["ttft_p50_s"], r["ttft_p99_s"]) == (report["ttft_s"]["p50"], report["ttft_s"]["p99"])
        assert r["recomputed_tokens"] == int(requests["recomputed_tokens"].sum())
        assert (r["snic_max_over_avg"], r["hit_rate"]) == (report["snic_max_over_avg"], report["hit_rate"])
        assert r["snic_mbps"] == report["config"]["snic_mbps"] and r["cluster"] == "2p2d"
        with open(tmp_path / p.id / "point.json") as f:
            assert json.load(f)["wall_s"] == r["wall_s"] > 0


def test_jct_relative_to_the_best_is_the_mean_over_seeds():
    """Ranked by hand: in one regime policy a has JCTs 10 and 14 (mean 12), b 9 and 11 (mean 10): b is the
    best, a is 1.2x; another regime ranks on its own."""
    def row(policy, seed, jct, regime="r1"):
        return {"regime": regime, "policy": policy, "seed": seed, "jct_s": jct, "workload": "w", "cluster": "1p1d",
                "hardware": "h", "snic_mbps": None, "model": "m", "agents": None, "turns": None, "aps": None}
    rows = [row("a", 0, 10.0), row("a", 1, 14.0), row("b", 0, 9.0), row("b", 1, 11.0), row("a", 0, 5.0, "r2"),
            row("b", 0, 6.0, "r2")]
    ranked = sw.rank(rows)
    assert [r["jct_vs_best"] for r in ranked] == pytest.approx([1.2, 1.2, 1.0, 1.0, 1.0, 1.2])
    assert [r["best"] for r in ranked] == [False, False, True, True, True, False]
    table = {g["group"]: g for g in sw.regimes_table(rows)}
    assert table["r1 / w"]["best"] == "b" and table["r1 / w"]["jct_s"] == {"a": 12.0, "b": 10.0}
    assert table["r2 / w"]["best"] == "a"


def test_a_second_sweep_runs_only_the_missing_points(tmp_path, monkeypatch):
    """Resume: every point whose directory is whole is read back, not simulated again (calls counted), and
    the summary is the same; a point removed is the only one run again."""
    calls = []
    real = sw.simulate
    monkeypatch.setattr(sw, "simulate", lambda cfg, **kw: calls.append(cfg) or real(cfg, **kw))
    points = tiny(seeds=[0, 1])
    first = sw.sweep(points, str(tmp_path), jobs=1, progress=False)
    assert len(calls) == 4
    again = sw.sweep(points, str(tmp_path), jobs=1, progress=False)
    assert len(calls) == 4 and (again["ran"], again["resumed"]) == (0, 4) and again["rows"] == first["rows"]
    gone = points[2]
    for f in os.listdir(tmp_path / gone.id):
        os.remove(tmp_path / gone.id / f)
    os.rmdir(tmp_path / gone.id)
    third = sw.sweep(points, str(tmp_path), jobs=1, progress=False)
    assert len(calls) == 5 and calls[-1] == gone.config and (third["ran"], third["resumed"]) == (1, 3)
    assert [dict(r, wall_s=0) for r in third["rows"]] == [dict(r, wall_s=0) for r in first["rows"]]


def test_processes_give_the_serial_rows(tmp_path):
    """Two processes give every point the row one process gives it (a simulation is deterministic)."""
    points = tiny()
    serial = sw.sweep(points, str(tmp_path / "one"), jobs=1, progress=False)["rows"]
    parallel = sw.sweep(points, str(tmp_path / "two"), jobs=2, progress=False)["rows"]
    assert [dict(r, wall_s=0) for r in parallel] == [dict(r, wall_s=0) for r in serial]
    assert not os.path.exists(tmp_path / "two" / sw.PARTIAL)


def test_a_failing_point_is_reported_and_the_others_finish(tmp_path, monkeypatch):
    """A point that raises leaves its traceback in OUT/failed/ and no directory; the others are written."""
    real = sw.simulate

    def flaky(cfg, **kw):
        if cfg.policy == "pe-only":
            raise RuntimeError("injected")
        return real(cfg, **kw)
    monkeypatch.setattr(sw, "simulate", flaky)
    points = tiny()
    outcome = run_tasks(points, str(tmp_path), jobs=1, progress=False)
    bad = points[1]
    assert list(outcome.failed) == [bad.id] and "injected" in open(outcome.failed[bad.id]).read()
    assert not bad.done(str(tmp_path)) and points[0].done(str(tmp_path))
    monkeypatch.setattr(sw, "simulate", real)  # fixed: the next sweep runs it, and its failure file goes
    again = run_tasks(points, str(tmp_path), jobs=1, progress=False)
    assert again.ran == [bad.id] and not os.path.exists(outcome.failed[bad.id])


def test_grid_axes_and_bad_grids():
    """Every combination once, each setting where it belongs; a bad grid is refused before anything runs."""
    points = grid(["dualpath", "basic"], workloads=["paper-32k", "paper-64k"], clusters=["1p1d", "2p2d"],
                  snic_mbps=[None, 500.0], seeds=[0, 3], agents=4)
    assert len(points) == 2 * 2 * 2 * 2 * 2 == len({p.id for p in points})
    assert {(p.config.cluster.name, p.config.snic_mbps, p.config.workload, p.config.policy, p.config.workload_seed)
            for p in points} == {(c, r, w, pol, s) for c in ("1p1d", "2p2d") for r in (None, 500.0)
                                 for w in ("paper-32k", "paper-64k") for pol in ("dualpath", "basic") for s in (0, 3)}
    assert all(p.config.agents == 4 for p in points)
    for kw, message in ((dict(seeds=[0, 0]), "seeds: 0 given twice"), (dict(snic_mbps=[0.0]), "snic_mbps: 0.0"),
                        (dict(regimes=["nosuch"]), "unknown regime 'nosuch'"),
                        (dict(regimes=["balanced"], clusters=["1p1d"]), "clusters: a regime sets its own"),
                        (dict(workloads=[]), "workloads: no values")):
        with pytest.raises(SweepError, match=message):
            grid(["dualpath"], **kw)


def test_regimes_set_hardware_model_cluster_and_rate():
    """A regime's points carry its settings; `all` is every regime; loading is slower than recomputing only
    in storage-starved (its rate is below the balanced one, and compute-starved runs at the profile's)."""
    points = grid(["dualpath"], regimes=["all"], workloads=["paper-64k"], agents=8)
    assert [p.regime for p in points] == list(REGIMES)
    for p in points:
        r = REGIMES[p.regime]
        assert (p.config.hardware, p.config.model, p.config.cluster.name, p.config.snic_mbps) == \
            (r.hardware, r.model, r.cluster, r.snic_mbps)
    assert REGIMES["compute-starved"].snic_mbps is None
    assert REGIMES["storage-starved"].snic_mbps < REGIMES["balanced"].snic_mbps


def test_ranks_split_the_points_once_each_costliest_first():
    """Every point goes to exactly one rank, the same split on every rank; the costs stay within the costliest
    point of even (greedy longest-first)."""
    points = grid(["dualpath"], workloads=["paper-32k"], seeds=list(range(7)), agents=2) + \
        grid(["dualpath"], workloads=["paper-32k"], seeds=list(range(3)), agents=20)
    shares = [share(points, r, 3) for r in range(3)]
    assert all([p.cost() for p in s] == sorted((p.cost() for p in s), reverse=True) for s in shares)
    ids = [p.id for s in shares for p in s]
    assert sorted(ids) == sorted(p.id for p in points)
    loads = [sum(p.cost() for p in s) for s in shares]
    assert max(loads) - min(loads) <= max(p.cost() for p in points)
    assert shares == [share(points, r, 3) for r in range(3)]


def test_a_policy_object_runs_in_the_pool(tmp_path):
    """A policy given as an object (an importable class: the notebook's case) runs in worker processes, under
    its `module:Class` name, as it does in this process."""
    from tests.dualjax.sim.sweep_policy import AlwaysDe
    points = grid([AlwaysDe(), "de-only"], **TINY)
    rows = sw.sweep(points, str(tmp_path), jobs=2, progress=False)["rows"]
    mine, builtin = rows
    assert mine["policy"] == "tests.dualjax.sim.sweep_policy:AlwaysDe"
    assert mine["jct_s"] == builtin["jct_s"] and mine["de_tokens"] == builtin["de_tokens"] > 0


@pytest.mark.slow
def test_mpiexec_refuses_a_bad_grid_in_one_line(tmp_path):
    """Under mpiexec a bad grid is one line from rank 0 and exit code 2, every rank ending cleanly."""
    from dualjax.runtime.cluster.runner import mpiexec
    cmd = [mpiexec(), "-n", "2", sys.executable, "-m", "mpi4py", "-m", "dualjax.cli.main", "sim", "sweep",
           "--policies", "nosuch", "--out", str(tmp_path / "o")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "unknown policy 'nosuch'" in proc.stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_mpiexec_ranks_split_a_sweep(tmp_path):
    """Under mpiexec (2 ranks) each point runs once, on one rank, and rank 0 writes the whole summary: the
    rows one process gives."""
    from dualjax.runtime.cluster.runner import mpiexec
    argv = ["sim", "sweep", "--policies", "dualpath,pe-only", "--workloads", "paper-32k", "--clusters", "2p2d",
            "--agents", "2", "--turns", "2", "--seeds", "0,1", "--jobs", "1", "--quiet"]
    cmd = [mpiexec(), "-n", "2", sys.executable, "-m", "mpi4py", "-m", "dualjax.cli.main", *argv,
           "--out", str(tmp_path / "mpi")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "2 ranks" in proc.stderr and proc.stdout.count("sweep: 4 points (4 run") == 1
    serial = sw.sweep(tiny(seeds=[0, 1], clusters=["2p2d"]), str(tmp_path / "one"), jobs=1, progress=False)["rows"]
    rows = read_summary(str(tmp_path / "mpi" / "summary.parquet"))
    assert [dict(r, wall_s=0) for r in rows] == [dict(r, wall_s=0) for r in serial]


def test_call_results_are_kept_and_read_back(tmp_path):
    """A Call (the paper's online trial or capacity search) keeps its JSON result; a second run reads it."""
    task = sw.Call("lifetime", _lifetime, (SimConfig(ClusterSpec(2, 2), workload="paper-32k", agents=2, turns=2),))
    first = run_tasks([task], str(tmp_path), jobs=1, progress=False)
    again = run_tasks([task], str(tmp_path), jobs=1, progress=False)
    assert first.results[task.id] == again.results[task.id] > 0 and again.resumed == [task.id]


def _lifetime(cfg):
    from dualjax.sim.search import agent_lifetime
    return agent_lifetime(dataclasses.replace(cfg), agents=2)


def test_a_point_made_by_other_code_runs_again(tmp_path, monkeypatch):
    """Resume reads a point back only if the code that made it is today's (`code_digest`): after an edit to
    the simulator or to the user's policy, the old result is run again and replaced, not read back."""
    calls = []
    real = sw.simulate
    monkeypatch.setattr(sw, "simulate", lambda cfg, **kw: calls.append(cfg) or real(cfg, **kw))
    points = tiny()
    sw.sweep(points, str(tmp_path), jobs=1, progress=False)
    assert len(calls) == 2
    monkeypatch.setattr(sw, "code_digest", lambda policy=None: "edited")
    again = sw.sweep(points, str(tmp_path), jobs=1, progress=False)
    assert len(calls) == 4 and (again["ran"], again["resumed"]) == (2, 0)
    for p in points:
        assert json.loads((tmp_path / p.id / "point.json").read_text())["code"] == "edited"
