"""`bench e2e --quick` and `sim validate` against its runs: what other tools read, and DualPath's
speed-up where storage binds."""

import os

import pytest

from dualjax.bench import e2e
from dualjax.cli.validate import main as validate


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    """The benchmark's quick run, and the simulator on this machine's calibrated profile against it."""
    tmp = tmp_path_factory.mktemp("e2e")
    result = e2e.main(["--quick", "--out", str(tmp / "e2e"), "--json", str(tmp / "e2e.json")])
    v = validate(["--real", str(tmp / "e2e.json"), "--hardware", str(tmp / "local.json"),
                  "--out", str(tmp / "validate")])
    return result, v, tmp


@pytest.mark.slow
def test_quick(quick):
    result, v, tmp = quick
    assert set(result["speedup"]) == {"1p1d", "1p2d"}
    assert all(os.path.exists(p) for p in result["plots"])
    assert len(result["runtime_profile"]["pack_fit"]) == 3  # what the simulator replays
    runs = {f"{c}-{p}" for c in ("1p1d", "1p2d") for p in ("basic", "dualpath", "round-robin-naive")}
    assert set(v["jct_error"]) == runs | {"1p1d-control"} and set(result["naive_over_dualpath"]) == {"1p1d", "1p2d"}
    assert set(v["speedup_error"]) == {"1p1d", "1p2d", "1p1d-naive-over-dualpath", "1p2d-naive-over-dualpath"}
    # every pass compiled before its run's clock, and each configuration ran once (--quick)
    assert all(w["unwarmed_passes"] == [] for w in result["runs"].values()), result["runs"]
    assert {r["run"]: r["n"] for r in v["table"]} == dict.fromkeys(runs | {"1p1d-control"}, 1)
    assert v["left_out"].keys() == {"1p1d-control"}
    assert (tmp / "local.json").exists()  # calibrated on the way


@pytest.mark.slow
@pytest.mark.timing
def test_quick_speedup(quick):
    """Storage-bound: the second read path pays off, for real and in the simulator."""
    result, v, _ = quick
    assert result["speedup"]["1p1d"] > 1.2 and v["sim_speedup"]["1p1d"] > 1.2
