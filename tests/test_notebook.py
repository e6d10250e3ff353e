"""notebooks/path_policies.ipynb runs top to bottom at its small setting (as CI does)."""

import os

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_path_policies_notebook_executes(tmp_path, monkeypatch):
    path = os.path.join(ROOT, "notebooks", "path_policies.ipynb")
    nb = nbformat.read(path, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), "commit the notebook without outputs"
    monkeypatch.setenv("DUALJAX_NOTEBOOK_SMALL", "1")
    monkeypatch.setenv("DUALJAX_NOTEBOOK_OUT", str(tmp_path))
    NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": ROOT}}).execute()
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "hysteresis" in text and "dualpath" in text
    assert any("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))  # the plot
    assert os.path.exists(tmp_path / "sim-hysteresis" / "report.json")
    assert os.path.exists(tmp_path / "local-hysteresis" / "report.json")
