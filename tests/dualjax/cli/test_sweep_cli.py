"""`dualjax sim sweep` and `dualjax sim paper` on the command line: bad grid input in one line and exit code 2
before any point runs; a sweep's table, summary, figure and JSON where asked; a second call reads back."""

import json

import pytest

from dualjax.cli import main as cli
from dualjax.sim.sweep import read_summary

TINY = ["--workloads", "paper-32k", "--clusters", "2p2d", "--agents", "2", "--turns", "2", "--quiet"]


@pytest.mark.parametrize("argv,message", [
    (["--policies", "dualpath,dualpath"], "--policies: dualpath given twice"),
    (["--policies", "dualpath,"], "--policies: an empty name in 'dualpath,'"),
    (["--policies", "fastest"], "unknown policy 'fastest'"),
    (["--policies", "nosuchmodule:Policy"], "nosuchmodule"),
    (["--policies", "dualpath", "--seeds", "0,x"], "--seeds: expected integers >= 0, got '0,x'"),
    (["--policies", "dualpath", "--seeds", "1,1"], "--seeds: 1 given twice"),
    (["--policies", "dualpath", "--snic-mbps", "0"], "--snic-mbps: 0 is not a rate > 0"),
    (["--policies", "dualpath", "--snic-mbps", "fast"], "--snic-mbps: expected MB/s numbers or `profile`"),
    (["--policies", "dualpath", "--clusters", "2x3"], "unknown cluster '2x3'"),
    (["--policies", "dualpath", "--workloads", "nosuch"], "unknown workload 'nosuch'"),
    (["--policies", "dualpath", "--hardware", "nosuch"], "no hardware profile 'nosuch'"),
    (["--policies", "dualpath", "--model", "gpt-9"], "unknown model preset 'gpt-9'"),
    (["--policies", "dualpath", "--agents", "0"], "agents must be positive"),
    (["--policies", "dualpath", "--regimes", "nosuch"], "unknown regime 'nosuch'; regimes: compute-starved"),
    (["--policies", "dualpath", "--regimes", "balanced", "--snic-mbps", "5", "--clusters", "1p1d"],
     "--clusters, --snic-mbps: a regime sets its own"),
    (["--policies", "dualpath", "--regimes", "all", "--model", "small"], "--model: a regime sets its own"),
    (["--policies", "dualpath", "--jobs", "0"], "--jobs: must be a finite number > 0, got 0"),
    (["--policies", "dualpath", "--hostfile", "{dir}/nohosts"], "--hostfile {dir}/nohosts: No such file"),
    (["--policies", "dualpath", "--plot", "{dir}"], "is a directory, not a file"),
    (["--regimes", "all"], "the following arguments are required: --policies"),
])
def test_bad_sweep(tmp_path, capsys, monkeypatch, argv, message):
    """A bad grid is one line and exit code 2, before any point runs and with no directory left behind."""
    monkeypatch.chdir(tmp_path)
    fill = {"dir": str(tmp_path)}
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    try:
        rc = cli.main(["sim", "sweep", *[a.format(**fill) for a in argv], "--out", str(tmp_path / "out")])
    except SystemExit as e:  # argparse's own exit
        rc = e.code
    out, err = capsys.readouterr()
    assert rc == 2 and message.format(**fill) in err and not out and "Traceback" not in err
    assert "usage:" in err or len(err.strip().splitlines()) == 1  # argparse's own errors come with the usage
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before


def test_sweep_writes_its_table_and_reads_back(tmp_path, capsys):
    """The table names every point's policy once per seed with the best marked; the summary, figure and JSON
    are where asked; a second call runs nothing and prints the same rows."""
    argv = ["sim", "sweep", "--policies", "dualpath,pe-only", "--seeds", "0,1", *TINY, "--out", str(tmp_path / "o"),
            "--plot", str(tmp_path / "s.png"), "--json", str(tmp_path / "s.json"), "--jobs", "1"]
    assert cli.main(argv) == 0
    first = capsys.readouterr().out
    rows = read_summary(str(tmp_path / "o" / "summary.parquet"))
    saved = json.loads((tmp_path / "s.json").read_text())
    assert len(rows) == 4 and (tmp_path / "s.png").exists() and saved["ran"] == 4
    assert [r["jct_s"] for r in saved["rows"]] == [r["jct_s"] for r in rows]
    assert "4 points (4 run, 0 read back, 0 failed)" in first and first.count("*") >= 2
    assert cli.main(argv) == 0
    second = capsys.readouterr().out
    assert "4 points (0 run, 4 read back, 0 failed)" in second
    assert second.split("\nsweep:")[0] == first.split("\nsweep:")[0]  # the same table


def test_policies_keep_their_arguments():
    """`--policies` splits at commas, but a policy's own `arg=value` pieces stay with it."""
    from dualjax.cli.sweep import _policies
    assert _policies("dualpath,llmd-pull:beta=2,setup_s=0.5,m.x:Cls,m.y:Cls:k=1") == \
        ["dualpath", "llmd-pull:beta=2,setup_s=0.5", "m.x:Cls", "m.y:Cls:k=1"]


@pytest.mark.slow
def test_sweep_over_a_hostfile_runs_under_mpiexec(tmp_path, capsys):
    """`--hostfile` (this machine, 2 ranks) starts the sweep under mpiexec, whose ranks split the points."""
    (tmp_path / "hosts").write_text("localhost:2\n")
    argv = ["sim", "sweep", "--policies", "dualpath,pe-only", *TINY, "--out", str(tmp_path / "o"),
            "--hostfile", str(tmp_path / "hosts"), "--jobs", "1"]
    assert cli.main(argv) == 0
    assert len(read_summary(str(tmp_path / "o" / "summary.parquet"))) == 2
