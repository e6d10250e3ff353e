"""A run's store, as a user meets it: a store whose own metadata a crash or a full disk damaged
never stops a run (it completes, the report counts the recovery, one line says it), and every
store error the CLI prints is one short line."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from dualjax.cli import main as cli
from dualjax.runtime.verify import tokens_of

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
RUN = ["run", "--embedded", "--cluster", "1p1d", "--model", "tiny", "--workload", "agentic-tiny", "--agents", "2",
       "--turns", "2", "--quiet"]


@pytest.mark.slow
def test_a_run_on_a_store_with_damaged_metadata_completes_counts_it_and_says_so_once(tmp_path):
    out = tmp_path / "run"

    def run():
        proc = subprocess.run([sys.executable, "-m", "dualjax.cli.main", *RUN, "--out", str(out)], cwd=REPO,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return proc.stderr, json.load(open(out / "report.json")), tokens_of(str(out))

    _, first, tokens = run()
    store = out / "store"
    os.truncate(store / "data" / "zarr.json", 10)  # as a crash or a full disk leaves it
    os.truncate(store / "dualjax_store.json", 20)
    stderr, report, again = run()
    said = [line for line in stderr.splitlines() if "KV store" in line]
    assert len(said) == 1 and "recovered" in said[0] and len(said[0]) < 400, stderr
    assert report["store"]["recovered"] == 1 and report["store"]["bad_blocks"] == 0
    assert report["hit_rate"] > first["hit_rate"]  # the blocks survived the repair
    assert again == tokens


def test_a_store_that_cannot_be_opened_is_one_short_line(tmp_path, capsys):
    store = tmp_path / "store"
    (store / "index").parent.mkdir()
    (store / "dualjax_store.json").write_text("{}")
    (store / "index").write_text("a file where the index directory belongs")
    shutil.copy(store / "dualjax_store.json", store / "data")  # and a file where data/ belongs
    rc = cli.main([*RUN, "--out", str(tmp_path / "run"), "--store", str(store)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and len(err) < 300 and "tensorstore_spec" not in err, err
