"""The fault matrix: storage faults never change tokens and never stop serving.

Each case runs `tiny` on `agentic-tiny` over a store that a clean run filled, with one fault, and
checks (1) tokens identical to the no-store reference and (2) the store counters in report.json
that say the fault was seen. Set DUALJAX_FAULT_MATRIX=FILE to write the table (fault ->
identical?, counters) to FILE. Cases that start processes (kill -9, two runs on one store, a real
full filesystem, mpiexec) are `slow`.
"""

import errno
import glob
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from dualjax.core.config import ClusterSpec, RunConfig
from dualjax.runtime.cluster.runner import run_embedded
from dualjax.runtime.verify import tokens_of
from kvstore.posix import PosixBackend

BASE = RunConfig(ClusterSpec(1, 1), model="tiny", workload="agentic-tiny", agents=2, turns=3, policy="dualpath")
ARGV = ["--model", "tiny", "--workload", "agentic-tiny", "--agents", "2", "--turns", "3", "--policy", "dualpath",
        "--quiet"]
MATRIX: list[tuple[str, bool, dict]] = []
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


@pytest.fixture(scope="module", autouse=True)
def matrix_table():
    yield
    path = os.environ.get("DUALJAX_FAULT_MATRIX")
    if path and MATRIX:
        keys = list(MATRIX[0][2])
        lines = ["| fault | tokens identical | " + " | ".join(keys) + " |", "|---" * (len(keys) + 2) + "|"]
        lines += [f"| {f} | {'yes' if ok else 'NO'} | " + " | ".join(str(c.get(k, "")) for k in keys) + " |"
                  for f, ok, c in MATRIX]
        with open(path, "a") as f:
            f.write("\n".join(lines) + "\n")


def _run(tmp_path, name, **changes):
    cfg = BASE.replace(out=str(tmp_path / name), **changes)
    report = run_embedded(cfg, progress=False)
    return report, tokens_of(cfg.out)


def _check(fault, report, tokens, reference) -> dict:
    counters = dict(report["store"], restarts=report["restarts"], hit_rate=round(report["hit_rate"], 3))
    MATRIX.append((fault, tokens == reference, counters))
    assert tokens == reference, fault
    return counters


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("ref"), "reference", use_store=False)[1]


@pytest.fixture(scope="module")
def filled(tmp_path_factory, reference):
    """A store a clean run filled (the first row of the matrix)."""
    tmp = tmp_path_factory.mktemp("filled")
    report, tokens = _run(tmp, "fill", store=str(tmp / "store"))
    c = _check("none (fresh store)", report, tokens, reference)
    assert c["write_failures"] == c["bad_blocks"] == c["evicted"] == 0 and c["blocks_read"] > 0
    return str(tmp / "store")


def _copy(filled, tmp_path) -> str:
    store = str(tmp_path / "store")
    shutil.copytree(filled, store)
    return store


def _data_files(store):
    return sorted(f for f in glob.glob(os.path.join(store, "data", "*")) if not f.endswith("zarr.json"))


