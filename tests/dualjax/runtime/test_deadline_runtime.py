"""Read deadlines in the runtime (`Plan.deadline_s`): a read that has not delivered its blocks by its
deadline is abandoned for the rest, on the PE's side or the DE's, and the PE recomputes them. Whenever
the deadline fires (before the read starts, during it, after its end) the tokens equal the reference's
(no store), no buffer stays held, no block stays pinned, and every block of the store reads back."""

import pytest

from dualjax.core.policies import Plan, Policy
from dualjax.outputs import load_run
from dualjax.runtime.cluster import runner
from dualjax.runtime.store import open_store
from tests.dualjax.runtime.test_plans_runtime import BASE, _run

# 1 MB/s: 32,768 B a block of `tiny`, 32.8 ms; turn 1 reads 2 hit blocks, turn 2 reads 3
SNIC_MBPS, BLOCK_S = 1.0, 32_768 / 1e6
WHEN = {"before": 0.0, "during": 1.5 * BLOCK_S, "after": 1e3}


class Deadline(Policy):
    """Every hit block read by one side, under a deadline."""
    name = "deadline"

    def __init__(self, side: str, deadline_s: float):
        self.side, self.deadline_s = side, deadline_s

    def path(self, request, pe, de):
        return Plan(de_tokens=request.hit_tokens if self.side == "de" else 0, deadline_s=self.deadline_s)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("ref"), "reference", None, "tiny", use_store=False)[1]


@pytest.mark.parametrize("side", ["pe", "de"])
@pytest.mark.parametrize("when", ["before", "during", "after"])
def test_an_abandoned_read_gives_the_reference_tokens_and_leaves_nothing_held(tmp_path, monkeypatch, reference,
                                                                             side, when):
    hosts, make = [], runner.make_host
    monkeypatch.setattr(runner, "make_host", lambda *a: hosts.append(make(*a)) or hosts[-1])
    _, tokens = _run(tmp_path, "run", Deadline(side, WHEN[when]), "tiny", snic_mbps=SNIC_MBPS)
    assert tokens == reference
    t = load_run(str(tmp_path / "run"), ["turn", "hit_tokens", "recomputed_tokens", "de_tokens"]).requests
    stored = t["hit_tokens"] + t["recomputed_tokens"]
    assert list(stored // 64) == [0, 2, 3]  # the blocks in the store, loaded or recomputed
    if when == "before":  # nothing read: every stored block recomputed
        assert list(t["hit_tokens"]) == [0, 0, 0]
    elif when == "after":  # everything read in time
        assert list(t["recomputed_tokens"]) == [0, 0, 0]
    else:  # 1.5 blocks' time: no read of 2 or 3 blocks ends in it, at most 1 block of each kept
        assert all(0 < r for r in t["recomputed_tokens"][1:]) and all(h <= 64 for h in t["hit_tokens"])
    if side == "de":
        assert list(t["de_tokens"]) == list(t["hit_tokens"])
    for h in hosts:  # every buffer given back, every pin released, nothing left queued at a NIC
        assert h.buffer.used == 0, h.role
        assert h.snic.read_queue() == (0, 0)
        assert not h.store._view.pins
    store = open_store(BASE.replace(out=str(tmp_path / "run")))
    hashes = store.hashes()
    assert hashes and all(r.result() is not None for r in store.get(hashes))  # every block reads back, verified


def _verify_runs(tmp_path, launcher):
    from dualjax.core.config import RunConfig
    from dualjax.runtime.verify import RUNS, deadlines_of, run_one
    base = RunConfig(BASE.cluster, model="tiny", workload="agentic-tiny", agents=3, turns=4)
    want = run_one(base.replace(use_store=False), "reference", "1p1d", "pe-only", True, "embedded", str(tmp_path))
    runs = [r for r in RUNS if r[0].startswith("deadlines-") and r[4] == launcher]
    assert runs
    for name, cluster, policy, layerwise, _ in runs:
        assert run_one(base, name, cluster, policy, layerwise, launcher, str(tmp_path)) == want, name
        kept = deadlines_of(str(tmp_path / name))
        assert kept["none"] and kept["part"] and kept["all"], kept  # fired before, during and after reads


def test_verify_deadline_runs_fire_before_during_and_after_reads_embedded(tmp_path):
    _verify_runs(tmp_path, "embedded")


@pytest.mark.slow
def test_verify_deadline_runs_fire_before_during_and_after_reads_under_mpiexec(tmp_path):
    _verify_runs(tmp_path, "mpiexec")
