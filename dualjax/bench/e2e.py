"""End to end: DualPath against the Basic baseline on embedded clusters, storage-bound.

    dualjax bench e2e --json FILE [--quick]

Offline agentic workload (`agentic-e2e`: 10 agents x 5 turns, 1,024-token first round, 64-token
appends, 8 generated tokens) on the `small` model. First an uncapped control run (compute-bound:
storage is a page-cache read). The per-host storage NIC cap is then set so that one NIC would need
6x (`--storage-factor`) the control's JCT to read every hit block: loading dominates compute, as in
the paper's regime (at 4x, compute contention on the shared cores held the speed-ups further below
theory). Then clusters 1p1d, 2p1d, 1p2d under basic / pe-only / dualpath, and 2p2d under dualpath
and round-robin for storage-NIC balance; then 1p1d under basic / pe-only / dualpath with a PE
device-memory budget (`--pe-hbm-mb`) that holds every layer of about one request's KV: Basic runs
one row per pass, layerwise prefill (two layers per row) is not held back. All runs share this
process and its 2 CPU cores, so hosts also contend for compute; only the per-host storage NIC
bandwidth and the PE memory budget are emulated.

Wall time is bounded (`--max-wall-s`, default 14 minutes, whatever the machine): the warm-up run
(the control's configuration) measures this machine (its JCT: its compilation is not repeated); each
capped run is predicted from it (the storage factor times the control over the run's storage NICs),
runs are kept in order of importance while they fit, and if not even the essential ones (the --quick
set and 1p1d basic / pe-only under the memory budget) fit at the preset's size, the agents shrink
until they do. A run still predicted to end past the bound (the machine slowed) is skipped and
listed.
"""

from __future__ import annotations

import logging
import os
import shutil
import time

from dualjax.bench.common import emit, parser
from dualjax.core.config import ClusterSpec, RunConfig
from dualjax.core.workload import get_workload, turn_lengths
from dualjax.outputs import load_run
from dualjax.plots import plot_compare
from dualjax.runtime.launch import run_embedded

log = logging.getLogger("dualjax.bench.e2e")

QUICK = [("1p1d", "basic"), ("1p1d", "dualpath"), ("1p2d", "basic"), ("1p2d", "dualpath")]
FULL = QUICK + [("2p1d", "basic"), ("2p1d", "dualpath"), ("1p1d", "pe-only"), ("1p2d", "pe-only"),
                ("2p1d", "pe-only"), ("2p2d", "dualpath"), ("2p2d", "round-robin")]
HBM = ["basic", "pe-only", "dualpath"]  # on 1p1d with the PE memory budget
RUN_OVERHEAD_S = 5.0  # a run's wall beyond its JCT once the warm-up compiled (start-up, stats, report)


