"""Workloads: presets, trajectory files (bad lines rejected with their line number), Mooncake
replay (shared hash ids share blocks), online arrivals."""

import json
import os

import numpy as np
import pytest

from dualjax.core.workload import (
    WorkloadError,
    agents_for,
    get_workload,
    load_trajectories,
    load_workload,
    mooncake_trace,
    trajectory,
)
from kvstore import BlockLayout, block_chain

TRACE = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "traces", "mooncake",
                     "arxiv_mooncake_trace_first1000.jsonl")


def test_presets_follow_the_paper_table_and_are_deterministic():
    spec = get_workload("paper-64k")
    assert (spec.turns, spec.append, spec.gen) == (157, 429, 176)
    a, b = trajectory(spec, 3, 1000, seed=1), trajectory(spec, 3, 1000, seed=1)
    assert all(np.array_equal(x.append, y.append) and x.gen_len == y.gen_len for x, y in zip(a, b))
    means = np.mean([len(t.append) for t in a[1:]]), np.mean([t.gen_len for t in a])
    assert abs(means[0] / 429 - 1) < 0.15 and abs(means[1] / 176 - 1) < 0.15
    other = trajectory(spec, 4, 1000, seed=1)  # unique first rounds: no prefix shared across agents
    assert not np.array_equal(a[0].append[:64], other[0].append[:64])
    with pytest.raises(WorkloadError, match="agentic-tiny"):
        get_workload("nope")


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
