"""Plans in the runtime: whatever the split of a request's hit blocks between the two hosts and whatever
tail of them is recomputed, layerwise or Basic, embedded or under mpiexec, for both model families (GQA
and DeepSeek's MLA), the generated tokens equal those of a reference that keeps no store; the DE writes
back only blocks the store lacks."""

import glob
import os
import subprocess
import sys

import pytest

import kvstore
import models
from dualjax.core.config import ClusterSpec, RunConfig
from dualjax.core.policies import Plan, Policy
from dualjax.runtime.cluster.runner import run_embedded
from dualjax.runtime.verify import plans_of, tokens_of
from tests.dualjax.runtime.test_faults import _flip
from tests.dualjax.runtime.test_runtime import REPO

# one agent, three turns: turn 1 has 2 hit blocks, turn 2 has 3 (agentic-tiny, 64-token blocks)
BASE = RunConfig(ClusterSpec(1, 1), model="tiny", workload="agentic-tiny", agents=1, turns=3)


class Every(Policy):
    """The same plan for every request, cut to its hit blocks: the DE reads `de` blocks, `tail` are recomputed
    (None: all of them)."""
    name = "every"

    def __init__(self, de: int = 0, tail: int | None = 0):
        self.de, self.tail = de, tail

    def path(self, request, pe, de):
        T, k = request.block_tokens, request.hit_tokens // request.block_tokens
        tail = k if self.tail is None else min(self.tail, k)
        return Plan(de_tokens=min(self.de, k - tail) * T, recompute_tokens=tail * T)


class SplitAndRecompute(Every):
    """For `--policy` (constructed without arguments): turn 1 the DE reads 1 block, 1 recomputed; turn 2 a
    split (1 block on each side), 1 recomputed."""
    name = "split-and-recompute"

    def __init__(self):
        super().__init__(de=1, tail=1)


def _run(tmp_path, name, policy, model, **changes):
    cfg = BASE.replace(out=str(tmp_path / name), model=model, **changes)
    report = run_embedded(cfg, progress=False, policy=policy)
    return report, tokens_of(cfg.out)


@pytest.fixture(scope="module", params=[f.tiny_preset for f in models.families()])
def model(request):
    return request.param


@pytest.fixture(scope="module")
def reference(tmp_path_factory, model):
    return _run(tmp_path_factory.mktemp("ref"), "reference", None, model, use_store=False)[1]


@pytest.mark.parametrize("de", [0, 1, 2, 3])
def test_every_split_boundary_gives_the_reference_tokens(tmp_path, model, reference, de):
    report, tokens = _run(tmp_path, "split", Every(de=de), model)
    assert tokens == reference
    t = plans_of(str(tmp_path / "split"), BASE.block_tokens)
    assert t["de_blocks"] == {2: [min(de, 2)], 3: [de]}  # both turns split as asked: every boundary of turn 2
    assert (report["relay_bytes"] > 0) == (de > 0)


@pytest.mark.parametrize("layerwise,de,tail", [(True, 0, 1), (True, 1, 1), (True, 0, None), (False, 1, 1),
                                               (False, 0, None)])
def test_recomputed_tails_give_the_reference_tokens(tmp_path, model, reference, layerwise, de, tail):
    _, tokens = _run(tmp_path, "recompute", Every(de=de, tail=tail), model, layerwise=layerwise)
    assert tokens == reference
    assert plans_of(str(tmp_path / "recompute"), BASE.block_tokens)["recomputed_blocks"] == (
        {2: [2], 3: [3]} if tail is None else {2: [1], 3: [1]})


def test_write_back_skips_the_blocks_the_store_holds(tmp_path, model, reference, monkeypatch):
    """A recomputed tail is in the store already: the DE does not hand it to the store again."""
    handed, cache = [], kvstore.BlockStore.cache

    def counting(store, ids, blocks):
        handed.append(sum(store.contains(b.hash) for b in ids))
        return cache(store, ids, blocks)
    monkeypatch.setattr(kvstore.BlockStore, "cache", counting)
    report, tokens = _run(tmp_path, "all", Every(tail=None), model)
    assert tokens == reference and handed and not any(handed)
    pe_only, _ = _run(tmp_path, "pe", Every(), model)
    written = lambda r: sum(h["bytes_written"] for h in r["hosts"])  # noqa: E731
    assert written(report) == written(pe_only) > 0 and report["store"]["blocks_read"] == 0


@pytest.mark.parametrize("layerwise", [True, False])
def test_bad_blocks_in_a_split_restart_to_the_reference_tokens(tmp_path, model, reference, layerwise):
    """Corrupt blocks in either side's share: the prefill restarts with the good leading blocks."""
    store = str(tmp_path / "store")
    _run(tmp_path, "fill", Every(), model, store=store)
    for f in glob.glob(os.path.join(store, "data", "*")):
        if not f.endswith("zarr.json"):
            _flip(f)
    report, tokens = _run(tmp_path, "split", Every(de=1, tail=1), model, store=store, layerwise=layerwise)
    assert tokens == reference and report["restarts"] > 0 and report["store"]["bad_blocks"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("model,layerwise", [("tiny", "--layerwise"), ("deepseek-tiny", "--no-layerwise")],
                         indirect=["model"])
def test_plans_under_mpiexec(tmp_path, model, reference, layerwise):
    """`dualjax run` under its own mpiexec on 1P2D, a split plan and a recomputed tail: the reference tokens."""
    out = tmp_path / "mpi"
    argv = ["run", "--cluster", "1p2d", "--model", model, "--agents", "1", "--turns", "3", "--quiet", "--out",
            str(out), layerwise, "--policy", f"{__name__}:SplitAndRecompute"]
    proc = subprocess.run([sys.executable, "-m", "dualjax.cli.main", *argv], capture_output=True, text=True,
                          timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert tokens_of(str(out)) == reference
    assert plans_of(str(out), BASE.block_tokens)["paths"] == {"pe": 1, "de": 1, "split": 1}
