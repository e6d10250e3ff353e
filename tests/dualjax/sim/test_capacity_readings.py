"""The online capacity under each reading of the paper's stop rule ("TTFT exceeds 4 s"): the statistic is
an assumption, so each is scored the same way, and several readings share their simulations."""

import pytest

from dualjax.core.config import ClusterSpec, SimConfig
from dualjax.sim import search


def trial(ttft: list[float], tpot: list[float], stationary: bool = True, unfinished: int = 0, aps: float = 1.0) -> dict:
    """A steady-state trial as `steady_state` reports it, from its window's TTFTs and TPOTs (s)."""
    import numpy as np

    def stats(v):
        return {"mean": float(np.mean(v)), "p50": float(np.percentile(v, 50)), "p90": float(np.percentile(v, 90)),
                "p99": float(np.percentile(v, 99))}
    ok = [a <= 4.0 and b <= 0.05 for a, b in zip(ttft, tpot)]
    return {"aps": aps, "agents": 100, "window_s": [1800.0, 1950.0], "stationary": stationary,
            "requests": len(ttft), "attained": sum(ok) / len(ok), "ttft_s": stats(ttft),
            "tpot_s": stats(tpot), "unfinished": unfinished, "slo_s": [4.0, 0.05]}


def test_each_reading_scores_the_window_by_its_statistic():
    """Nine requests at 1 s and one at 30 s: the mean (3.9 s) is within 4 s, the tail (p99) is not, and
    90 % of the requests meet the SLO, so `attainment` at 0.9 passes and at 0.95 fails (worked by hand)."""
    t = trial([1.0] * 9 + [30.0], [0.02] * 10)
    assert search.within_slo(t, "mean") and not search.within_slo(t, "p99")
    assert search.within_slo(t, "attainment", 0.9) and not search.within_slo(t, "attainment", 0.95)
    assert not search.within_slo(trial([1.0] * 10, [0.06] * 10), "mean")  # TPOT over 50 ms
    assert not search.within_slo(trial([1.0] * 10, [0.02] * 10, stationary=False), "mean")  # never settled
    assert not search.within_slo(trial([1.0] * 10, [0.02] * 10, unfinished=1), "mean")  # a TTFT unbounded
    with pytest.raises(ValueError, match="unknown SLO reading"):
        search.within_slo(t, "median")


def test_readings_share_their_runs_and_order_their_capacities(monkeypatch):
    """A load whose TTFT grows with the arrival rate: the mean reading admits more APS than p99, and a
    second reading re-runs no APS the first already simulated (the shared cache)."""
    calls = []

    def fake(cfg, aps, lifetime, policy=None, hardware=None):
        calls.append(aps)
        return trial([aps] * 9 + [10 * aps], [0.02] * 10, aps=aps)  # mean 1.9 x aps, p99 ~9.2 x aps
    monkeypatch.setattr(search, "steady_state", fake)
    monkeypatch.setattr(search, "agent_lifetime", lambda *a, **k: 100.0)
    cfg, cache = SimConfig(ClusterSpec(1, 1)), {}
    mean = search.find_capacity(cfg, start_aps=1.0, steps=8, log=lambda *_: None, reading="mean", cache=cache)
    runs = len(calls)
    tail = search.find_capacity(cfg, start_aps=1.0, steps=8, log=lambda *_: None, reading="p99", cache=cache)
    assert 4.0 / 1.9 * 0.99 <= mean["capacity_aps"] <= 4.0 / 1.9  # bisected to within 1 %
    assert tail["capacity_aps"] < mean["capacity_aps"] and tail["reading"] == "p99"
    assert len(calls) - runs == len(set(calls)) - len(set(calls[:runs]))  # only APS not run before
    with pytest.raises(ValueError, match="one setting"):  # another setting's trials are not these
        search.find_capacity(cfg, policy="basic", log=lambda *_: None, cache=cache)


@pytest.mark.parametrize("argv,message", [
    (["--slo-reading", "p99"], "--slo-reading: only with --find-capacity"),
    (["--find-capacity", "--slo-reading", "median"], "'median' is not one of mean, p90, p99, attainment"),
    (["--find-capacity", "--slo-reading", "p99", "--slo-attainment", "0.5"], "only with --slo-reading attainment"),
])
def test_bad_reading_is_one_line(capsys, argv, message):
    """A reading the search does not know, or a flag that only another reading uses: one line, exit 2."""
    from dualjax.cli import main as cli
    assert cli.main(["sim", "--cluster", "1p1d", "--workload", "paper-32k", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
