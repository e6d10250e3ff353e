"""Experiments made of many simulations: the steady-state capacity search, the P/D sweep, the ablation."""

from __future__ import annotations

import dataclasses

import numpy as np

from dualjax.core.config import ClusterSpec, SimConfig
from dualjax.core.planner import DeMemory
from dualjax.core.workload import slo_for
from dualjax.sim import build, get_hardware, model_cost, session_trace, simulate, workload_lengths
from dualjax.sim.engine import ep_groups
from dualjax.sim.profiles import Hardware
from dualjax.sim.resources import Costs, SimError
from models.buckets import DEFAULT_BUCKETS


def within_slo(report: dict, attainment: float) -> bool:
    return report["slo"]["attained"] >= attainment


def agent_lifetime(cfg: SimConfig, policy=None, hardware=None, agents: int = 8) -> float:
    """Mean seconds from an agent's start to its last token with the cluster nearly idle (a few agents
    offline): how long the ramp-up of an online run lasts before its population is steady."""
    sim = build(dataclasses.replace(cfg, aps=None, agents=agents), policy, hardware, progress=False).run()
    c = sim.columns()
    return float(np.mean([c["done"][c["agent"] == a].max() for a in range(agents)]))


def steady_state(cfg: SimConfig, aps: float, lifetime: float, policy=None, hardware=None,
                 spans: float = 5.0, warmup: float = 2.0) -> dict:
    """One online run at `aps` whose arrivals last `spans` agent lifetimes, scored over the steady-state
    window only: requests arriving after `warmup` lifetimes (the ramp-up: an agent's reads grow with its
    context, so the mix of ages settles only after a lifetime, longer under load) and before the last
    agent arrives (then the population drains). Returns attainment, TTFT/TPOT percentiles, window_s."""
    agents = max(16, int(np.ceil(aps * spans * lifetime)))
    sim = build(dataclasses.replace(cfg, aps=aps, agents=agents), policy, hardware, progress=False).run()
    c = sim.columns()
    t0, t1 = warmup * lifetime, float(sim.starts[-1])
    w = (c["arrival"] >= t0) & (c["arrival"] <= t1)
    ttft, tpot = c["ttft"][w], c["tpot"][w]
    slo_ttft, slo_tpot = slo_for(cfg.workload)
    ok = (ttft <= slo_ttft) & (np.isnan(tpot) | (tpot <= slo_tpot))
    pct = (lambda v, q: float(np.nanpercentile(v, q)) if np.isfinite(v).any() else None)  # noqa: E731
    return {"aps": aps, "agents": agents, "window_s": [t0, t1], "requests": int(w.sum()),
            "attained": float(ok.mean()) if w.any() else 0.0,
            "ttft_p50_s": pct(ttft, 50), "ttft_p99_s": pct(ttft, 99), "tpot_p50_s": pct(tpot, 50),
            "tpot_p99_s": pct(tpot, 99)}


def find_capacity(cfg: SimConfig, attainment: float = 0.9, start_aps: float = 1.0, steps: int = 6,
                  policy=None, log=print, hardware=None, spans: float = 5.0) -> dict:
    """The highest APS (Poisson agent arrivals per second) at which at least `attainment` of the steady-state
    window's requests meet the workload's SLO (TTFT and TPOT, docs/paper.md §9): each trial an online run whose
    arrivals last `spans` agent lifetimes, scored from the third lifetime on (`steady_state`);
    doubling/halving to bracket the capacity, then `steps` bisections. Returns {"capacity_aps", "window_s"
    (the window scored at the capacity), "lifetime_s", "attainment", "trials": [...], "bracketed"}."""
    trials = []
    lifetime = agent_lifetime(cfg, policy, hardware)

    def ok(aps: float) -> bool:
        t = steady_state(cfg, aps, lifetime, policy, hardware, spans)
        trials.append(t)
        log(f"  aps {aps:8.3f}: {t['agents']} agents, window {t['window_s'][0]:.0f}-{t['window_s'][1]:.0f} s: "
            f"SLO attained by {t['attained']:.1%} (TTFT p99 {t['ttft_p99_s'] or 0:.2f} s, "
            f"TPOT p99 {(t['tpot_p99_s'] or 0) * 1e3:.1f} ms)")
        return t["attained"] >= attainment

    lo, hi = 0.0, start_aps
    for _ in range(16):  # bracket: lo passes (or is 0), hi fails
        if not ok(hi):
            break
        lo, hi = hi, hi * 2
    if lo == 0.0:
        while hi > 1e-3:
            if ok(hi / 2):
                lo = hi / 2
                break
            hi /= 2
    for _ in range(steps if lo else 0):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    best = next((t for t in trials if t["aps"] == lo), None)
    return {"capacity_aps": lo, "window_s": best["window_s"] if best else None, "lifetime_s": lifetime,
            "attainment": attainment, "trials": trials, "bracketed": bool(lo) and lo < max(t["aps"] for t in trials)}


