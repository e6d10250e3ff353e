"""notebooks/path_policies.ipynb runs top to bottom in its quick mode (as CI does): the policy is written,
unit-tested, simulated on a profile calibrated here with the real runs' setting, run for real over two
seeds, ranked, simulated at paper scale and plotted, and swept against the built-ins over two regimes;
every run's outputs load with `load_run`."""

import glob
import os

import nbformat
import pytest
from nbclient import NotebookClient

from dualjax.outputs import load_run
from dualjax.sim.sweep import read_summary

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_path_policies_notebook_executes(tmp_path, monkeypatch):
    path = os.path.join(ROOT, "notebooks", "path_policies.ipynb")
    nb = nbformat.read(path, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), "commit the notebook without outputs"
    monkeypatch.setenv("DUALJAX_NOTEBOOK_QUICK", "1")
    monkeypatch.setenv("DUALJAX_NOTEBOOK_OUT", str(tmp_path))
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": ROOT}}).execute()
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "unit tests passed" in text and "ranking agreement:" in text and "hysteresis" in text
    assert text.count("best in ") == 2  # the sweep's two regimes
    assert sum("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", [])) >= 4  # the plots
    kinds = {}
    for d in glob.glob(str(tmp_path / "*-seed*")) + glob.glob(str(tmp_path / "paper-*")):
        if os.path.isdir(d):
            kinds.setdefault(load_run(d, ["ttft"]).report["kind"], []).append(d)
    assert len(kinds["real"]) == 6 and len(kinds["simulated"]) == 6 + 4  # 3 policies x 2 seeds; paper: 4 policies
    assert not os.path.exists(os.path.join(ROOT, "hysteresis_policy.py"))  # outputs only under the ignored path
    rows = read_summary(str(tmp_path / "sweep" / "summary.parquet"))  # 2 regimes x 5 policies, each a run
    assert len(rows) == 10 and {r["policy"] for r in rows} >= {"hysteresis_policy:Hysteresis", "dualpath"}
    assert all(load_run(str(tmp_path / "sweep" / r["point"]), ["ttft"]).report["jct_s"] == r["jct_s"] for r in rows)
