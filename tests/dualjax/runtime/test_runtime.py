"""Runtime invariants: tokens do not depend on the read path, layerwise mode or launcher, and
equal a reference that recomputes every prompt; faults recompute; a failing host ends the job."""

import glob
import importlib.resources
import json
import os
import subprocess
import sys
import threading
import time

import jsonschema
import numpy as np
import pytest

from dualjax.cli import main as cli
from dualjax.core.config import ClusterSpec, RunConfig
from dualjax.core.report import REQUEST_COLUMNS
from dualjax.outputs import load_run
from dualjax.runtime.cluster.runner import failed_hosts, mpiexec, run_embedded
from dualjax.runtime.decode_host import DecodeHost
from dualjax.runtime.host import shared
from dualjax.runtime.transport import HostFailure
from dualjax.runtime.verify import tokens_of
from tests.dualjax.runtime.failing_host import failing

BASE = RunConfig(ClusterSpec(1, 1), model="tiny", workload="agentic-tiny", agents=3, turns=3)
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
CUSTOM = "tests.dualjax.core.custom_policy:LongPrefixToDE"  # a user's policy class, imported on every rank


def _run(tmp_path, name, **changes):
    cfg = BASE.replace(out=str(tmp_path / name), **changes)
    report = run_embedded(cfg, progress=False)
    return report, tokens_of(cfg.out)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    _, tokens = _run(tmp_path_factory.mktemp("ref"), "reference", use_store=False)
    return tokens


@pytest.mark.parametrize("policy,layerwise,cluster", [("pe-only", True, "1p1d"), ("de-only", True, "1p2d"),
                                                      ("random", False, "2p1d"), ("de-only", False, "1p1d"),
                                                      ("dualpath", True, "2p2d"), ("basic", None, "1p1d")])
def test_tokens_match_reference(tmp_path, reference, policy, layerwise, cluster):
    report, tokens = _run(tmp_path, "run", policy=policy, layerwise=layerwise, cluster=ClusterSpec.parse(cluster))
    assert tokens == reference
    assert report["hit_rate"] > 0.3  # later turns really read their prefix from the store
    if policy == "de-only":
        assert report["relay_bytes"] > 0
        assert report["paths"] == {"pe": 0, "de": report["requests"], "split": 0, "none": 0}
    if policy in ("pe-only", "basic"):
        assert report["relay_bytes"] == 0


def test_the_first_token_is_the_pe_s_and_ttst_runs_from_it(tmp_path, reference):
    """docs/paper.md §10: the first token comes out of the PE's last prefill pass, the second out of the DE's
    first step after the prompt's KV is in a decode slot, so TTST (second - first) holds the P->D hand-off;
    the tokens are the reference's."""
    report, tokens = _run(tmp_path, "tokens", policy="dualpath")
    assert tokens == reference
    cols = load_run(str(tmp_path / "tokens")).requests
    assert np.array_equal(cols["first_token"], cols["prefill_end"])
    two = cols["gen_len"] > 1
    assert two.any() and (cols["ttst"][two] > 0).all()
    assert (cols["first_token"] + cols["ttst"] <= cols["done"])[two].all()


@pytest.mark.parametrize("de_memory", ["resident", "reserved"])
def test_de_memory_readings_keep_the_tokens(tmp_path, reference, de_memory):
    """Both readings of a DE's free memory (docs/paper.md §3, §7): with one decode slot, resident memory lets
    rank 0 place requests whose KV then waits in the DE buffer for the slot (the DE reports each move into
    it, `KvIn`); reserved memory holds them back at rank 0. Either way every request ends with the
    reference's tokens, and the DE decodes one at a time: no two requests' decode spans overlap."""
    report, tokens = _run(tmp_path, de_memory, policy="dualpath", decode_slots=1, de_memory=de_memory)
    assert tokens == reference
    cols = load_run(str(tmp_path / de_memory)).requests
    order = np.argsort(cols["first_token"] + cols["ttst"])
    second, done = (cols["first_token"] + cols["ttst"])[order], cols["done"][order]
    assert (second[1:] >= done[:-1]).all()


