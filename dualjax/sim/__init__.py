"""The simulator: a DualPath cluster at any scale, driven by the runtime's own scheduler and policies.

    from dualjax.core.config import SimConfig
from dualjax.sim import simulate
    report = simulate(SimConfig(ClusterSpec(2, 4), workload="paper-64k", agents=2048), out="runs/sim")

It writes the same `report.json` and plots as a real run (and `requests.npz` for the per-request
columns). See `engine.py` for what is modelled and `profiles.py` for the hardware and models.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from dualjax.core.config import SimConfig
from dualjax.core.policies import Policy, get_policy
from dualjax.core.sessions import SessionError, SessionTable, hit_summary, parse_spec, session_table
from dualjax.core.workload import get_workload, load_trajectories, slo_for, start_times, turn_lengths
from dualjax.outputs import write_report
from dualjax.sim.engine import SimError, Simulation
from dualjax.sim.profiles import Hardware, get_hardware, model_cost

__all__ = ["SimConfig", "SimError", "Simulation", "simulate", "build", "get_hardware", "model_cost"]


def workload_lengths(cfg: SimConfig) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray, float]:
    """(append lengths per agent, generation lengths per agent, start times, mean think time)."""
    if cfg.workload.startswith("mooncake:"):
        raise SimError("the simulator takes agentic presets and trajectory files; Mooncake traces share "
                       "prefixes across requests, which its per-agent hit model does not follow")
    if cfg.workload.startswith("sessions:"):  # misses as appends: see `session_trace`
        t = session_trace(cfg)
        return [p - h for p, h in zip(t.prompt, t.hit)], t.gen, t.start, 0.0
    if cfg.workload.endswith(".jsonl"):
        agents = load_trajectories(cfg.workload, vocab=2**31 - 1, seed=cfg.workload_seed)
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


def session_trace(cfg: SimConfig) -> SessionTable:
    """Recorded sessions (`sessions:PATH[:LIMIT[:LENGTH_SCALE]]`): a session's request can diverge from
    its previous context, so the engine takes each turn's prompt, trace hit tokens (hash ids) and
    pause from this table, not from context + append. Sessions end at the model's context."""
    try:
        return session_table(parse_spec(cfg.workload), cfg.agents, cfg.workload_seed, cfg.think_time,
                             None if cfg.aps is None else (lambda n: start_times(n, cfg.workload_seed, cfg.aps)),
                             model_context(cfg.model))
    except SessionError as e:
        raise SimError(str(e)) from None


def build(cfg: SimConfig, policy: Policy | str | None = None, hardware: Hardware | None = None,
          progress: bool = True) -> Simulation:
    """A ready-to-run Simulation; `policy` (a name or an object) overrides `cfg.policy`."""
    hw = (hardware or get_hardware(cfg.hardware)).with_snic(cfg.snic_mbps and cfg.snic_mbps * 1e6)
    if hw.model is not None and hw.model != cfg.model:
        raise SimError(f"hardware profile {hw.name!r} was calibrated with model {hw.model!r}, not {cfg.model!r}: "
                       f"run `dualjax calibrate --model {cfg.model}`")
    append, gen, starts, think = workload_lengths(cfg)
    sim = Simulation(cfg, hw, model_cost(cfg.model), append, gen, starts, think, policy, progress)
    if cfg.workload.startswith("sessions:"):
        sim.trace = session_trace(cfg)
    return sim


def simulate(cfg: SimConfig, out: str | None = None, policy: Policy | str | None = None,
             hardware: Hardware | None = None, progress: bool = True) -> dict:
    """Run one simulation; with `out`, write report.json, requests.npz and plots there. Returns the report."""
    sim = build(cfg, policy, hardware, progress).run()
    cols = sim.columns()
    name = get_policy(policy or cfg.policy).name
    extra = {"simulated": True, "hardware": dataclasses.asdict(sim.hw), "events": sim.events_done,
             "wall_s": sim.wall_s, "events_per_s": sim.events_done / sim.wall_s if sim.wall_s else None,
             "prefill": sim.pe_summary(), "utilisation": sim.link_summary()}
    if sim.trace is not None:
        extra.update(hit_summary(sim.trace.prompt, sim.trace.hit, cfg.block_tokens),
                     trace_requests_dropped=sim.trace.dropped)
    if out is None:
        from dualjax.core.report import summarize
        report = summarize(cols, sim.host_stats(), cfg, name, slo_for(cfg.workload))
        report.update(extra)
        return report
    os.makedirs(out, exist_ok=True)
    compact = {k: v.astype(np.float32 if v.dtype.kind == "f" else np.int32) if v.dtype.kind in "fi" else v
               for k, v in cols.items()}  # float32 seconds: 0.25 ms resolution at an hour
    np.savez(os.path.join(out, "requests.npz"), **compact)
    return write_report(out, cols, sim.host_stats(), cfg, name, slo_for(cfg.workload), extra)
