"""The DeepSeek family through the whole runtime: both read paths, layerwise and Basic, give the
tokens of the no-store reference (the store, the relay and decode carry its latent + indexer records)."""

import pytest

from dualjax.core.config import ClusterSpec, RunConfig
from dualjax.runtime.cluster.runner import run_embedded
from dualjax.runtime.verify import tokens_of

BASE = RunConfig(ClusterSpec(1, 1), model="deepseek-tiny", workload="agentic-tiny", agents=3, turns=3)


def _run(tmp_path, name, **changes):
    cfg = BASE.replace(out=str(tmp_path / name), **changes)
    return run_embedded(cfg, progress=False), tokens_of(cfg.out)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("ref"), "reference", use_store=False)[1]


@pytest.mark.parametrize("policy,layerwise", [("pe-only", True), ("de-only", True), ("basic", None)])
def test_deepseek_tokens_equal_the_reference(tmp_path, reference, policy, layerwise):
    report, tokens = _run(tmp_path, "run", policy=policy, layerwise=layerwise)
    assert tokens == reference
    assert report["hit_rate"] > 0.3  # later turns read their prefix records from the store
    if policy == "de-only":
        assert report["relay_bytes"] > 0
