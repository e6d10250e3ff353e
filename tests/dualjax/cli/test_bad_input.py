"""Bad input to any command ends with one line naming what was wrong and exit code 2, before any
work starts: never a traceback."""

import json

import pytest

from dualjax.cli import main as cli


@pytest.mark.parametrize("argv,message", [
    (["--cluster", "2x3"], "unknown cluster"),
    (["--cluster", "0p1d"], "at least one prefill"),
    (["--pe-buffer-mb", "0.01"], "cannot hold one request"),
    (["--snic-mbps", "-5"], "must be positive"),
    (["--model", "gpt-9"], "unknown model preset"),
    (["--policy", "fastest"], "unknown policy"),
    (["--aps", "0"], "must be positive"),
    (["--policy", "basic", "--layerwise"], "contradicts policy 'basic'"),
    (["--policy", "nosuchmodule:Policy"], "cannot import module 'nosuchmodule'"),
    (["--policy", "dualjax.core.policies:Nope"], "has no 'Nope'"),
    (["--aps", "nan"], "aps must be positive"),
    (["--pe-buffer-mb", "inf"], "pe_buffer_mb must be positive and finite"),
    (["--seed", "-5"], "seed must be >= 0"),
    (["--block-tokens", "1000000"], "exceeds tiny's context"),
    (["--workload", "/nonexistent.jsonl"], "/nonexistent.jsonl: No such file or directory"),
    (["--workload", "mooncake:/nonexistent"], "/nonexistent: No such file or directory"),
    (["--workload", "mooncake:trace.jsonl:abc"], "LIMIT must be an integer"),
    (["--workload", "mooncake:"], "expected mooncake:PATH[:LIMIT[:LENGTH_SCALE]]"),
])
def test_bad_run_flags(tmp_path, capsys, argv, message):
    """A bad `dualjax run` flag: one line naming it, exit code 2."""
    rc = cli.main(["run", "--embedded", "--quiet", "--out", str(tmp_path / "x"), *argv])
    assert rc == 2 and message in capsys.readouterr().err


