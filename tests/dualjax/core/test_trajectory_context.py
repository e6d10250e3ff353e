"""A trajectory file whose turn is longer than the model's context is refused at load, in one line
naming the file, the agent, the turn and the limit (exit 2, before any work): such a request could
never fit a decode slot and a run would wait for it forever."""

import json
import time

import pytest

from dualjax.cli import main as cli
from dualjax.core.workload import WorkloadError, load_trajectories, load_workload


def _write(path, *agents):
    path.write_text("".join(json.dumps(a) + "\n" for a in agents))
    return str(path)


def test_the_first_turn_past_the_context_is_named_and_one_that_fits_loads(tmp_path):
    # agent 1's contexts: 60 + 4 = 64, then 64 + 30 + 6 = 100 (prompt 94 + gen 6): fits 100, not 99
    path = _write(tmp_path / "t.jsonl", {"turns": [{"append_len": 5, "gen": 1}]},
                  {"turns": [{"append_len": 60, "gen": 4}, {"append_len": 30, "gen": 6}]})
    assert len(load_trajectories(path, vocab=100, max_len=100)) == 2
    assert len(load_workload(path, vocab=100, max_len=100)) == 2
    for load in (load_trajectories, load_workload):
        with pytest.raises(WorkloadError, match=r"t\.jsonl:2: agent 1 turn 1: prompt 94 \+ generation 6 = 100 "
                                                r"tokens exceed the model's context of 99 tokens"):
            load(path, vocab=100, max_len=99)
    assert len(load_trajectories(path, vocab=100)) == 2  # no limit given: nothing to check against


def test_dualjax_run_refuses_it_before_any_work(tmp_path, capsys):
    """The file of issue 59 with `--model tiny` (4,096 tokens): exit 2, one line, no run directory."""
    path = _write(tmp_path / "long.jsonl", {"turns": [{"append_len": 100000, "gen": 3}]})
    t0 = time.perf_counter()
    rc = cli.main(["run", "--embedded", "--quiet", "--model", "tiny", "--workload", path,
                   "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert f"{path}:1: agent 0 turn 0: prompt 100000 + generation 3" in err and "context of 4096 tokens" in err
    assert time.perf_counter() - t0 < 30 and not (tmp_path / "run" / "report.json").exists()


def test_dualjax_sim_refuses_it_before_any_work(tmp_path, capsys):
    """The simulator refuses the same file in the same line (it replays its lengths on a model's context)."""
    path = _write(tmp_path / "long.jsonl", {"turns": [{"append_len": 100000, "gen": 3}]})
    rc = cli.main(["sim", "--quiet", "--model", "tiny", "--workload", path, "--out", str(tmp_path / "sim")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and f"{path}:1: agent 0 turn 0" in err and "context of 4096 tokens" in err, err
