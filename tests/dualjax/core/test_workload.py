"""Workloads: presets, trajectory files (bad lines rejected with their line number), Mooncake
replay (shared hash ids share blocks), online arrivals."""

import json
import os

import numpy as np
import pytest

from dualjax.core.workload import (
    PAPER_TABLE,
    WorkloadError,
    agents_for,
    get_workload,
    length_stats,
    load_trajectories,
    load_workload,
    mooncake_trace,
    trajectory,
    turn_lengths,
)
from kvstore import BlockLayout, block_chain

TRACE = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "shared", "traces", "mooncake",
                     "arxiv_mooncake_trace_first1000.jsonl")


def test_presets_are_deterministic_and_unshared():
    spec = get_workload("paper-64k")
    a, b = trajectory(spec, 3, 1000, seed=1), trajectory(spec, 3, 1000, seed=1)
    assert all(np.array_equal(x.append, y.append) and x.gen_len == y.gen_len for x, y in zip(a, b))
    other = trajectory(spec, 4, 1000, seed=1)  # unique first rounds: no prefix shared across agents
    assert not np.array_equal(a[0].append[:64], other[0].append[:64])
    with pytest.raises(WorkloadError, match="agentic-tiny"):
        get_workload("nope")


@pytest.mark.parametrize("name", sorted(PAPER_TABLE))
def test_paper_presets_reproduce_table_2_and_respect_maxlen(name):
    # docs/paper.md §9 Table 2: append, gen, total and the request-weighted mean context within 5%, and
    # no trajectory longer than MaxLen (the reference: the table's numbers and its MaxLen).
    spec = get_workload(name, agents=512)
    lengths = [turn_lengths(spec, a) for a in range(spec.agents)]
    s = length_stats(lengths)
    for key, target in zip(("append_mean", "gen_mean", "total_mean", "context_mean"), PAPER_TABLE[name]):
        assert abs(s[key] / target - 1) < 0.05, (key, s[key], target)
    assert s["max_total"] <= spec.max_len and s["turns_mean"] < spec.turns  # truncation cuts the table's turns
    assert all(int(a.sum() + g.sum()) <= spec.max_len for a, g in lengths)


def test_length_stats_by_hand():
    # one agent: (append, gen) = (10, 2), (3, 1): prompts 10 and 15, total 16
    s = length_stats([(np.array([10, 3]), np.array([2, 1])), (np.array([4]), np.array([4]))])
    assert s == {"agents": 2, "requests": 3, "turns_mean": 1.5, "append_mean": 17 / 3, "gen_mean": 7 / 3,
                 "total_mean": 12.0, "context_mean": (10 + 15 + 4) / 3, "max_total": 16}


def test_workload_stats_cli(tmp_path):
    from dualjax.cli.main import main
    js = tmp_path / "w.json"
    assert main(["workload", "stats", "paper-32k", "--agents", "64", "--json", str(js)]) == 0
    r = json.loads(js.read_text())
    for key in ("agents", "turns_mean", "append_mean", "gen_mean", "total_mean", "context_mean", "max_total"):
        assert r[key] > 0, key
    assert r["agents"] == 64 and r["max_total"] <= 32_768


def test_online_arrivals_are_poisson_at_the_given_rate():
    agents = agents_for(get_workload("agentic-tiny", agents=400), 256, aps=20.0)
    starts = np.array([a.start for a in agents])
    assert np.all(np.diff(starts) >= 0) and abs(len(starts) / starts[-1] / 20.0 - 1) < 0.15
    assert all(a.start == 0 for a in agents_for(get_workload("agentic-tiny"), 256))


def test_trajectory_file_round_trip(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"start": 1.5, "turns": [{"append": [1, 2, 3], "gen": 4}, {"append_len": 7, "gen": 2}]})
                    + "\n\n" + json.dumps({"turns": [{"append_len": 5, "gen": 1}]}) + "\n")
    agents = load_trajectories(str(path), vocab=100)
    assert [a.start for a in agents] == [1.5, 0.0]
    assert agents[0].turns[0].append.tolist() == [1, 2, 3] and len(agents[0].turns[1].append) == 7
    assert load_workload(str(path), 100)[1].turns[0].gen_len == 1


@pytest.mark.parametrize("line,reason", [
    ("not json", "Expecting value"),
    (json.dumps({"turns": []}), "non-empty list 'turns'"),
    (json.dumps({"turns": [{"append": [1, 500], "gen": 1}]}), "outside the vocabulary"),
    (json.dumps({"turns": [{"append_len": 3, "gen": 0}]}), "'gen' must be an integer >= 1"),
    (json.dumps({"turns": [{"gen": 3}]}), "needs 'append'"),
    (json.dumps({"start": -1, "turns": [{"append_len": 3, "gen": 1}]}), "must be >= 0"),
])
def test_a_bad_trajectory_line_is_rejected_with_its_number(tmp_path, line, reason):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"turns": [{"append_len": 3, "gen": 1}]}) + "\n" + line + "\n")
    with pytest.raises(WorkloadError, match=rf"bad.jsonl:2: .*{reason}"):
        load_trajectories(str(path), vocab=100)


def test_mooncake_replay_shares_prefix_blocks_and_spreads_ticks():
    agents = mooncake_trace(TRACE, vocab=1000, limit=200)
    layout = BlockLayout(n_layers=1, record_shape=(2, 1, 8), format="m", block_tokens=64)
    raw = [json.loads(line) for line in open(TRACE)][:200]
    by_len = {len(a.turns[0].append) for a in agents}
    assert {r["input_length"] for r in raw} == by_len
    # Two requests sharing their 12 leading hash ids share 12 * 512 / 64 = 96 leading blocks.
    pairs = [(i, j) for i in range(len(raw)) for j in range(i + 1, len(raw))
             if raw[i]["hash_ids"][:12] == raw[j]["hash_ids"][:12] and len(raw[i]["hash_ids"]) > 12
             and len(raw[j]["hash_ids"]) > 12][:1]
    assert pairs
    i, j = pairs[0]
    ti = next(a for a in agents if len(a.turns[0].append) == raw[i]["input_length"])
    tj = next(a for a in agents if len(a.turns[0].append) == raw[j]["input_length"])
    ci, cj = block_chain(ti.turns[0].append, layout), block_chain(tj.turns[0].append, layout)
    assert [b.hash for b in ci[:96]] == [b.hash for b in cj[:96]]
    starts = np.array([a.start for a in agents])
    assert np.all(np.diff(starts) >= 0)  # sorted by arrival
    assert len(set(np.round(starts, 3))) > len({r["timestamp"] for r in raw})  # spread inside ticks
