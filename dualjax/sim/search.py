"""Experiments made of many simulations: the steady-state capacity search, the P/D sweep, the ablation."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from dualjax.core.config import ClusterSpec, SimConfig
from dualjax.core.planner import DeMemory
from dualjax.core.workload import slo_for
from dualjax.sim import build, get_hardware, model_cost, session_trace, simulate, workload_lengths
from dualjax.sim.engine import ep_groups, slot_tokens
from dualjax.sim.profiles import Hardware
from dualjax.sim.resources import Costs, SimError

WINDOW_S = 150.0  # docs/paper.md §9, §12: online runs stop once TTFT over a 150-s window ...
LOOKBACK_S = 1800.0  # ... is within 5 % of its value 30 minutes earlier
TOLERANCE = 0.05
WINDOWS = 24  # windows checked after the first (an hour) before a trial counts as never stationary: the
# ramp-up under load lasts a loaded agent lifetime, longer than the idle one, and the window 30 minutes
# earlier must be past it too
DRAIN_S = 600.0  # simulated past a window before it is checked, so that its requests have their tokens
# How a steady-state window is scored against the SLO (TTFT <= 4 s, TPOT <= 50 ms). The paper stops "when TTFT
# exceeds 4 s" without naming the statistic: an assumption, so each reading is offered. `mean` (the default) is
# the statistic the steady-state rule itself compares; `p90` / `p99` are tail readings; `attainment` counts the
# window's requests that meet both limits against a fraction (`--slo-attainment`, default 0.9).
SLO_READINGS = ("mean", "p90", "p99", "attainment")


def agent_lifetime(cfg: SimConfig, policy=None, hardware=None, agents: int = 8) -> float:
    """Mean seconds from an agent's start to its last token with the cluster nearly idle (a few agents
    offline): the ramp-up of an online run lasts at least this long, so no window before it is checked."""
    sim = build(dataclasses.replace(cfg, aps=None, agents=agents), policy, hardware, progress=False).run()
    c = sim.columns()
    return float(np.mean([c["done"][c["agent"] == a].max() for a in range(agents)]))


def window_ttft(arrival: np.ndarray, ttft: np.ndarray, end: float) -> float:
    """Mean TTFT of the requests arriving in (end - WINDOW_S, end]; infinite when one has no first token
    yet (the window is overloaded), NaN when none arrived."""
    v = ttft[(arrival > end - WINDOW_S) & (arrival <= end)]
    if not v.size:
        return math.nan
    return math.inf if np.isnan(v).any() else float(v.mean())


def stationary_window(arrival: np.ndarray, ttft: np.ndarray, first: float, last: float) -> list[float] | None:
    """The paper's steady state (docs/paper.md §9): the first 150-s window of arrivals, ending from `first`
    to `last` on multiples of 150 s, whose mean TTFT is within 5 % of the window's 30 minutes earlier;
    None if there is none (the load never settles: TTFT keeps growing)."""
    end = first
    while end <= last + 1e-9:
        now, before = window_ttft(arrival, ttft, end), window_ttft(arrival, ttft, end - LOOKBACK_S)
        if math.isfinite(now) and math.isfinite(before) and abs(now - before) <= TOLERANCE * before:
            return [end - WINDOW_S, end]
        end += WINDOW_S
    return None


def steady_state(cfg: SimConfig, aps: float, lifetime: float, policy=None, hardware=None) -> dict:
    """One online run at `aps` agents/s, stopped at the paper's steady state (`stationary_window`): from the
    later of 30 minutes + one window and one idle agent lifetime on, each window is checked once simulated
    `DRAIN_S` past it, for up to `WINDOWS` more windows. Returns the window scored (the steady one; if none,
    `stationary` False and the last window checked: over capacity, never within SLO), SLO attainment over
    its requests (one without a first token misses it) and their TTFT / TTST / TPOT."""
    first = WINDOW_S * math.ceil(max(LOOKBACK_S + WINDOW_S, lifetime) / WINDOW_S)
    horizon = first + WINDOWS * WINDOW_S
    agents = int(math.ceil(aps * horizon * 1.1)) + 16  # Poisson arrivals past the horizon
    sim = build(dataclasses.replace(cfg, aps=aps, agents=agents), policy, hardware, progress=False)
    window, end = None, first
    while window is None and end <= horizon:
        c = sim.run(until=end + DRAIN_S).columns()
        window = stationary_window(c["arrival"], c["ttft"], end, end)
        end += WINDOW_S
    scored = window or [end - 2 * WINDOW_S, end - WINDOW_S]
    w = (c["arrival"] > scored[0]) & (c["arrival"] <= scored[1])
    ttft, tpot = c["ttft"][w], c["tpot"][w]
    slo_ttft, slo_tpot = slo_for(cfg.workload)
    ok = (ttft <= slo_ttft) & (np.isnan(tpot) | (tpot <= slo_tpot)) & ~np.isnan(ttft)
    stats = (lambda v: {"mean": float(np.nanmean(v)), "p50": float(np.nanpercentile(v, 50)),  # noqa: E731
                        "p90": float(np.nanpercentile(v, 90)), "p99": float(np.nanpercentile(v, 99))}
             if np.isfinite(v).any() else None)
    return {"aps": aps, "agents": agents, "window_s": scored, "stationary": window is not None,
            "requests": int(w.sum()), "attained": float(ok.mean()) if w.any() else 0.0, "ttft_s": stats(ttft),
            "ttst_s": stats(c["ttst"][w]), "tpot_s": stats(tpot),
            "unfinished": int(np.isnan(ttft).sum()), "slo_s": [slo_ttft, slo_tpot]}


def within_slo(trial: dict, reading: str = "mean", attainment: float = 0.9) -> bool:
    """Whether a `steady_state` trial is within the SLO under `reading` (`SLO_READINGS`): a window that never
    settled, or that holds a request still without its first token, is not (its TTFT is unbounded)."""
    if not trial["stationary"] or not trial["requests"]:
        return False
    if reading == "attainment":
        return trial["attained"] >= attainment
    if reading not in SLO_READINGS:
        raise ValueError(f"unknown SLO reading {reading!r}: {', '.join(SLO_READINGS)}")
    if trial["unfinished"] or trial["ttft_s"] is None:
        return False
    slo_ttft, slo_tpot = trial["slo_s"]
    tpot = trial["tpot_s"][reading] if trial["tpot_s"] else 0.0
    return trial["ttft_s"][reading] <= slo_ttft and tpot <= slo_tpot


def find_capacity(cfg: SimConfig, attainment: float = 0.9, start_aps: float = 1.0, steps: int = 6,
                  policy=None, log=print, hardware=None, reading: str = "mean", cache: dict | None = None) -> dict:
    """The highest APS (Poisson agent arrivals per second) at which the run reaches the paper's steady state
    and that window is within the workload's SLO (TTFT and TPOT, docs/paper.md §9) under `reading`
    (`within_slo`; `attainment` is its fraction): doubling/halving to bracket it, then `steps` bisections
    (`steady_state` each; `cache` keeps trials by APS across calls, so several readings share their runs).
    Returns {"capacity_aps", "reading", "window_s" (the window scored at the capacity), "lifetime_s",
    "attainment", "trials": [...], "bracketed"}."""
    if reading not in SLO_READINGS:
        raise ValueError(f"unknown SLO reading {reading!r}: {', '.join(SLO_READINGS)}")
    trials = []
    cache = {} if cache is None else cache
    key = (cfg, repr(policy), repr(hardware))  # trials hold for one setting only
    if cache.setdefault("setting", key) != key:
        raise ValueError("find_capacity: a cache holds the trials of one setting (config, policy, hardware)")
    if "lifetime" not in cache:
        cache["lifetime"] = agent_lifetime(cfg, policy, hardware)
    lifetime = cache["lifetime"]

    def ok(aps: float) -> bool:
        if aps not in cache:
            cache[aps] = steady_state(cfg, aps, lifetime, policy, hardware)
        t = cache[aps]
        trials.append(t)
        if not t["stationary"]:
            log(f"  aps {aps:8.3f}: {t['agents']} agents: TTFT never steady (within {TOLERANCE:.0%} of its value "
                f"{LOOKBACK_S / 60:.0f} minutes earlier) up to {t['window_s'][1]:.0f} s: over capacity")
        else:
            w = t["window_s"]
            log(f"  aps {aps:8.3f}: {t['agents']} agents, steady window {w[0]:.0f}-{w[1]:.0f} s: "
                f"SLO attained by {t['attained']:.1%} (TTFT mean {t['ttft_s']['mean']:.2f} s, p99 "
                f"{t['ttft_s']['p99']:.2f} s, TPOT p99 {t['tpot_s']['p99'] * 1e3:.1f} ms)")
        return within_slo(t, reading, attainment)

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
    return {"capacity_aps": lo, "reading": reading, "window_s": best["window_s"] if best else None,
            "lifetime_s": lifetime,
            "attainment": attainment, "trials": trials, "bracketed": bool(lo) and lo < max(t["aps"] for t in trials)}


def de_memory(cfg: SimConfig, nodes: int, hardware: Hardware | None = None) -> DeMemory:
    """The planner's DE-memory constraint (`planner.DeMemory`) for `nodes` nodes running `cfg` offline, from
    what the simulator itself uses: each split's decode GPUs hold `Costs.de_memory_tokens` tokens (HBM less
    the weights under their expert-parallel group, `engine.ep_groups`, and the reserve, over the KV and
    indexer bytes per token); every agent has one request in flight, holding its prompt + generation tokens
    of DE memory, so the demand is agents x the workload's mean prompt + generation over its requests. That
    is DE memory as `de_memory=reserved` counts it (taken at placement); under `resident` a DE holds only the
    KV of requests in decode, so the demand here is an upper bound and the constraint a conservative one."""
    if cfg.aps is not None:
        raise SimError("the DE-memory constraint counts the agents of an offline run; online (--aps) the requests "
                       "in flight depend on the arrival rate")
    hw = hardware or get_hardware(cfg.hardware)
    append, gen, _, _ = workload_lengths(cfg)
    if (t := session_trace(cfg)) is not None:  # recorded prompts: appends there are the misses
        holds = np.concatenate([p + g for p, g in zip(t.prompt, t.gen)])
    else:
        holds = np.concatenate([np.cumsum(a + g) for a, g in zip(append, gen)])  # prompt + gen of every request
    slots = slot_tokens(cfg.model, append, gen, t)  # as the engine sizes them
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
