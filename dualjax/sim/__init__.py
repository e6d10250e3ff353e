"""The simulator: a DualPath cluster at any scale, driven by the runtime's own scheduler and policies.

    from dualjax.core.config import ClusterSpec, SimConfig
    from dualjax.sim import simulate
    report = simulate(SimConfig(ClusterSpec(2, 4), workload="paper-64k", agents=2048), out="runs/sim")

With `out` it writes the same files as a real run (`dualjax.outputs`: requests.parquet, report.json,
plots; docs/report.md), its own keys under the report's `sim`. It replays every workload a real run
takes, recorded traces through `dualjax.core.workload.trace_table`. See `engine.py` for what is
modelled and `profiles.py` for the hardware and models.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from dualjax.core.config import SimConfig
from dualjax.core.policies import Policy, get_policy
from dualjax.core.report import build_report, complete
from dualjax.core.sessions import SessionTable
from dualjax.core.workload import (
    get_workload,
    load_trajectories,
    slo_for,
    start_times,
    trace_table,
    turn_lengths,
    workload_report,
)
from dualjax.outputs import write_run
from dualjax.sim.engine import SimError, Simulation
from dualjax.sim.profiles import Hardware, get_hardware, model_cost

__all__ = ["SimConfig", "SimError", "Simulation", "simulate", "build", "get_hardware", "model_cost"]


def workload_lengths(cfg: SimConfig) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray, float]:
    """(append lengths per agent, generation lengths per agent, start times, mean think time)."""
    if (t := session_trace(cfg)) is not None:  # misses as appends: see `session_trace`
        return [p - h for p, h in zip(t.prompt, t.hit)], t.gen, t.start, 0.0
    if cfg.workload.endswith(".jsonl"):
        agents = load_trajectories(cfg.workload, vocab=2**31 - 1, seed=cfg.workload_seed,
                                   max_len=model_context(cfg.model))
        append = [np.array([len(t.append) for t in a.turns]) for a in agents]
        gen = [np.array([t.gen_len for t in a.turns]) for a in agents]
        return append, gen, np.array([a.start for a in agents]), float(np.mean([a.think_s for a in agents]))
    spec = get_workload(cfg.workload, agents=cfg.agents, turns=cfg.turns)
    lengths = [turn_lengths(spec, a, cfg.workload_seed) for a in range(spec.agents)]
    return ([a for a, _ in lengths], [g for _, g in lengths], start_times(spec.agents, cfg.workload_seed, cfg.aps),
            spec.think_s)


def model_context(name: str) -> int:
    """The longest context a model preset takes (its max_seq_len)."""
    from models.presets import get_config
    return get_config(name).max_seq_len


def session_trace(cfg: SimConfig) -> SessionTable | None:
    """A recorded trace (`sessions:PATH[...]` or `mooncake:PATH[...]`), else None: a request can diverge
    from its agent's previous context (or, in Mooncake, share another agent's prefix), so the engine
    takes each turn's prompt, trace hit tokens (hash ids) and pause from this table, not from context +
    append. A request past the model's context is not replayed, as in a real run."""
    return trace_table(cfg.workload, cfg.agents, cfg.workload_seed, cfg.think_time, cfg.aps, model_context(cfg.model))


def build(cfg: SimConfig, policy: Policy | str | None = None, hardware: Hardware | None = None,
          progress: bool = True) -> Simulation:
    """A ready-to-run Simulation; `policy` (a name or an object) overrides `cfg.policy`."""
    hw = (hardware or get_hardware(cfg.hardware)).with_snic(cfg.snic_mbps and cfg.snic_mbps * 1e6)
    if hw.model is not None and hw.model != cfg.model:
        raise SimError(f"hardware profile {hw.name!r} was calibrated with model {hw.model!r}, not {cfg.model!r}: "
                       f"run `dualjax calibrate --model {cfg.model}`")
    append, gen, starts, think = workload_lengths(cfg)
    return Simulation(cfg, hw, model_cost(cfg.model), append, gen, starts, think, policy, progress,
                      trace=session_trace(cfg))


def simulate(cfg: SimConfig, out: str | None = None, policy: Policy | str | None = None,
             hardware: Hardware | None = None, progress: bool = True) -> dict:
    """Run one simulation; with `out`, write its request table, report.json and plots there (nothing
    is written without it). Returns the report (docs/report.md)."""
    sim = build(cfg, policy, hardware, progress).run()
    cols = complete(sim.columns())
    own = {"hardware": dataclasses.asdict(sim.hw), "events": sim.events_done, "wall_s": sim.wall_s,
           "events_per_s": sim.events_done / sim.wall_s if sim.wall_s else None,
           "prefill": sim.pe_summary(), "utilisation": sim.link_summary(), **sim.sim_summary()}
    workload = workload_report(cfg.workload, cfg.agents, cfg.workload_seed, model_context(cfg.model), cfg.block_tokens)
    report = build_report("simulated", cols, sim.host_stats(), cfg, get_policy(policy or cfg.policy).name,
                          slo_for(cfg.workload), workload, own)
    if out is not None:
        write_run(out, cols, report)
    return report
