"""What goes wrong once a command has started, as bad input does before: an output that fails to write,
a damaged run directory, an e2e result of another shape end in one line and exit code 2, never a
traceback; and a command leaves no directory behind that it made and nobody wrote into."""

import json
import os

import pytest

from dualjax.cli import main as cli
from dualjax.sim.profiles import PAPER_FIT


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A small simulation's --out directory."""
    out = tmp_path_factory.mktemp("runs") / "sim"
    assert cli.main(["sim", "--agents", "8", "--turns", "2", "--quiet", "--out", str(out)]) == 0
    return out


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (every write to it fails)")
@pytest.mark.parametrize("argv", [["workload", "stats", "agentic-tiny"], ["plan"], ["report", "{run}"],
                                  ["sim", "--agents", "8", "--turns", "2", "--quiet"]], ids=" ".join)
def test_write_fails_after_the_work(run_dir, capsys, argv):
    """A --json that the check before the work lets through but whose write fails after it (a full
    disk: /dev/full): one line naming the file and the reason, exit code 2."""
    rc = cli.main([a.format(run=run_dir) for a in argv] + ["--json", "/dev/full"])
    err = capsys.readouterr().err
    assert rc == 2 and err.endswith("error: cannot write /dev/full: No space left on device\n") and err.count("\n") == 1


@pytest.mark.parametrize("key,value,message", [
    ("config", None, "no config"), ("jct_s", None, "no jct_s"), ("policy", None, "no policy"), ("slo", None, "no slo"),
    ("jct_s", "x", 'jct_s is "x", not a number'), ("slo", [], "slo is [], not an object"),
])
def test_damaged_report(run_dir, tmp_path, capsys, key, value, message):
    """A report.json without a key `dualjax report` reads (value None: the key deleted), or with one of
    another type: one line saying the file is damaged and what is missing or wrong."""
    report = json.loads((run_dir / "report.json").read_text())
    if value is None:
        del report[key]
    else:
        report[key] = value
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "report.json").write_text(json.dumps(report))
    rc = cli.main(["report", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert rc == 2 and err == f"dualjax report: error: {tmp_path}/run/report.json is damaged: {message}\n"


@pytest.mark.parametrize("jct,message", [({"1p1d-basic": "x"}, "its runs do not read"),
                                         ({"1p1d": {"basic": "x"}}, "the JCT of 1p1d-basic is not a positive number")])
def test_real_of_another_shape(tmp_path, capsys, jct, message):
    """`sim validate --real` with an e2e result whose runs hold other types: its one line, before anything runs."""
    real = tmp_path / "e2e.json"
    real.write_text(json.dumps({"workload": "agentic-e2e", "jct_s": jct, "speedup": {}, "cap_mbps": 100.0,
                                "control_uncapped_jct_s": 3.0}))
    with pytest.raises(SystemExit) as e:
        cli.main(["sim", "validate", "--hardware", PAPER_FIT, "--real", str(real), "--out", str(tmp_path / "v")])
    assert e.value.code == 2 and "is not a `dualjax bench e2e --json` result" in capsys.readouterr().err
    assert os.listdir(tmp_path) == ["e2e.json"]


def test_scratch_dir_left_empty_is_removed(tmp_path, monkeypatch):
    """A directory a command made for its flags and left empty (a benchmark's scratch --dir, its
    temporary files gone) is removed when the command ends, as after bad input."""
    from dualjax.bench import kvstore
    monkeypatch.setattr(kvstore, "main", lambda argv=None, args=None: {})  # the benchmark, cleaned up after itself
    assert cli.main(["bench", "kvstore", "--dir", str(tmp_path / "new" / "sub")]) == 0
    assert os.listdir(tmp_path) == []