def test_chunked_prefill(tmp_path, reference):
    """Prefill cut into chunks gives the reference tokens; each chunk's pass is counted by shape."""
    report, tokens = _run(tmp_path, "chunked", policy="de-only", prefill_chunk=48)  # 150-token first turns: 4 chunks
    assert tokens == reference
    pe = next(h for h in report["hosts"] if h["role"] == "prefill")
    shapes = pe["pass_shapes"]  # [{rows, new, prefix, passes, seconds}] by padded shape
    assert sum(t["passes"] for t in shapes) == pe["passes"]
    # 48-token chunks, padded to the smallest bucket, first over no prefix, then over one
    assert {t["new"] for t in shapes} == {256} and {0, 512} <= {t["prefix"] for t in shapes}
    assert sum(t["seconds"] for t in shapes) == pytest.approx(pe["pass_s"])


def test_full_buffers_make_requests_wait(tmp_path, reference):
    """Requests that do not fit the host buffers wait for room and are not dropped."""
    # tiny blocks are 32 KiB and prompts here need up to 5 (160 KiB) at the DE and 4 hit blocks at the
    # PE: budgets of 0.25 / 0.2 MiB hold about one request each, so the others must wait for room.
    report, tokens = _run(tmp_path, "tight", policy="dualpath", de_buffer_mb=0.25, pe_buffer_mb=0.2,
                          cluster=ClusterSpec.parse("1p1d"))
    assert tokens == reference
    peaks = {h["role"]: h["buffer_peak_bytes"] for h in report["hosts"]}
    assert 4 * 32768 <= peaks["decode"] <= 0.25 * 2**20 and peaks["prefill"] <= 0.2 * 2**20


def test_one_row_per_request(tmp_path):
    report, _ = _run(tmp_path, "out", policy="pe-only")
    t = load_run(str(tmp_path / "out")).requests
    assert len(t["id"]) == report["requests"] == 9 and set(t) == set(REQUEST_COLUMNS)
    assert [len(g) for g in t["generated"]] == t["gen_len"].tolist() and (t["hit_tokens"] <= t["prompt_tokens"]).all()
    assert (0 <= t["arrival"]).all() and (t["arrival"] <= t["first_token"]).all()
    assert (t["first_token"] <= t["done"]).all()
    assert np.isnan(t["load_wait"]).all() and (t["stored"] >= t["done"]).all()  # a simulator-only column is null


