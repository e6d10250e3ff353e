"""Warm start: the shapes a host compiles before the clock are the shapes the run then computes,
and the report states start-up apart from the run."""

import models
from dualjax.core.config import ClusterSpec, RunConfig
from dualjax.runtime.launch import run_embedded
from dualjax.runtime.warmup import MAX_WARM_ROWS, prompt_lengths, warm_shapes

BASE = RunConfig(ClusterSpec(1, 1), model="tiny", workload="agentic-tiny", agents=3, turns=3, policy="pe-only")


def test_every_pass_the_run_computes_was_warmed(tmp_path):
    cfg = BASE.replace(out=str(tmp_path / "run"))
    report = run_embedded(cfg, progress=False)
    warmed = set(warm_shapes(cfg, models.get_config(cfg.model), cfg.block_tokens))
    pe = next(h for h in report["hosts"] if h["role"] == "prefill")
    ran = {(t["rows"], t["new"], t["prefix"]) for t in pe["pass_shapes"]}  # rows too: each count is a program
    assert ran and ran <= warmed, (ran, warmed)
    assert max(rows for rows, _, _ in warmed) == min(MAX_WARM_ROWS, cfg.agents)
    startup = report["startup"]
    assert set(startup["hosts_s"]) == {"1", "2"} and startup["max_s"] >= max(startup["hosts_s"].values()) > 0
    assert all(0 <= startup["compile_s"][r] <= startup["hosts_s"][r] for r in startup["hosts_s"])


def test_prompt_lengths_grow_with_the_context():
    cfg = BASE
    lengths = prompt_lengths(cfg, models.get_config(cfg.model))
    assert lengths == sorted(set(lengths)) and lengths[0] > 0 and len(lengths) >= 3
