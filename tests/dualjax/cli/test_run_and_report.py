"""`dualjax run`, `report` and `workload` as a user calls them: outputs where asked, a failed host's
traceback printed after an mpiexec job, several runs compared."""

import json

from dualjax.cli import main as cli
from dualjax.runtime.cluster import runner


def test_output_dirs_made(tmp_path):
    """An output file's missing directories are made."""
    out = tmp_path / "a" / "b" / "w.json"
    assert cli.main(["workload", "stats", "agentic-tiny", "--json", str(out)]) == 0
    assert json.loads(out.read_text())


def test_failed_host_printed(tmp_path, capsys, monkeypatch):
    """After an mpiexec job a host ended, `dualjax run` prints the traceback that host left in the
    run directory: mpiexec may end the job before it forwards the host's own output."""
    out = tmp_path / "run"

    def failed_job(cfg, quiet=False):  # a test double for mpiexec: one host failed and left its traceback
        (out / "failed-rank1.txt").write_text("Traceback ...\nRuntimeError: injected failure on rank 1")
        return 1
    monkeypatch.setattr(runner, "launch_mpi", failed_job)
    assert cli.main(["run", "--quiet", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "a host failed" in err and f"{out}/failed-rank1.txt" in err and "injected failure on rank 1" in err


def test_report_compares_runs(tmp_path, capsys):
    """`dualjax report` puts several runs in one table and one figure; each run drew its own plots."""
    for policy in ("pe-only", "dualpath"):
        assert cli.main(["run", "--embedded", "--quiet", "--cluster", "1p2d", "--agents", "2", "--turns", "2",
                         "--policy", policy, "--out", str(tmp_path / policy)]) == 0
    png = tmp_path / "cmp.png"
    rc = cli.main(["report", str(tmp_path / "pe-only"), str(tmp_path / "dualpath"), "--plot", str(png)])
    out = capsys.readouterr().out
    assert rc == 0 and png.stat().st_size > 1000 and "dualpath" in out and "pe-only" in out
    for name in ("storage.png", "ttft_cdf.png"):
        assert (tmp_path / "dualpath" / name).stat().st_size > 1000
    report = json.load(open(tmp_path / "dualpath" / "report.json"))
    assert 0.0 <= report["slo"]["attained"] <= 1.0 and report["policy"] == "dualpath"
