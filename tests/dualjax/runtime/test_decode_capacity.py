"""Decode capacity comes from the workload's lengths alone: same slots as the materialised workload."""

import json

import pytest

import models
from dualjax.core import workload
from dualjax.core.config import RunConfig
from dualjax.runtime.decode_host import decode_capacity
from models.buckets import DEFAULT_BUCKETS


def _from_token_ids(cfg, model_cfg) -> int:
    """The capacity as computed before: the whole workload drawn, token ids and all."""
    agents = workload.load_workload(cfg.workload, model_cfg.vocab, cfg.workload_seed, cfg.agents, cfg.turns, cfg.aps)
    return min(DEFAULT_BUCKETS.prefix(workload.max_context(agents) + 1), model_cfg.max_seq_len)


@pytest.mark.parametrize("settings", [dict(), dict(workload="agentic-small"), dict(workload_seed=5, agents=3, turns=9),
                                      dict(workload="agentic-e2e", aps=2.0), dict(workload="paper-64k", agents=4)])
def test_capacity_from_lengths(settings, monkeypatch):
    """The workload's lengths give the capacity its token ids would, without drawing them."""
    cfg, model_cfg = RunConfig(**settings), models.get_config("small")
    want = _from_token_ids(cfg, model_cfg)
    monkeypatch.setattr(workload, "trajectory", lambda *a: pytest.fail("decode_capacity drew token ids"))
    assert decode_capacity(cfg, model_cfg) == want


def test_capacity_of_a_trajectory_file(tmp_path):
    path = tmp_path / "agents.jsonl"
    agent = {"turns": [{"append_len": 300, "gen": 20}, {"append": [1, 2, 3], "gen": 701}]}  # 1024 tokens
    path.write_text(json.dumps(agent) + "\n")
    cfg = RunConfig(workload=str(path))
    assert decode_capacity(cfg, models.get_config("small")) == DEFAULT_BUCKETS.prefix(1024 + 1) == 2048


@pytest.mark.parametrize("settings", [dict(workload="agentic-small", agents=4), dict(workload="paper-64k", agents=4)])
def test_the_simulator_sizes_slots_as_the_runtime(settings):
    """The simulator's decode slots hold what the runtime's hold for the same workload and model
    (`dualjax.core.lengths.decode_capacity`): paper-64k's longest agent passes `small`'s 32K context,
    and both cap the bucketed 64K at it."""
    from dualjax.core.config import ClusterSpec, SimConfig
    from dualjax.sim import build
    model_cfg = models.get_config("small")
    runtime = decode_capacity(RunConfig(**settings), model_cfg)
    sim = build(SimConfig(ClusterSpec(1, 1), model="small", hardware="paper-h800", **settings), progress=False)
    assert sim.capacity == runtime <= model_cfg.max_seq_len