@pytest.mark.parametrize("policy", ["pe-only", "de-only"])
def test_bad_blocks_recomputed(tmp_path, reference, policy):
    store = str(tmp_path / "store")
    _run(tmp_path, "fill", policy=policy, store=store)
    files = sorted(glob.glob(os.path.join(store, "data", "*")))
    rng = np.random.default_rng(0)
    for f in rng.choice(files, len(files) // 2, replace=False):
        if rng.random() < 0.5:
            os.remove(f)
        else:
            raw = bytearray(open(f, "rb").read())
            raw[len(raw) * 3 // 4] ^= 0xFF
            open(f, "wb").write(bytes(raw))
    report, tokens = _run(tmp_path, "again", policy=policy, store=store)
    assert report["restarts"] > 0  # the fault path really ran
    assert tokens == reference


def test_failing_host_ends_embedded_run(tmp_path, monkeypatch):
    """A host that raises ends the run with its traceback, kept in its run directory (and an
    earlier run's is not taken for it)."""
    monkeypatch.setattr(DecodeHost, "handle", failing(DecodeHost.handle))
    stale = tmp_path / "fail" / "failed-rank1.txt"  # left by an earlier run in the same directory
    stale.parent.mkdir()
    stale.write_text("an earlier failure")
    with pytest.raises(HostFailure, match="injected failure on rank 2"):
        _run(tmp_path, "fail")
    assert failed_hosts(str(tmp_path / "fail")) == [str(tmp_path / "fail" / "failed-rank2.txt")]
    assert "injected failure on rank 2" in (tmp_path / "fail" / "failed-rank2.txt").read_text()


def test_failing_host_ends_mpi_job(tmp_path):
    """Under mpiexec, a host that raises ends the whole job (no hang) with its traceback, on stderr
    and in its run directory (`dualjax run` prints that file after the job: tests/dualjax/cli)."""
    argv = ["--cluster", "1p1d", "--agents", "2", "--turns", "1", "--quiet", "--out", str(tmp_path / "mpi")]
    script = "tests/dualjax/runtime/failing_host.py"
    proc = subprocess.run([mpiexec(), "-n", "3", sys.executable, "-m", "mpi4py", script, *argv],
                          capture_output=True, text=True, timeout=240, cwd=REPO)
    assert proc.returncode != 0
    assert "injected failure on rank 1" in proc.stderr and "Traceback" in proc.stderr
    assert "injected failure on rank 1" in (tmp_path / "mpi" / "failed-rank1.txt").read_text()


def test_mpiexec_tokens(tmp_path, reference):
    """`dualjax run` under its own mpiexec, with a user's policy class (`--policy pkg.module:Class`,
    imported on every rank): the reference tokens, both read paths taken."""
    out = tmp_path / "mpi"
    argv = ["run", "--cluster", "1p2d", "--agents", "3", "--turns", "3", "--policy", CUSTOM, "--quiet",
            "--out", str(out)]
    proc = subprocess.run([sys.executable, "-m", "dualjax.cli.main", *argv], capture_output=True, text=True,
                          timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.load(open(out / "report.json"))
    assert report["policy"] == "long-prefix-to-de" and report["paths"]["pe"] and report["paths"]["de"]
    assert tokens_of(str(out)) == reference
    schema = json.loads(importlib.resources.files("dualjax").joinpath("report.schema.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(report)  # placement and each rank's devices included
    assert [r["role"] for r in report["runtime"]["placement"]["ranks"]] == ["scheduler", "prefill", "decode", "decode"]


def test_trajectory_file(tmp_path):
    path = tmp_path / "agents.jsonl"
    path.write_text("\n".join(json.dumps({"start": 0.2 * i, "turns": [{"append_len": 100, "gen": 3},
                                                                       {"append_len": 20, "gen": 3}]})
                              for i in range(3)))
    report, tokens = _run(tmp_path, "file", workload=str(path), policy="dualpath")
    assert report["requests"] == 6 and len(tokens) == 6


def test_online_arrivals(tmp_path):
    _run(tmp_path, "online", aps=5.0, agents=3, turns=2)
    t = load_run(str(tmp_path / "online"), ["turn", "arrival"]).requests
    assert t["arrival"][t["turn"] == 0].max() > 0.05  # agents really arrived over time


def test_custom_policy_everywhere(tmp_path, reference):
    """`--policy pkg.module:Class` works embedded, under a user's own mpirun of launch.main, and in
    the simulator: the same class, unchanged (under `dualjax run`'s mpiexec: the test above)."""
    args = ["--cluster", "1p1d", "--agents", "3", "--turns", "3", "--policy", CUSTOM, "--quiet"]
    assert cli.main(["run", "--embedded", *args, "--out", str(tmp_path / "embedded")]) == 0
    proc = subprocess.run([mpiexec(), "-n", "3", sys.executable, "-m", "mpi4py", "-m", "launch.main", *args,
                           "--out", str(tmp_path / "launch")], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for name in ("embedded", "launch"):
        report = json.load(open(tmp_path / name / "report.json"))
        assert report["policy"] == "long-prefix-to-de" and report["paths"]["pe"] and report["paths"]["de"]
        assert tokens_of(str(tmp_path / name)) == reference
    assert cli.main(["sim", "--cluster", "1p1d", "--model", "qwen2.5-7b", "--workload", "paper-32k", "--agents", "4",
                     "--policy", CUSTOM, "--quiet", "--out", str(tmp_path / "sim")]) == 0
    assert json.load(open(tmp_path / "sim" / "report.json"))["policy"] == "long-prefix-to-de"


def test_message_and_waiter_share_signal():
    """The thread taking a request's message in and the one about to wait for it may both find no
    signal yet for that request: both get the same one (a `defaultdict` gave each its own, and a
    relay once waited for good on the one the DE's `Ready` never reached)."""
    def slow_event():  # both threads miss the key before either has made its Event
        time.sleep(0.05)
        return threading.Event()
    for _ in range(3):
        signals, got = {}, []
        threads = [threading.Thread(target=lambda: got.append(shared(signals, 8, slow_event))) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        got[0].set()  # the message's side
        assert got[1].is_set() and signals[8] is got[0] is got[1]  # the waiter's side sees it
