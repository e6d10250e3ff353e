"""Recorded agentic sessions (`sessions:PATH[:LIMIT[:LENGTH_SCALE]]`), on small sessions built here: equal
hash ids are equal tokens and sessions share nothing; an unreadable file is refused with its place, an
odd request follows its rule (counted); a real run gives the no-store reference's tokens; the simulator
replays the trace's own hits and pauses. The public traces' statistics are checked when they are present."""

import json
import os

import numpy as np
import pytest

from dualjax.core.config import ClusterSpec, RunConfig, SimConfig
from dualjax.core.sessions import (
    Session,
    SessionError,
    SessionSpec,
    load_sessions,
    session_hits,
    session_prompts,
    session_table,
    turn_shape,
)
from dualjax.core.workload import TRACE_SHAPE, WorkloadError, load_workload
from dualjax.runtime.cluster.runner import run_embedded
from dualjax.runtime.verify import tokens_of
from dualjax.sim import simulate
from kvstore import BlockLayout, block_chain
from tests.dualjax.core.trace_fixtures import session_requests, two_sessions, write_session

# the public traces (outside the repository): beside the checkout, or where DUALJAX_TRACES says
TRACES = os.path.join(os.environ.get("DUALJAX_TRACES", os.path.join(os.path.dirname(__file__), *[".."] * 4, "shared",
                                                                    "traces")), "agentic-coding")


@pytest.fixture(scope="module")
def two(tmp_path_factory):
    """A directory with two short sessions (4 and 8 requests), one gzipped and one plain JSON."""
    return two_sessions(str(tmp_path_factory.mktemp("sessions")))


@pytest.mark.skipif(not os.path.isdir(TRACES), reason="the public agentic-coding traces are not on this machine")
def test_the_30_public_sessions_give_their_published_statistics():
    sessions = load_sessions(TRACES)
    assert len(sessions) == 30 and sum(len(s.inputs) for s in sessions) == 1854
    prompt, hit = map(np.concatenate, zip(*(session_hits(s) for s in sessions)))
    assert abs(hit.sum() / prompt.sum() - 0.959) < 5e-4  # token hit, unbounded, 64-token blocks
    hashed = np.concatenate([[s.block * len(ids) for ids in s.ids] for s in sessions])
    assert round(prompt.mean()) == 134_521  # README's "new tokens" (p50 576, mean 5,541) leave out the unhashed tail
    assert np.median(hashed - hit) == 576 and round((hashed - hit).mean()) == 5_541
    pauses = np.concatenate([s.pauses[1:] for s in sessions])  # tool/user time: p50 12 s, up to 11 h
    assert np.median(prompt) == 109_090 and np.median(pauses) == 12 and pauses.min() >= 0
    assert session_table(_spec(TRACES)).trace_hit_rate == pytest.approx(hit.sum() / prompt.sum())


@pytest.mark.skipif(not os.path.isdir(TRACES), reason="the public agentic-coding traces are not on this machine")
def test_the_joint_presets_take_the_public_sessions_shape():
    """`TRACE_SHAPE` (the paper-*-N presets' turn_power and agent_spread) is what the 30 sessions give."""
    shape = turn_shape(load_sessions(TRACES))
    assert shape["sessions"] == 30 and (round(shape["power"], 3), round(shape["spread"], 3)) == TRACE_SHAPE
    assert shape["pearson"] < -0.7  # long sessions have short turns


def test_turn_shape_recovers_a_power_law_by_hand():
    # growth per turn 6,400 / sqrt(N): 3,200 at N = 4, 1,600 at 16, 800 at 64 (power 0.5, no residual)
    def session(n, growth):
        inputs = 1000 + growth * np.arange(n)
        return Session(f"s{n}", 64, inputs, np.ones(n, np.int64), (np.zeros(0, np.int64),) * n, np.zeros(n),
                       np.zeros(n))
    shape = turn_shape((session(4, 3200), session(16, 1600), session(64, 800), session(1, 5)))
    assert shape["sessions"] == 3 and shape["power"] == pytest.approx(0.5) and shape["pearson"] == pytest.approx(-1)
    assert shape["spread"] == pytest.approx(0, abs=1e-9) and shape["turns_mean"] == 28
    with pytest.raises(SessionError, match="at least 3 sessions"):
        turn_shape((session(4, 3200), session(16, 1600)))


def _spec(path, limit=None, scale=1.0):
    return SessionSpec(path, limit, scale)