def _flip(path):
    raw = bytearray(open(path, "rb").read())
    raw[len(raw) * 3 // 4] ^= 0xFF
    open(path, "wb").write(bytes(raw))


FAULTS = {
    "corrupt blocks": lambda f: _flip(f),
    "truncated blocks": lambda f: os.truncate(f, os.path.getsize(f) // 2),
    "missing blocks": os.remove,
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_bad_block_data_is_recomputed(tmp_path, filled, reference, fault):
    store = _copy(filled, tmp_path)
    files = _data_files(store)
    for f in np.random.default_rng(0).choice(files, len(files) // 3, replace=False):
        FAULTS[fault](f)
    c = _check(fault, *_run(tmp_path, "run", store=store), reference)
    assert c["bad_blocks"] > 0 and c["invalidated"] >= c["bad_blocks"] and c["restarts"] > 0
    again = _check(f"{fault}, next run (healed)", *_run(tmp_path, "again", store=store), reference)
    assert again["bad_blocks"] == 0 and again["blocks_read"] > 0


@pytest.mark.parametrize("fault", ["garbled index entries", "deleted index entries"])
def test_bad_index_entries_are_misses(tmp_path, filled, reference, fault):
    store = _copy(filled, tmp_path)
    entries = sorted(glob.glob(os.path.join(store, "index", "*")))
    for e in entries[::3]:
        if fault.startswith("garbled"):
            open(e, "wb").write(b"DJIX3" + os.urandom(40))
        else:
            os.remove(e)
    c = _check(fault, *_run(tmp_path, "run", store=store), reference)
    if fault.startswith("garbled"):
        assert c["bad_blocks"] > 0 and c["invalidated"] >= c["bad_blocks"]
    else:
        assert c["bad_blocks"] == 0  # the scheduler sees fewer hits; nothing bad is read


def test_full_disk_mid_run(tmp_path, reference, monkeypatch, caplog):
    """A full disk mid-run leaves blocks uncached and the run completes."""
    real, calls = PosixBackend.write, []

    def full_after_two(self, todo):
        calls.append(len(todo))
        if len(calls) > 2:
            raise OSError(errno.ENOSPC, "No space left on device (injected)")
        return real(self, todo)

    monkeypatch.setattr(PosixBackend, "write", full_after_two)
    with caplog.at_level(logging.WARNING, logger="kvstore.store"):
        c = _check("disk full mid-run (injected ENOSPC)", *_run(tmp_path, "full", store=str(tmp_path / "s")),
                   reference)
    assert c["write_failures"] == len(calls) - 2 > 0
    assert sum("KV store write failed (ENOSPC)" in r.getMessage() for r in caplog.records) == 1
    monkeypatch.undo()
    healed = _check("after the disk-full run", *_run(tmp_path, "after", store=str(tmp_path / "s")), reference)
    assert healed["write_failures"] == 0 and healed["hit_rate"] > c["hit_rate"]


def test_budget_below_working_set(tmp_path, reference):
    """A budget below the working set evicts and stays exact."""
    c = _check("store budget 0.1 MB (< working set)",
               *_run(tmp_path, "budget", store=str(tmp_path / "s"), store_gb=0.0001), reference)
    assert c["evicted"] > 0 and c["write_failures"] == 0
    held = sum(os.path.getsize(f) for f in _data_files(str(tmp_path / "s")))
    assert held <= 0.0001e9 * 1.1  # segment files carry a small shard index besides their blocks


def test_slow_storage_nic(tmp_path, filled, reference):
    """A slow storage NIC changes timing, not tokens."""
    store = _copy(filled, tmp_path)
    c = _check("slow storage NIC (2 MB/s)", *_run(tmp_path, "slow", store=store, snic_mbps=2.0), reference)
    assert c["blocks_read"] > 0 and c["bad_blocks"] == 0


def _cli(out, *extra, **kw):
    return subprocess.Popen([sys.executable, "-m", "dualjax.cli.main", "run", *ARGV, "--out", str(out), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, **kw)


def _wait_for(pattern, proc, timeout=240):
    t0 = time.time()
    while not glob.glob(pattern):
        assert proc.poll() is None and time.time() - t0 < timeout, "the run ended before writing its store"
        time.sleep(0.1)


@pytest.mark.slow
def test_kill_9_then_reuse(tmp_path, reference):
    """A run killed with -9 mid-run leaves a store the next run reuses."""
    store = tmp_path / "store"
    proc = _cli(tmp_path / "killed", "--embedded", "--store", str(store))
    _wait_for(str(store / "index" / "*"), proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    c = _check("kill -9 mid-run, store reused", *_run(tmp_path, "reuse", store=str(store)), reference)
    assert c["blocks_read"] > 0 and c["bad_blocks"] == 0


@pytest.mark.slow
def test_two_runs_share_one_store(tmp_path, reference):
    store = str(tmp_path / "store")
    procs = [_cli(tmp_path / f"run{i}", "--embedded", "--store", store) for i in range(2)]
    for p in procs:
        assert p.wait(timeout=600) == 0, p.stderr.read()[-2000:]
    reports = [json.load(open(tmp_path / f"run{i}" / "report.json")) for i in range(2)]
    for i, r in enumerate(reports):
        _check(f"two runs on one store (run {i})", r, tokens_of(str(tmp_path / f"run{i}")), reference)
        assert r["store"]["bad_blocks"] == 0 and r["store"]["write_failures"] == 0


@pytest.mark.slow
def test_real_full_filesystem(tmp_path, reference):
    """A 192 KiB tmpfs (user namespace) holds ~5 tiny blocks; the run needs more. (A storage NIC
    cap skips the start-up read profile, which writes its own scratch blocks beside the store.)"""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if not shutil.which("unshare") or subprocess.run(
            ["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=64k none {mnt}"], capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs in a user namespace here")
    out = tmp_path / "out"
    cmd = (f'mount -t tmpfs -o size=192k none {mnt} && "{sys.executable}" -m dualjax.cli.main run '
           + " ".join(ARGV) + f" --embedded --store {mnt}/store --store-gb 1 --snic-mbps 1000 --out {out}")
    proc = subprocess.run(["unshare", "-rm", "sh", "-c", cmd], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    c = _check("disk full mid-run (192 KiB tmpfs)", json.load(open(out / "report.json")), tokens_of(str(out)),
               reference)
    assert c["write_failures"] > 0 and proc.stderr.count("KV store write failed (ENOSPC)") == 1


@pytest.mark.slow
def test_kill_9_of_mpi_rank(tmp_path):
    """kill -9 of one MPI rank ends the job within seconds."""
    proc = _cli(tmp_path / "mpi", "--cluster", "1p1d", "--agents", "3", "--turns", "4", "--store",
                str(tmp_path / "store"), env={**os.environ, "DUALJAX_FAULT_TEST": str(tmp_path)},
                start_new_session=True)
    _wait_for(str(tmp_path / "store" / "index" / "*"), proc)
    ranks = {}
    for d in glob.glob("/proc/[0-9]*"):
        try:
            env = open(os.path.join(d, "environ"), "rb").read().split(b"\0")
        except OSError:
            continue
        if f"DUALJAX_FAULT_TEST={tmp_path}".encode() in env:
            ranks.update({int(e[9:]): int(d[6:]) for e in env if e.startswith(b"PMI_RANK=")})
    t0 = time.time()
    os.kill(ranks[1], signal.SIGKILL)
    try:
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0 and time.time() - t0 < 30
    assert "a host failed" in err


def test_the_embedded_runtime_ends_in_one_line_and_keeps_the_traceback(tmp_path, capsys):
    """A policy that raises while rank 0 places requests: one line naming the policy, the request and the
    author's line, exit 2, and the traceback kept in the run's failure file."""
    from dualjax.cli import main as cli
    out = tmp_path / "run"
    rc = cli.main(["run", "--embedded", "--quiet", "--cluster", "1p1d", "--model", "tiny", "--workload",
                   "agentic-tiny", "--agents", "2", "--turns", "2", "--policy",
                   "tests.dualjax.core.custom_policy:Raises", "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err and "raised KeyError at custom_policy.py:24 in path for request" in err
    assert "custom_policy.py" in (out / "failed-rank0.txt").read_text() and str(out / "failed-rank0.txt") in err
