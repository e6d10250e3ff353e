"""`bench policies --quick`: the table's keys, the best policy and the ratios recomputed from the runs, the caps
from the measured prefill rate, the wall bound; bad flags in one line."""

import statistics

import pytest

from dualjax.bench import policies
from dualjax.core.config import ConfigError
from dualjax.core.policies import PolicyError


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("policies")
    return policies.main(["--quick", "--out", str(tmp / "runs"), "--json", str(tmp / "p.json")])


@pytest.mark.slow
def test_quick(quick):
    r = quick
    assert r["policies"] == policies.QUICK_POLICIES and r["launchers"] == ["embedded"] and r["repeats"] == 1
    assert set(r["table"]) == set(policies.REGIMES) == {"storage-starved", "storage-rich"}
    assert not r["skipped"] and len(r["runs"]) == 2 * 2  # 2 policies x 2 regimes x 1 repeat
    e = r["emulated"]
    crossover = e["prefill_tokens_per_s"] * e["hit_bytes_per_token"] / 1e6
    assert e["crossover_mbps"] == pytest.approx(crossover)
    assert e["snic_mbps"]["storage-starved"] == pytest.approx(policies.STARVED * crossover)
    assert e["snic_mbps"]["storage-starved"] < crossover < e["snic_mbps"]["storage-rich"]
    for regime, by_launcher in r["table"].items():
        cell = by_launcher["embedded"]
        assert set(cell) == set(policies.QUICK_POLICIES)
        for policy, row in cell.items():
            mine = [x for x in r["runs"].values() if (x["regime"], x["policy"]) == (regime, policy)]
            assert row["jct_s"]["median"] == statistics.median(x["jct_s"] for x in mine)
            assert row["jct_s"]["min"] <= row["jct_s"]["median"] <= row["jct_s"]["max"]
            assert row["storage_bytes"] == statistics.median(x["storage_bytes"] for x in mine)
            assert 0 <= row["recomputed_share"] <= 1 and row["ttft_p50_s"] <= row["ttft_p99_s"]
        best = r["best"][regime]["embedded"]
        rel = r["relative_jct"][regime]["embedded"]
        assert best == min(cell, key=lambda p: cell[p]["jct_s"]["median"]) and rel[best] == 1.0
        for policy, ratio in rel.items():
            assert ratio == pytest.approx(cell[policy]["jct_s"]["median"] / cell[best]["jct_s"]["median"])
            assert ratio >= 1.0
    # DualPath loads every hit (it never plans a recompute), so its runs read from storage
    for by_launcher in r["table"].values():
        assert by_launcher["embedded"]["dualpath"]["recomputed_share"] == 0
        assert by_launcher["embedded"]["dualpath"]["storage_bytes"] > 0
    assert r["wall_s"] <= r["max_wall_s"] + max(x["wall_s"] for x in r["runs"].values())


def test_bad_flags():
    with pytest.raises(ConfigError, match="--launchers"):
        policies._launchers("embedded,slurm")
    with pytest.raises(ConfigError, match="twice"):
        policies._policies("dualpath,dualpath", policies.POLICIES)
    with pytest.raises(PolicyError):
        policies._policies("no-such-policy", policies.POLICIES)
    # a policy's settings after a comma stay with it
    assert policies._policies("pe-only,llmd-pull:t0_s=0.1,setup_s=0.2,dualpath", []) == [
        "pe-only", "llmd-pull:t0_s=0.1,setup_s=0.2", "dualpath"]


def test_wall_bound_skips():
    """No run starts that its launcher's runs so far predict to end past the bound."""
    walls = {"embedded": [5.0, 9.0], "mpiexec": []}
    assert policies._predict(walls, "embedded") == 9.0
    assert policies._predict(walls, "mpiexec") == policies.MPI_STARTUP * 9.0
    assert policies._predict({"embedded": [], "mpiexec": []}, "embedded") == 0.0