def test_equal_ids_are_equal_tokens_and_sessions_share_nothing(two):
    a, b = load_sessions(two)
    layout = BlockLayout(n_layers=1, record_shape=(2, 1, 8), format="m", block_tokens=16)
    pa, pb, pa1 = (session_prompts(s, c, 256, scale=0.25) for s, c in ((a, 0), (b, 0), (a, 1)))
    _, hits = session_hits(a, 0.25)
    assert [len(p) for p in pa] == session_hits(a, 0.25)[0].tolist()
    for k in range(1, len(pa)):  # the trace's hit blocks (16 tokens at scale 1/4) are the earlier prompt's
        n = hits[k] // 16
        assert n > 0 and np.array_equal(pa[k][:hits[k]], pa[k - 1][:hits[k]])
        assert [x.hash for x in block_chain(pa[k], layout)[:n]] == [x.hash for x in block_chain(pa[k - 1], layout)[:n]]
        assert not np.array_equal(pa[k][hits[k]:hits[k] + 16], pa[k - 1][hits[k]:hits[k] + 16])
    chains = [{x.hash for p in ps for x in block_chain(p, layout)} for ps in (pa, pb, pa1)]
    assert not chains[0] & chains[1] and not chains[0] & chains[2]  # other session, other copy: nothing shared


def _write(tmp_path, text, name="bad.json"):
    path = tmp_path / name
    path.write_text(text)
    return f"sessions:{path}"


def _ok():
    return {"t": 0.0, "in": 130, "out": 5, "hash_ids": [1, 2], "think_time": 0.0}


@pytest.mark.parametrize("body,reason", [
    ('{"requests": [\n  {"t": 0,, }]}', r"bad.json:2:\d+: not JSON"),
    (json.dumps({"requests": []}), "non-empty list 'requests'"),
    (json.dumps([_ok()]), "non-empty list 'requests'"),
    (json.dumps({"block_size": 0, "requests": [_ok()]}), "block_size must be a positive integer"),
    (json.dumps({"requests": [{**_ok(), "in": 0}, {**_ok(), "hash_ids": "x"}]}), "no replayable request"),
])
def test_an_unreadable_session_file_is_refused_with_its_place(tmp_path, body, reason):
    with pytest.raises(WorkloadError, match=reason):
        load_workload(_write(tmp_path, body), 256)


ODD = [  # (a request as recorded, the rule it follows)
    ({"in": 73183, "out": 0}, "zero_output"),  # generated nothing: generates one token
    ({"in": 0}, "skipped"), ({"out": -1}, "skipped"), ({"hash_ids": [1, 2, 3, 4]}, "skipped"),
    ({"hash_ids": [1, -2]}, "skipped"), ({"in": None}, "skipped"),
    ({"think_time": -3.0}, "bad_pause"), ({"think_time": "soon"}, "bad_pause"),
    ({"t": -1.0}, "bad_time"), ({"t": None}, "bad_time"),
]


