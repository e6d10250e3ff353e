"""One output format: a real run and a simulation of the same setting write the same files, with the
same columns and report keys, valid against the packaged JSON Schema, read back by `load_run` and
compared by `dualjax report`; docs/report.md documents every key and column; bad run directories are
one line."""

from __future__ import annotations

import dataclasses
import importlib.resources
import json
import os
import re

import jsonschema
import numpy as np
import pytest

from dualjax.cli.main import main
from dualjax.core.config import ClusterSpec, RunConfig, SimConfig
from dualjax.core.report import REQUEST_COLUMNS, SCHEMA_VERSION
from dualjax.outputs import OutputError, load_run, read_table, report_json, write_table
from dualjax.runtime.cluster.runner import run_embedded
from dualjax.sim import simulate
from dualjax.sim.profiles import PAPER_H800

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SCHEMA = json.loads(importlib.resources.files("dualjax").joinpath("report.schema.json").read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A real embedded run and a simulation of one setting (1p1d, tiny, agentic-tiny, 3 agents x 3 turns)."""
    d = tmp_path_factory.mktemp("runs")
    setting = dict(cluster=ClusterSpec(1, 1), model="tiny", workload="agentic-tiny", agents=3, turns=3)
    run_embedded(RunConfig(**setting, out=str(d / "real")), progress=False)
    # a profiled prefill rate, as `local` has: beta from it, not from packing tiny rows on an H800
    hw = dataclasses.replace(PAPER_H800, prefill_tokens_per_s=1e4)
    simulate(SimConfig(**setting), out=str(d / "sim"), hardware=hw, progress=False)
    return d


@pytest.mark.parametrize("name", ["real", "sim"])
def test_report_json_reads_back_as_written_with_one_line_per_host_series(runs, name):
    report = load_run(str(runs / name)).report
    text = report_json(report)
    assert json.loads(text) == report
    one_host = report_json({**report, "storage_series": {"h": [[0.0, 1.0], [1.0, 2.0]]}})
    assert len(text.splitlines()) == len(one_host.splitlines()) + len(report["storage_series"]) - 1
    assert json.loads(report_json({**report, "storage_series": {}})) == {**report, "storage_series": {}}


@pytest.mark.parametrize("name", ["real", "sim"])
def test_a_report_is_valid_against_the_schema(runs, name):
    report = json.load(open(runs / name / "report.json"))
    jsonschema.Draft202012Validator(SCHEMA).validate(report)
    assert report["schema_version"] == SCHEMA_VERSION and report["kind"] == {"real": "real", "sim": "simulated"}[name]
    assert (report["runtime"] is None) == (name == "sim") and (report["sim"] is None) == (name == "real")


def test_real_and_simulated_runs_write_the_same_files_columns_and_keys(runs):
    real, sim = load_run(str(runs / "real")), load_run(str(runs / "sim"))
    assert sorted(os.listdir(runs / "sim")) == sorted(f for f in os.listdir(runs / "real") if f != "store")
    assert list(real.requests) == list(sim.requests) == list(REQUEST_COLUMNS)
    assert {k: v.dtype for k, v in real.requests.items()} == {k: v.dtype for k, v in sim.requests.items()}
    assert set(real.report) == set(sim.report) and real.report["requests"] == sim.report["requests"] == 9
    for key in ("config", "workload", "ttft_s", "slo", "paths", "store"):
        assert set(real.report[key]) == set(sim.report[key]), key
    assert set(real.report["hosts"][0]) == set(sim.report["hosts"][0])
    assert real.report["config"] == sim.report["config"]  # the same setting, in the same keys
    # the same requests (one row each): agents, turns, lengths; only the measured times differ
    order = [np.lexsort((t["turn"], t["agent"])) for t in (real.requests, sim.requests)]
    for k in ("agent", "turn", "gen_len", "prompt_tokens"):
        assert np.array_equal(real.requests[k][order[0]], sim.requests[k][order[1]]), k
    assert np.isnan(sim.requests["stored"]).all() and all(g is None for g in sim.requests["generated"])
    assert np.allclose(real.requests["ttft"], real.requests["first_token"] - real.requests["arrival"])


def test_report_compares_real_and_simulated_runs_in_a_table_and_a_figure(runs, tmp_path, capsys):
    png, js = tmp_path / "cmp.png", tmp_path / "cmp.json"
    assert main(["report", str(runs / "real"), str(runs / "sim"), "--plot", str(png), "--json", str(js)]) == 0
    out = capsys.readouterr().out
    assert " real " in out and " simulated " in out and png.stat().st_size > 10_000
    rows = json.loads(js.read_text())
    assert [r["kind"] for r in rows] == ["real", "simulated"] and all(r["requests"] == 9 for r in rows)
    assert os.listdir(tmp_path) and main(["report", str(runs / "sim")]) == 0 and sorted(os.listdir(tmp_path)) == \
        ["cmp.json", "cmp.png"]  # without --plot or --json, nothing is written


def test_the_request_table_round_trips_nulls_paths_and_token_lists(tmp_path):
    n = 5
    cols = {k: np.arange(n, dtype=np.int64) * 3 for k, (kind, _, _) in REQUEST_COLUMNS.items() if kind == "int"}
    cols |= {k: np.linspace(0, 1, n) for k, (kind, _, _) in REQUEST_COLUMNS.items() if kind == "float"}
    cols["ttst"][[1, 3]] = np.nan
    cols["path"] = np.array(["pe", "de", "none", "pe", "de"], dtype=object)
    cols["generated"] = np.array([np.arange(k, dtype=np.int32) for k in range(n)] + [None], dtype=object)[:-1]
    cols["generated"][2] = None
    write_table(str(tmp_path / "t.parquet"), cols, "real")
    back = read_table(str(tmp_path / "t.parquet"))
    for k, (kind, _, _) in REQUEST_COLUMNS.items():
        if kind == "ids":
            assert [None if g is None else g.tolist() for g in back[k]] == \
                [None if g is None else g.tolist() for g in cols[k]]
        else:
            assert np.array_equal(back[k], cols[k], equal_nan=kind == "float"), k
    import pyarrow.parquet as pq
    schema = pq.read_schema(str(tmp_path / "t.parquet"))
    assert schema.metadata[b"dualjax.schema_version"] == str(SCHEMA_VERSION).encode()
    assert schema.field("arrival").metadata[b"unit"] == b"s"


def test_docs_describe_every_report_key_and_table_column():
    doc = open(os.path.join(ROOT, "docs", "report.md")).read()
    keys = set()

    def walk(node):
        for k, sub in node.get("properties", {}).items():
            keys.add(k)
            walk(sub)
        if isinstance(node.get("items"), dict):
            walk(node["items"])
    walk(SCHEMA)
    missing = sorted(k for k in keys | set(REQUEST_COLUMNS) if not re.search(rf"`{re.escape(k)}`", doc))
    assert not missing, f"docs/report.md does not describe {missing}"


def test_a_directory_that_is_not_a_run_of_this_schema_is_refused_in_one_line(runs, tmp_path):
    report = json.load(open(runs / "sim" / "report.json"))
    cases = {"empty": None, "other": {"jct_s": 1}, "newer": {**report, "schema_version": SCHEMA_VERSION + 1},
             "no-table": report}
    for name, body in cases.items():
        (tmp_path / name).mkdir()
        if body is not None:
            (tmp_path / name / "report.json").write_text(json.dumps(body))
    reasons = {"empty": "no report.json", "other": "neither a real nor a simulated", "newer": "schema version",
               "no-table": "no requests.parquet"}
    for name, reason in reasons.items():
        with pytest.raises(OutputError, match=reason) as e:
            load_run(str(tmp_path / name))
        assert name in str(e.value) and "\n" not in str(e.value)
    (tmp_path / "no-table" / "requests.parquet").write_text("not parquet")
    with pytest.raises(OutputError, match="requests.parquet is damaged"):
        load_run(str(tmp_path / "no-table"))
    with pytest.raises(OutputError, match="no column nosuch"):
        load_run(str(runs / "sim"), ["ttft", "nosuch"])


def test_the_local_profile_lives_in_the_per_user_home_whatever_the_working_directory(tmp_path, monkeypatch):
    """The `local` profile's file: $DUALJAX_HOME, else $XDG_DATA_HOME/dualjax (an absolute one, as the XDG
    spec says), else ~/.local/share/dualjax; the same from any working directory."""
    from dualjax.core.paths import local_profile
    for var in ("DUALJAX_HOME", "XDG_DATA_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "me"))
    default = os.path.join(str(tmp_path), "me", ".local", "share", "dualjax", "local.json")
    for cwd in ("a", "b"):
        (tmp_path / cwd).mkdir()
        monkeypatch.chdir(tmp_path / cwd)
        assert local_profile() == default
    monkeypatch.setenv("XDG_DATA_HOME", "relative/share")
    assert local_profile() == default
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert local_profile() == os.path.join(str(tmp_path), "xdg", "dualjax", "local.json")
    monkeypatch.setenv("DUALJAX_HOME", str(tmp_path / "dj"))
    assert local_profile() == os.path.join(str(tmp_path), "dj", "local.json")


def _measured():
    """A `local` profile as `dualjax calibrate` writes one (its figures made up)."""
    return dataclasses.replace(PAPER_H800, name="local", model="tiny", pass_table=((1, 64, 0, 0.01),),
                               prefill_fit=(1e-9, 1e-6, 1e-3), decode_fit=(1e-3, 1e-6), contention=(1.5,),
                               decode_contention=(1.25,))


def test_calibrate_writes_the_local_profile_to_the_per_user_home_and_nothing_else(tmp_path, monkeypatch, capsys):
    """`dualjax calibrate` writes its product, the `local` profile, to the per-user home and nothing else:
    its scratch store is gone when it ends. The measuring itself (minutes) is a stand-in that writes a
    scratch store and the profile."""
    from dualjax.bench import calibrate
    monkeypatch.setenv("DUALJAX_HOME", str(tmp_path / "home"))
    scratch = []

    def measure(model, workload, store_dir, *rest):
        os.makedirs(store_dir)
        open(os.path.join(store_dir, "segment"), "w").close()
        scratch.append(store_dir)
        return dataclasses.asdict(_measured())
    monkeypatch.setattr(calibrate, "_measure", measure)
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    assert main(["calibrate", "--model", "tiny", "--quiet"]) == 0
    profile = str(tmp_path / "home" / "local.json")
    assert f"-> {profile} (--hardware local reads it)" in capsys.readouterr().out
    assert os.listdir(tmp_path / "work") == [] and not os.path.exists(scratch[0])  # nothing else written
    assert os.listdir(tmp_path / "home") == ["local.json"]


def test_hardware_local_is_the_per_user_profile_from_any_working_directory(tmp_path, monkeypatch):
    """`--hardware local` reads the profile `dualjax calibrate` wrote (`local_profile()`), wherever the
    command starts: a sweep started from a policy's folder finds it."""
    from dualjax.core.paths import local_profile
    from dualjax.sim.profiles import get_hardware, save_hardware
    monkeypatch.setenv("DUALJAX_HOME", str(tmp_path / "home"))
    save_hardware(_measured(), local_profile())
    (tmp_path / "policy").mkdir()
    monkeypatch.chdir(tmp_path / "policy")
    hw = get_hardware("local")
    assert (hw.name, hw.model, hw.pass_table, hw.contention) == ("local", "tiny", ((1, 64, 0, 0.01),), (1.5,))