@pytest.mark.parametrize("argv,message", [
    (["run", "--embedded", "--quiet", "--out", "{file}"], "--out: {file} is a file, not a directory"),
    (["run", "--embedded", "--quiet", "--out", "{dir}/run", "--store", "{file}"], "{file} is a file, not a directory"),
    (["run", "--embedded", "--quiet", "--out", "{file}/run"], "cannot make directory {file}/run"),
    (["run", "--embedded", "--quiet", "--out", "{dir}/run", "--store", "file://{file}/kv"],
     "cannot make directory {file}/kv: Not a directory"),
    (["run", "--embedded", "--quiet", "--out", "{dir}/run", "--store", "foo://kv"], 'unsupported URL scheme "foo"'),
    (["run", "--embedded", "--quiet", "--out", "{dir}/run", "--store", '{{"driver": "nope"}}'],
     '"nope" is not a registered KvStore driver'),
    (["run", "--embedded", "--quiet", "--out", "{dir}/run", "--store", "{bad}"], "--store {bad}: not JSON"),
    (["run", "--embedded", "--quiet", "--out", "{dir}/run", "--store", "memory://"], "give --store-gb"),
    (["run", "--embedded", "--quiet", "--out", "{dir}/run", "--store", "http://127.0.0.1:1/kv", "--store-gb", "1"],
     "cannot reach the store http://127.0.0.1:1/kv"),  # a network store nothing answers for: a port none listens on
    (["run", "--quiet", "--out", "{dir}/run", "--store", "memory://", "--store-gb", "1"],
     "a memory:// store lives inside one process and MPI ranks are separate processes"),
    (["demo", "--quick", "--out", "{file}"], "{file} is a file, not a directory"),
    (["demo", "--model", "nosuch", "--out", "{dir}/demo"], "unknown model preset 'nosuch'"),
    (["bench", "kvstore", "--dir", "{file}"], "{file} is a file, not a directory"),
    (["bench", "relay", "--json", "{file}/r.json"], "{file} is a file, not a directory"),
    (["workload", "stats", "agentic-tiny", "--json", "{dir}"], "{dir} is a directory, not a file"),
    (["sim", "ablation", "--plot", "{file}/a.png"], "{file} is a file, not a directory"),
    (["sim", "validate", "--real", "{dir}/none.json"], "--real {dir}/none.json: No such file or directory"),
    (["sim", "validate", "--real", "{bad}"], "is not JSON"),
    (["sim", "validate", "--real", "{empty}"], "is not a `dualjax bench e2e --json` result (missing workload"),
    (["sim", "validate", "--real", "{empty}", "--hardware", "{bad}"], "is not a `dualjax bench e2e"),
    (["sim", "validate", "--hardware", "{bad}"], "is not a profile `dualjax calibrate` writes"),
    (["sim", "validate", "--max-wall-s", "30"], "leaves no time for the e2e benchmark"),
    (["sim", "--hardware", "{empty}"], "is not a profile `dualjax calibrate` writes"),
    (["sim", "--hardware", "{dir}"], "Is a directory"),
    (["sim", "--find-capacity", "--slo-attainment", "1.5"], "must be a finite number > 0 and <= 1, got 1.5"),
    (["report", "{dir}/damaged"], "{dir}/damaged/report.json is damaged"),
    (["report", "{dir}/other"], "{dir}/other/report.json is neither a real nor a simulated dualjax run"),
    (["report", "{dir}/old"], "{dir}/old/report.json has schema version 0"),
    (["bench", "model", "--model", "nosuch"], "unknown model preset 'nosuch'"),
    (["bench", "kvstore", "--max-wall-s", "-1"], "--max-wall-s: must be a finite number >= 0, got -1"),
    (["bench", "dataplane", "--max-wall-s", "x"], "--max-wall-s: expected a number, got 'x'"),
    (["bench", "layerwise", "--max-wall-s", "inf"], "--max-wall-s: must be a finite number >= 0, got inf"),
    (["bench", "e2e", "--storage-factor", "0"], "--storage-factor: must be a finite number > 0, got 0"),
    (["bench", "relay", "--chunk-kib", "x"], "--chunk-kib: expected an integer, got 'x'"),
    (["calibrate", "--workload", "nosuch", "--json", "{dir}/local.json"], "unknown workload 'nosuch'"),
    (["calibrate", "--json", "{file}/local.json"], "{file} is a file, not a directory"),
    (["calibrate", "--model", "{dir}/nowhere", "--json", "{dir}/local.json"],  # a checkpoint directory, or a preset
     "unknown model preset '{dir}/nowhere', and no checkpoint directory of that name"),
    (["calibrate", "--model", "{dir}/damaged", "--json", "{dir}/local.json"], "a directory without config.json"),
    (["calibrate", "--dir", "{file}", "--json", "{dir}/local.json"], "{file} is a file, not a directory"),
    (["calibrate", "--decode-slots", "0"], "--decode-slots: must be a finite number > 0, got 0"),
    (["sim", "validate", "--hardware", "{file}/local.json"], "--hardware: {file} is a file, not a directory"),
    (["bench", "e2e", "--max-wall-s", "nan"], "--max-wall-s: must be a number > 0, got nan"),
    # an output that cannot be written (/proc: not even root makes a file there), refused before the work
    (["workload", "stats", "agentic-tiny", "--json", "/proc/ws.json"], "cannot write"),
    (["plan", "--json", "/proc/p.json"], "cannot write"),
    (["sim", "--json", "/proc/sim.json"], "cannot write"),
    (["report", "{dir}/other", "--plot", "/proc/rep.png"], "cannot write"),
    (["sim", "paper", "--json", "{dir}/p.json", "--plot", "{dir}"], "{dir} is a directory, not a file"),
    (["verify", "--hostfile", "{empty}"], "hostfile {empty}, line 1: expected HOST or HOST:N"),
    (["verify", "--hostfile", "{file}"], "hostfile {file} lists no hosts"),
    (["verify", "--hostfile", "slurm"], "--hostfile slurm: SLURM_JOB_NODELIST is not set"),
    (["verify", "--hostfile", "{dir}/none"], "--hostfile: {dir}/none is neither a number of hosts nor a hostfile"),
    (["verify", "--hostfile", "1"], "--hostfile: at least 2 hosts, got 1"),
    # one name per thing: the names other commands do not use are not flags
    (["verify", "--hosts", "4"], "unrecognized arguments: --hosts 4"),
    (["bench", "kvstore", "--budget-s", "1"], "unrecognized arguments: --budget-s 1"),
    (["bench", "dataplane", "--budget-s", "1"], "unrecognized arguments: --budget-s 1"),
    # flags the command would ignore
    (["plan", "--model", "nosuch", "--policy", "x"], "--model, --policy: only with --sweep"),
    (["sim", "--model", "tinyy", "--out", "{dir}/leak", "ablation"], "--model, --out before `ablation`"),
    (["sim", "--find-capacity", "--out", "{dir}/cap"], "--out: a capacity search writes no run outputs"),
    (["sim", "--slo-attainment", "0.8"], "--slo-attainment: only with --find-capacity"),
    (["workload", "stats", "nosuch"], "dualjax workload stats: error: unknown workload"),
])
def test_bad_input(tmp_path, capsys, monkeypatch, argv, message):
    """Bad input, one line and exit code 2 before the command starts work, not a traceback (or a
    failure once a long benchmark has run)."""
    monkeypatch.chdir(tmp_path)  # default output directories are made as the flags are parsed
    for var in ("SLURM_JOB_NODELIST", "SLURM_NODELIST"):  # outside an allocation
        monkeypatch.delenv(var, raising=False)
    (tmp_path / "f").write_text("")
    (tmp_path / "bad.json").write_text("{bad")
    (tmp_path / "empty.json").write_text("{}")
    (tmp_path / "damaged").mkdir()
    (tmp_path / "damaged" / "report.json").write_text('{"config": {')
    for name, report in (("other", {"jct_s": 1.0}), ("old", {"kind": "real", "schema_version": 0})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "report.json").write_text(json.dumps(report))
    fill = {"file": str(tmp_path / "f"), "dir": str(tmp_path), "bad": str(tmp_path / "bad.json"),
            "empty": str(tmp_path / "empty.json")}
    (tmp_path / "a.b" / "out.png").mkdir(parents=True)
    before = sorted(str(p) for p in tmp_path.rglob("*"))
    try:
        rc = cli.main([a.format(**fill) for a in argv])
    except SystemExit as e:  # argparse's own exit for a flag's bad value
        rc = e.code
    out, err = capsys.readouterr()
    assert rc == 2 and message.format(**fill) in err and not out  # nothing started, nothing announced
    assert sorted(str(p) for p in tmp_path.rglob("*")) == before  # nothing written, no directory left


def test_store_of_another_model(tmp_path, capsys):
    """A store written for one model is refused by a run of another (its fingerprint), in one line."""
    assert cli.main(["run", "--embedded", "--quiet", "--agents", "1", "--turns", "1",
                     "--store", str(tmp_path / "store"), "--out", str(tmp_path / "tiny")]) == 0
    rc = cli.main(["run", "--embedded", "--quiet", "--model", "small", "--store", str(tmp_path / "store"),
                   "--out", str(tmp_path / "small")])
    assert rc == 2 and "fingerprint" in capsys.readouterr().err