@pytest.mark.parametrize("change,rule", ODD)
def test_an_odd_request_follows_its_rule_and_its_session_goes_on(tmp_path, change, rule):
    requests = session_requests(3, seed=3, first_in=1000, append=200, out=20)
    odd = {k: v for k, v in {**requests[1], **change}.items() if v is not None}
    if "in" in change and change["in"]:
        odd["hash_ids"] = odd["hash_ids"] + list(range(2000, 2000 + change["in"] // 64 - len(odd["hash_ids"])))
    path = write_session(str(tmp_path / "s.json"), [requests[0], odd, requests[2]])
    table = session_table(_spec(path))
    assert table.odd[rule] == 1 and sum(table.odd.values()) == 1
    assert len(table.prompt[0]) == (2 if rule == "skipped" else 3)  # the session goes on after a skipped request
    if rule == "zero_output":
        assert table.gen[0][1] == 1 and table.prompt[0][1] == 73183
    (s,) = load_sessions(path)
    if rule == "bad_pause":  # the recorded gap less the previous response time
        assert s.pauses[1] == pytest.approx(requests[1]["t"] - requests[0]["t"] - requests[0]["api_time"])
    elif rule == "bad_time":  # its recorded think time still holds
        assert s.pauses[1] == requests[1]["think_time"] > 0


def test_odd_records_are_counted_alike_in_a_real_run_and_in_the_simulator(tmp_path):
    requests = session_requests(3, seed=4, first_in=1000, append=200, out=20)
    path = write_session(str(tmp_path / "s.json"), [requests[0], {**requests[1], "out": 0}, {"in": 5}, requests[2]])
    spec = f"sessions:{path}"
    real = run_embedded(RunConfig(ClusterSpec(1, 1), model="tiny", workload=spec, block_tokens=16,
                                  out=str(tmp_path / "run")), progress=False)
    sim = simulate(SimConfig(ClusterSpec(2, 4), workload=spec), progress=False)
    for report in (real, sim):
        assert report["requests"] == 3 and report["generated_tokens"] == 1 + requests[0]["out"] + requests[2]["out"]
        assert report["workload"]["odd_records"] == {**dict.fromkeys(report["workload"]["odd_records"], 0),
                                                     "zero_output": 1, "skipped": 1}


def test_bad_specs_and_gzip_are_rejected(tmp_path):
    (tmp_path / "x.json.gz").write_bytes(b"not gzip")
    with pytest.raises(WorkloadError, match="x.json.gz: cannot read"):
        load_workload(f"sessions:{tmp_path / 'x.json.gz'}", 256)
    for spec, reason in ((f"sessions:{tmp_path}/none", "no such file"), (f"sessions:{tmp_path}:0", "LIMIT"),
                         (f"sessions:{tmp_path}:1:2.0", "LENGTH_SCALE")):
        with pytest.raises(WorkloadError, match=reason):
            load_workload(spec, 256)


def test_pauses_are_recorded_or_zero_and_extra_agents_are_sampled_copies(two):
    (a, b), spec = load_sessions(two), _spec(two)
    recorded = session_table(spec, think_time="recorded")
    assert np.array_equal(recorded.pause[0], a.pauses) and a.pauses[0] == 0 and a.pauses[1:].min() > 0
    assert not any(p.any() for p in session_table(spec, think_time="zero").pause)
    agents = load_workload(f"sessions:{two}::0.01", 256, agents=5, think_time="0.5")
    assert [len(x.turns) for x in agents[:2]] == [len(a.inputs), len(b.inputs)]
    assert agents[0].turns[1].pause_s == pytest.approx(0.5 * a.pauses[1])
    assert [x.start for x in agents[:2]] == [0, 0] and all(x.start > 0 for x in agents[2:])
    same = [x for x in agents[2:] if len(x.turns) == len(agents[0].turns)]  # a copy: same lengths, other tokens
    assert same and len(same[0].turns[2].prompt) == len(agents[0].turns[2].prompt)
    assert not np.array_equal(same[0].turns[2].prompt, agents[0].turns[2].prompt)


def test_an_embedded_run_gives_the_reference_tokens_and_states_the_trace_hit_rate(tmp_path, two):
    base = RunConfig(ClusterSpec(1, 1), model="tiny", workload=f"sessions:{two}::0.01", block_tokens=16)
    ref = run_embedded(base.replace(out=str(tmp_path / "ref"), use_store=False), progress=False)
    report = run_embedded(base.replace(out=str(tmp_path / "run")), progress=False)
    assert tokens_of(str(tmp_path / "run")) == tokens_of(str(tmp_path / "ref"))
    assert ref["requests"] == report["requests"] == 12 and ref["hit_rate"] == 0
    # scale 1/100: trace blocks of 1 token; the store hits whole 16-token blocks of the trace's hits
    w = report["workload"]
    assert report["hit_rate"] == pytest.approx(w["trace_hit_rate_at_block"])
    assert 0.5 < w["trace_hit_rate_at_block"] < w["trace_hit_rate"] < 0.9 and w["trace_hit_gap"]


def test_the_simulator_replays_the_sessions_hits_and_pauses(two):
    cfg = SimConfig(ClusterSpec(2, 4), workload=f"sessions:{two}", agents=6)
    zero = simulate(cfg, progress=False)
    tab = session_table(_spec(two), 6)
    assert zero["requests"] == sum(len(p) for p in tab.prompt)
    assert zero["prompt_tokens"] == sum(p.sum() for p in tab.prompt)
    w = zero["workload"]
    assert zero["hit_rate"] == pytest.approx(w["trace_hit_rate_at_block"]) and w["trace_hit_rate"] > 0.7
    recorded = simulate(cfg.replace(think_time="recorded"), progress=False)
    longest = max(p.sum() for p in session_table(_spec(two), 6, think_time="recorded").pause)
    assert recorded["jct_s"] > longest > zero["jct_s"]


def test_a_session_ends_before_a_request_longer_than_the_model_context(two):
    loaded, spec = load_sessions(two), _spec(two)
    cap = int(np.median(np.concatenate([session_hits(s)[0] + s.outputs for s in loaded])))
    table = session_table(spec, max_len=cap)
    for i, p, g in zip(table.session, table.prompt, table.gen):
        full = session_hits(loaded[i])[0] + loaded[i].outputs
        assert len(p) == (np.argmax(full > cap) if (full > cap).any() else len(full)) and (p + g <= cap).all()
    assert table.odd["beyond_context"] == sum(len(s.inputs) for s in loaded) - sum(len(p) for p in table.prompt) > 0
    with pytest.raises(WorkloadError, match="no session's first request fits"):
        load_workload(f"sessions:{two}", 256, max_len=100)
