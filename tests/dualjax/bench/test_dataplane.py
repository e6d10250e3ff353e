"""`bench dataplane`: the keys other tools read, a wall-time bound on its trials, and each path's
bound, the least time its own stages allow."""

import pytest

from dualjax.bench import dataplane


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    """One quick run with a spent wall-time bound (--max-wall-s 0): each run stops after `MIN_TRIALS` trials."""
    tmp = tmp_path_factory.mktemp("dataplane")
    result = dataplane.main(["--quick", "--max-wall-s", "0", "--json", str(tmp / "dp.json"),
                             "--plot", str(tmp / "dp.png")])
    return result, tmp


@pytest.mark.slow
def test_quick_keys(quick):
    """The keys other tools read; a spent bound stops each run's trials after `MIN_TRIALS`
    (embedded, cold, and under mpiexec, where both ranks follow rank 0's clock)."""
    result, tmp = quick
    assert [result[run]["trials"] for run in ("embedded", "embedded_cold", "mpi")] == [dataplane.MIN_TRIALS] * 3
    assert (tmp / "dp.png").stat().st_size > 0
    assert {"pe_vs_raw", "de_vs_raw", "raw_read_gbps", "pe_vs_raw_parallel", "de_vs_raw_parallel",
            "stages"} <= set(result)
    assert {"store_read", "device"} <= set(result["stages"]["pe"]) and "relay" in result["stages"]["de"]
    assert result["stages"]["de"]["bound_s"] >= result["stages"]["pe"]["bound_s"] > 0  # the DE path adds the relay
    for run in ("embedded", "mpi"):  # the first layer reaches the computation before the whole path is through
        for path in ("pe", "de"):
            assert 0 < result[run]["stages"][path]["first_layer_s"] < result[run]["stage_s"][path]
    assert 0 < result["pe_vs_raw"] and 0 < result["de_vs_raw"]
    assert result["embedded"]["store_fresh_vs_raw"] > 0 and "store_fresh_vs_raw" not in result["embedded_cold"]
    cold = result["embedded_cold"]  # the same run from the disk: every figure, its own raw reads
    assert cold["raw_read_gbps"] > 0 and cold["pe_vs_raw"] > 0 and cold["de_vs_raw"] > 0


@pytest.mark.slow
@pytest.mark.timing
def test_quick_within_bound(quick):
    """No path beats the bound its own stages set (a little noise allowed)."""
    assert 0 < quick[0]["de_vs_bound"] <= 1.25


def test_bound():
    """A path's bound is its slowest stage, or its stages' CPU seconds spread over the cores."""
    run = {"store_read": (0.05, 0.08), "relay": (0.06, 0.05), "h2d": (0.001, 0.001), "de": (0.1, 0.2)}
    assert dataplane._bound(run, "pe", cores=2) == pytest.approx(0.05)  # the store read alone: its CPU fits two cores
    assert dataplane._bound(run, "pe", cores=1) == pytest.approx(0.081)  # one core: the stages' CPU seconds in a row
    assert dataplane._bound(run, "de", cores=2) == pytest.approx(0.0655)  # the relay is slower, but the CPU binds
    assert dataplane._bound(run, "de", cores=8) == pytest.approx(0.06)  # enough cores: the slowest stage