def main(argv=None) -> dict:
    p = parser(__doc__)
    p.add_argument("--out", default="runs/bench-e2e", help="where the runs and plots go")
    p.add_argument("--storage-factor", type=float, default=6.0,
                   help="the cap makes one storage NIC need this many times the uncapped JCT (default 6)")
    p.add_argument("--max-wall-s", type=float, default=840.0,
                   help="skip runs that would end past this many seconds of wall time (default 840)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", force=True)
    t_start = time.time()
    shutil.rmtree(args.out, ignore_errors=True)
    base = RunConfig(ClusterSpec(1, 1), model="small", workload="agentic-e2e",
                     agents=3 if args.quick else None, turns=3 if args.quick else None)

    def run(name: str, **changes) -> dict:
        cfg = base.replace(out=os.path.join(args.out, name), **changes)
        r = run_embedded(cfg, progress=False)
        log.info("%-22s JCT %6.2f s  paths %s  SNIC max/avg %s", name, r["jct_s"], r["paths"],
                 None if r["snic_max_over_avg"] is None else round(r["snic_max_over_avg"], 2))
        return r

    # The control's own configuration first: it compiles the pass shapes the compute-bound control
    # meets, so the control times compute, not compilation (the capped runs hide the few new ones).
    warm = run("warmup", policy="basic")
    k = args.storage_factor
    # in order of importance; the first `essential` always run (fewer agents if need be)
    hbm_runs = [("1p1d", pol, "hbm") for pol in HBM]
    planned = [(c, pol, None) for c, pol in QUICK] if args.quick else \
        [(c, pol, None) for c, pol in QUICK] + hbm_runs[:2] + [(c, pol, None) for c, pol in FULL[len(QUICK):]] + \
        hbm_runs[2:]
    essential = len(QUICK) + (0 if args.quick else 2)
    preset_agents = base.agents or get_workload(base.workload).agents
    runs, agents = _fit_wall(planned, essential, k, warm["jct_s"] + RUN_OVERHEAD_S,
                             args.max_wall_s - (time.time() - t_start), preset_agents)
    if agents != preset_agents:
        log.info("sized to %d agents so that the runs fit --max-wall-s %.0f", agents, args.max_wall_s)
        base = base.replace(agents=agents)
    control = run("control-uncapped-1p1d-basic", policy="basic")
    hit_bytes = sum(h["storage_bytes"] for h in control["hosts"])
    cap = hit_bytes / (k * control["jct_s"])
    log.info("cap: %.1f MB/s per host (one NIC would read the %.0f MB of hits in %gx the uncapped JCT)",
             cap / 1e6, hit_bytes / 1e6, k)
    jct, balance, balance_all, reports, skipped, walls = {}, {}, {}, [], [], []
    hbm_mb = _hbm_budget_mb(base)
    hbm = {"pe_hbm_mb": hbm_mb, "jct_s": {}}
    for cluster, policy, budget in runs:
        budget = hbm_mb if budget else None
        name = f"{cluster}-{policy}" + ("-hbm" if budget else "")
        predicted = max(walls) if walls else k * control["jct_s"]
        if time.time() - t_start + predicted > args.max_wall_s:
            skipped.append(name)
            log.info("%-22s skipped: predicted %.0f s would end past --max-wall-s %.0f", name, predicted,
                     args.max_wall_s)
            continue
        t0 = time.time()
        r = run(name, cluster=ClusterSpec.parse(cluster), policy=policy, snic_mbps=cap / 1e6, pe_hbm_mb=budget)
        walls.append(time.time() - t0)
        if budget:
            hbm["jct_s"][policy] = r["jct_s"]
            continue
        jct.setdefault(cluster, {})[policy] = r["jct_s"]
        balance.setdefault(cluster, {})[policy] = r["snic_max_over_avg"]
        balance_all.setdefault(cluster, {})[policy] = r["snic_max_over_avg_all_windows"]
        reports.append(os.path.join(args.out, name))
    speedup = {c: v["basic"] / v["dualpath"] for c, v in jct.items() if "basic" in v and "dualpath" in v}
    theory = {c: (ClusterSpec.parse(c).prefill + ClusterSpec.parse(c).decode) / ClusterSpec.parse(c).prefill
              for c in speedup}
    figure = os.path.join(args.out, "jct_per_policy.png")
    plot_compare(figure, [(os.path.basename(d), *load_run(d)) for d in reports])
    result = {
        "benchmark": "e2e", "model": "small", "workload": base.workload, "quick": args.quick,
        "agents": base.agents, "turns": base.turns,
        "cap_mbps": cap / 1e6,
        "cap_reason": f"one storage NIC needs {k:g}x the uncapped control's JCT to read every hit block",
        "control_uncapped_jct_s": control["jct_s"], "hit_bytes": hit_bytes,
        # what every run here profiled at start-up (once per process): the simulator replays it
        "runtime_profile": {"prefill_tokens_per_s": control["prefill_tokens_per_s"],
                            "pack_fit": next(h["pack_fit"] for h in control["hosts"] if h["role"] == "prefill")},
        "speedup": speedup, "theory": theory, "efficiency": {c: speedup[c] / theory[c] for c in speedup},
        "jct_s": jct, "snic_max_over_avg": balance, "snic_max_over_avg_all_windows": balance_all,
        "plots": [figure] + [os.path.join(d, "storage.png") for d in reports],
        "hbm": hbm, "skipped": skipped, "max_wall_s": args.max_wall_s,
        "wall_s": time.time() - t_start,
        "notes": "Embedded clusters in one process on this 2-core machine: hosts share the CPU, so compute is "
                 "contended too; the per-host storage NIC cap is the one thing emulated. Basic = PE-only reads "
                 "without layerwise prefill.",
    }
    if "dualpath" in jct.get("1p1d", {}) and "basic" in jct.get("2p1d", {}):
        result["dualpath_1p1d_over_basic_2p1d"] = jct["1p1d"]["dualpath"] / jct["2p1d"]["basic"]
    emit(result, args.json)
    return result


def _fit_wall(runs: list, essential: int, k: float, control_s: float, budget_s: float,
              agents: int) -> tuple[list, int]:
    """The runs (in order of importance) and the agent count that fit `budget_s` seconds, from one run of
    the control's configuration (`control_s`): a capped run is predicted to take the control's time
    times k over its storage NICs (Basic and PE-only read on P nodes, the others on P + D), at least
    the control's. Runs past the first `essential` that do not fit are left out; if the essential ones
    do not fit, the agents shrink until they do."""
    def cost(run) -> float:
        c = ClusterSpec.parse(run[0])
        nics = c.prefill if run[1] in ("basic", "pe-only") else c.prefill + c.decode
        return max(1.0, k / nics)
    need = (1.0 + sum(cost(r) for r in runs[:essential])) * control_s  # with the control
    if need > budget_s:
        return runs[:essential], max(2, int(agents * budget_s / need))
    spent, kept = need, list(runs[:essential])
    for r in runs[essential:]:
        if spent + cost(r) * control_s <= budget_s:
            kept.append(r)
            spent += cost(r) * control_s
    return kept, agents


def _hbm_budget_mb(cfg: RunConfig) -> float:
    """A PE memory budget that holds every layer of about one request's prompt KV (the workload's
    longest prompt), so that it binds Basic and not layerwise prefill (two layers per row)."""
    from models import get_config, kv_bytes_per_token
    spec = get_workload(cfg.workload, agents=cfg.agents, turns=cfg.turns)
    longest = max(int(a.sum() + g[:-1].sum()) for a, g in (turn_lengths(spec, i) for i in range(spec.agents)))
    return 1.2 * longest * kv_bytes_per_token(get_config(cfg.model)) / 1e6


if __name__ == "__main__":
    main()
