"""The simulator's commands: `dualjax sim`, `dualjax sim validate`, `dualjax calibrate`, `dualjax plan --sweep`."""

from __future__ import annotations

import argparse
import json

from dualjax.core.config import ClusterSpec, ConfigError, SimConfig, add_flags, from_args


def add_parsers(sub) -> None:
    sim = sub.add_parser("sim", help="simulate a cluster (any size) with the runtime's scheduler and policies; "
                         "`dualjax sim validate` compares it with real runs")
    add_flags(sim, SimConfig)
    sim.add_argument("--find-capacity", action="store_true",
                     help="search the highest APS within the SLO (starting from --aps, default 1)")
    sim.add_argument("--slo-attainment", type=float, default=0.9,
                     help="fraction of requests that must meet the SLO for --find-capacity (default 0.9)")
    sim.add_argument("--out", default="runs/sim", help="report.json, requests.npz and plots (default runs/sim)")
    sim.add_argument("--json", metavar="FILE")
    sim.add_argument("--quiet", action="store_true", help="no progress bar")
    cal = sub.add_parser("calibrate", help="measure this machine into the simulator's `local` profile")
    cal.add_argument("--model", default="small")
    cal.add_argument("--workload", default="agentic-e2e", help="the workload preset whose pass shapes to measure "
                     "(default agentic-e2e, the e2e benchmark's)")
    cal.add_argument("--decode-slots", type=int, default=8)
    cal.add_argument("--out", default=None, help="profile path (default runs/calibrate/local.json)")


def add_sweep_flags(plan: argparse.ArgumentParser) -> None:
    plan.add_argument("--sweep", action="store_true",
                      help="also simulate every P/D split of --nodes nodes and recommend one")
    plan.add_argument("--nodes", type=int, default=6, help="nodes to split for --sweep (default 6)")
    add_flags(plan, SimConfig, skip=("cluster", "aps"))


def _write_json(path: str | None, obj: dict) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(obj, f, indent=1)


def main(args) -> int:
    from dualjax.sim import simulate
    cfg = from_args(SimConfig, args)
    if args.find_capacity:
        from dualjax.sim.search import find_capacity
        print(f"capacity search: {cfg.cluster.name} {cfg.policy} on {cfg.hardware}, {cfg.workload}")
        result = find_capacity(cfg, args.slo_attainment, args.aps or 1.0)
        print(f"capacity: {result['capacity_aps']:.3f} agents/s with >= {args.slo_attainment:.0%} of requests "
              f"within the SLO")
        _write_json(args.json, result)
        return 0
    report = simulate(cfg, out=args.out, progress=not args.quiet)
    t = report["ttft_s"]
    print(f"sim {cfg.cluster.name} {report['policy']} on {cfg.hardware}: {report['requests']} requests  "
          f"JCT {report['jct_s']:.1f} s  {report['tokens_per_s']:.0f} tok/s  TTFT p50 {t['p50']:.2f} s "
          f"p99 {t['p99']:.2f} s  TPOT p50 {(report['tpot_s']['p50'] or 0) * 1e3:.1f} ms  "
          f"SNIC max/avg {report['snic_max_over_avg'] or float('nan'):.2f}  "
          f"{report['events']} events in {report['wall_s']:.1f} s ({report['events_per_s']:.0f}/s)  -> {args.out}")
    _write_json(args.json, {k: v for k, v in report.items() if k not in ("storage_series", "hosts")})
    return 0


def cmd_sweep(args, window) -> dict:
    """Simulate the P/D splits on the profile, with the plan's own hardware numbers where they apply."""
    import dataclasses

    from dualjax.sim.profiles import get_hardware
    from dualjax.sim.search import sweep_pd
    if args.nodes < 2:
        raise ConfigError(f"--nodes must be >= 2 to split into prefill and decode nodes, got {args.nodes}")
    cfg = from_args(SimConfig, args, cluster=ClusterSpec(1, 1))
    hw = get_hardware(cfg.hardware)
    if not hw.free_storage:
        hw = dataclasses.replace(hw, gpus_per_node=args.gpus_per_node, cnic_bytes_per_s=args.cnic_gbps * 1e9 / 8,
                                 snic_bytes_per_s=args.snic_per_node * (args.snic_gbps or args.cnic_gbps) * 1e9 / 8,
                                 dram_bytes_per_s=args.dram_gbs * 1e9)
    print(f"sweep: {args.nodes} nodes of {hw.name} (g={hw.gpus_per_node}), {cfg.model}, {cfg.workload}, "
          f"policy {cfg.policy}")
    result = sweep_pd(cfg, args.nodes, window, hardware=hw)
    print(f"recommended: {result['recommended']} (highest tokens/s inside the window)")
    return result