def de_memory(cfg: SimConfig, nodes: int, hardware: Hardware | None = None) -> DeMemory:
    """The planner's DE-memory constraint (`planner.DeMemory`) for `nodes` nodes running `cfg` offline, from
    what the simulator itself uses: each split's decode GPUs hold `Costs.de_memory_tokens` tokens (HBM less
    the weights under their expert-parallel group, `engine.ep_groups`, and the reserve, over the KV and
    indexer bytes per token); every agent has one request in flight, holding its prompt + generation tokens
    of DE memory, so the demand is agents x the workload's mean prompt + generation over its requests."""
    if cfg.aps is not None:
        raise SimError("the DE-memory constraint counts the agents of an offline run; online (--aps) the requests "
                       "in flight depend on the arrival rate")
    hw = hardware or get_hardware(cfg.hardware)
    append, gen, _, _ = workload_lengths(cfg)
    if cfg.workload.startswith("sessions:"):  # recorded prompts: appends there are the misses
        t = session_trace(cfg)
        holds = np.concatenate([p + g for p, g in zip(t.prompt, t.gen)])
    else:
        holds = np.concatenate([np.cumsum(a + g) for a, g in zip(append, gen)])  # prompt + gen of every request
    slots = DEFAULT_BUCKETS.prefix(int(max(a.sum() + g.sum() for a, g in zip(append, gen))) + 1)  # as the engine
    g, model = hw.gpus_per_node, model_cost(cfg.model)

    def tokens(decode_nodes: int) -> float:
        return float(sum(size * g * max(0.0, Costs(hw, model, slots, de_ep=size * g).de_memory_tokens())
                         for size in ep_groups(decode_nodes, g, hw.ep_gpus)))
    return DeMemory(nodes, float(len(append) * holds.mean()), tuple(tokens(d) for d in range(1, nodes)))


def sweep_pd(cfg: SimConfig, nodes: int, window=None, policy=None, hardware=None, log=print) -> dict:
    """Simulate every split of `nodes` nodes into P prefill + D decode nodes; recommend the split
    with the highest throughput (generated tokens/s) that breaks none of the analytic `window`'s
    constraints (a `planner.Window`, or None for no restriction). Each row names the constraints
    the planner says the split breaks (`planner_violated`) beside the resource the simulation shows
    busiest (`saturating`)."""
    rows = []
    for p in range(1, nodes):
        d = nodes - p
        violated = [] if window is None else window.violated(p, d)
        inside = not violated
        try:
            r = simulate(dataclasses.replace(cfg, cluster=ClusterSpec(p, d)), policy=policy, hardware=hardware,
                         progress=False)
        except SimError as e:  # e.g. a role with too few nodes to hold the model's weights
            rows.append({"cluster": f"{p}p{d}d", "p_over_d": p / d, "in_window": inside, "planner_violated": violated,
                         "infeasible": str(e)})
            log(f"  {p}p{d}d  infeasible: {e}")
            continue
        u = r["sim"]["utilisation"]
        rows.append({"cluster": f"{p}p{d}d", "p_over_d": p / d, "in_window": inside, "planner_violated": violated,
                     "jct_s": r["jct_s"], "tokens_per_s": r["tokens_per_s"], "ttft_p50_s": r["ttft_s"]["p50"],
                     "tpot_p50_s": r["tpot_s"]["p50"], "snic_max_over_avg": r["snic_max_over_avg"],
                     "utilisation": u, "saturating": u["binding"]})
        log(f"  {p}p{d}d  P/D {p / d:5.2f}  JCT {r['jct_s']:9.1f} s  {r['tokens_per_s']:10.1f} tok/s  busiest "
            f"{u['binding']} ({u[u['binding']]:.0%})  planner: {', '.join(violated) or 'inside the window'}")
    feasible = [r for r in rows if "infeasible" not in r]
    if not feasible:
        raise SimError(f"no split of {nodes} nodes is feasible: {rows[0]['infeasible']}")
    candidates = [r for r in feasible if r["in_window"]] or feasible
    best = max(candidates, key=lambda r: r["tokens_per_s"])
    return {"nodes": nodes, "sweep": rows, "recommended": best["cluster"]}
