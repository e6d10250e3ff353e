"""Warm start: the shapes a host compiles before the clock are the shapes the run then computes,
and the report states start-up apart from the run."""

import time

import jax

import models
from dualjax.core.config import COMPILE_CACHE_ENV, ClusterSpec, RunConfig, use_compile_cache
from dualjax.runtime import warmup
from dualjax.runtime.cluster import runner
from dualjax.runtime.cluster.runner import run_embedded
from dualjax.runtime.warmup import MAX_WARM_ROWS, prompt_lengths, warm_shapes

BASE = RunConfig(ClusterSpec(1, 1), model="tiny", workload="agentic-tiny", agents=3, turns=3, policy="pe-only")


def test_every_pass_warmed(tmp_path, monkeypatch, compile_log):
    """Every pass the run computes was compiled before the clock started, and nothing compiles after."""
    cfg = BASE.replace(out=str(tmp_path / "run"))
    clock = []  # when rank 0 starts the run's clock: every host has reported warm

    def wait_warm(*args, **kw):
        out = runner_wait_warm(*args, **kw)
        clock.append(time.time())
        return out

    runner_wait_warm = runner.wait_warm
    monkeypatch.setattr(runner, "wait_warm", wait_warm)
    # start cold, as a fresh process would: earlier tests' programs would not be compiled (nor logged) again
    jax.clear_caches()
    monkeypatch.setattr(warmup, "_WARMED", set())
    report = run_embedded(cfg, progress=False)
    # nothing compiles on the clock: not a pass, not a decode insert at a new length, not sampling
    assert clock and compile_log
    late = [name for t, name in compile_log if t > clock[0]]
    assert late == [], late
    warmed = set(warm_shapes(cfg, models.get_config(cfg.model), cfg.block_tokens))
    pe = next(h for h in report["hosts"] if h["role"] == "prefill")
    ran = {(t["rows"], t["new"], t["prefix"]) for t in pe["pass_shapes"]}  # rows too: each count is a program
    assert ran and ran <= warmed, (ran, warmed)
    assert max(rows for rows, _, _ in warmed) == min(MAX_WARM_ROWS, cfg.agents)
    startup = report["runtime"]["startup"]
    assert set(startup["hosts_s"]) == {"1", "2"} and startup["max_s"] >= max(startup["hosts_s"].values()) > 0
    assert all(0 <= startup["compile_s"][r] <= startup["hosts_s"][r] for r in startup["hosts_s"])


def test_prompt_lengths():
    """The prompt lengths a workload produces grow with the context, each once."""
    cfg = BASE
    lengths = prompt_lengths(cfg, models.get_config(cfg.model))
    assert lengths == sorted(set(lengths)) and lengths[0] > 0 and len(lengths) >= 3


def test_compile_cache_dir(tmp_path):
    """The compile cache goes where asked (or nowhere), never over a user's own choice."""
    env = {COMPILE_CACHE_ENV: str(tmp_path / "cache")}
    assert use_compile_cache(env) == str(tmp_path / "cache") == env["JAX_COMPILATION_CACHE_DIR"]
    assert float(env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]) > 0
    assert use_compile_cache({COMPILE_CACHE_ENV: "off"}) is None
    mine = {"JAX_COMPILATION_CACHE_DIR": "/mine"}
    assert use_compile_cache(mine) == "/mine" and use_compile_cache({}).endswith("dualjax/jax")


def test_profile_per_architecture(tiny, tmp_path):
    """Start-up profiles time random weights of the config's shapes: a checkpoint of a preset's
    architecture reuses what the process measured for the preset; another architecture does not."""
    from dualjax.runtime.startup import per_architecture
    from tests.models.test_checkpoint import _write_hf
    cfg, params = tiny
    (tmp_path / "ckpt").mkdir()
    _write_hf(tmp_path / "ckpt", cfg, params, "LlamaForCausalLM")
    calls = []
    measured = per_architecture(lambda model, *args: calls.append((model, args)) or len(calls))
    assert measured("tiny") == measured(str(tmp_path / "ckpt")) == 1
    assert measured("tiny", 7) == 2 and measured("small") == 3
    assert calls == [("tiny", ()), ("tiny", (7,)), ("small", ())]
    from dualjax.runtime import startup  # and the profile's own pieces are cached so
    assert startup.params_for("tiny") is startup.params_for(str(tmp_path / "ckpt"))
