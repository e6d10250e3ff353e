"""Experiments made of many simulations: the online capacity search and the P/D sweep."""

from __future__ import annotations

import dataclasses
from fractions import Fraction

from dualjax.core.config import ClusterSpec, SimConfig
from dualjax.sim import simulate


def within_slo(report: dict, attainment: float) -> bool:
    return report["slo"]["attained"] >= attainment


def find_capacity(cfg: SimConfig, attainment: float = 0.9, start_aps: float = 1.0, steps: int = 6,
                  policy=None, log=print) -> dict:
    """The highest APS (Poisson agent arrivals per second) at which at least `attainment` of the
    requests meet the workload's SLO (TTFT and TPOT): doubling/halving to bracket it, then
    `steps` bisections. Returns {"capacity_aps", "attainment", "trials": [{aps, attained, ...}]}."""
    trials = []

    def ok(aps: float) -> bool:
        r = simulate(dataclasses.replace(cfg, aps=aps), policy=policy, progress=False)
        trials.append({"aps": aps, "attained": r["slo"]["attained"], "ttft_p99_s": r["ttft_s"]["p99"],
                       "tpot_p99_s": r["tpot_s"]["p99"], "jct_s": r["jct_s"]})
        log(f"  aps {aps:8.3f}: SLO attained by {r['slo']['attained']:.1%} of requests "
            f"(TTFT p99 {r['ttft_s']['p99']:.2f} s)")
        return within_slo(r, attainment)

    lo, hi = 0.0, start_aps
    for _ in range(16):  # bracket: lo passes (or is 0), hi fails
        if not ok(hi):
            break
        lo, hi = hi, hi * 2
    else:
        return {"capacity_aps": lo, "attainment": attainment, "trials": trials, "bracketed": False}
    if lo == 0.0:
        while hi > 1e-3:
            if ok(hi / 2):
                lo = hi / 2
                break
            hi /= 2
    for _ in range(steps if lo else 0):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return {"capacity_aps": lo, "attainment": attainment, "trials": trials, "bracketed": bool(lo)}


def sweep_pd(cfg: SimConfig, nodes: int, window=None, policy=None, hardware=None, log=print) -> dict:
    """Simulate every split of `nodes` nodes into P prefill + D decode nodes; recommend the split
    with the highest throughput (generated tokens/s) whose P/D lies in the analytic `window`
    (a `planner.Window`, or None for no restriction)."""
    rows = []
    for p in range(1, nodes):
        d = nodes - p
        r = simulate(dataclasses.replace(cfg, cluster=ClusterSpec(p, d)), policy=policy, hardware=hardware,
                     progress=False)
        ratio = Fraction(p, d)
        inside = window is None or window.min_p_over_d <= ratio <= window.max_p_over_d
        rows.append({"cluster": f"{p}p{d}d", "p_over_d": p / d, "in_window": inside, "jct_s": r["jct_s"],
                     "tokens_per_s": r["tokens_per_s"], "ttft_p50_s": r["ttft_s"]["p50"],
                     "tpot_p50_s": r["tpot_s"]["p50"], "snic_max_over_avg": r["snic_max_over_avg"]})
        log(f"  {p}p{d}d  P/D {p / d:5.2f}  JCT {r['jct_s']:9.1f} s  {r['tokens_per_s']:10.1f} tok/s"
            f"{'' if inside else '  (outside the window)'}")
    candidates = [r for r in rows if r["in_window"]] or rows
    best = max(candidates, key=lambda r: r["tokens_per_s"])
    return {"nodes": nodes, "sweep": rows, "recommended": best["cluster"]}
