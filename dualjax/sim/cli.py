"""The simulator's commands: `dualjax sim`, `dualjax sim validate`, `dualjax calibrate`, `dualjax plan --sweep`."""

from __future__ import annotations

import argparse
import json


def add_sim_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--hardware", default="paper-h800", help="paper-h800 (default), oracle, local (from "
                   "`dualjax calibrate`) or a profile JSON file")
    p.add_argument("--model", default="deepseek-v3.2", help="deepseek-v3.2 (default) or a model preset")
    p.add_argument("--workload", default="paper-64k", help="a workload preset or a trajectory file *.jsonl")
    p.add_argument("--agents", type=int, help="override the preset's number of agents")
    p.add_argument("--turns", type=int, help="override the preset's turns per agent")
    p.add_argument("--policy", default="dualpath", help="basic, pe-only, de-only, round-robin, random, dualpath")
    p.add_argument("--layerwise", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--no-store", action="store_true", help="no KV store: every prompt recomputed")
    p.add_argument("--snic-mbps", type=float, help="override the profile's storage bandwidth per node, MB/s")
    p.add_argument("--block-tokens", type=int, default=64)
    p.add_argument("--prefill-chunk", type=int, default=2048)
    p.add_argument("--compute-quota-ms", type=float, default=300.0)
    p.add_argument("--seed", type=int, default=0, help="workload seed")


def add_parsers(sub) -> None:
    sim = sub.add_parser("sim", help="simulate a cluster (any size) with the runtime's scheduler and policies; "
                         "`dualjax sim validate` compares it with real runs")
    sim.add_argument("--cluster", default="2p4d", help="PpDd in nodes (default 2p4d)")
    add_sim_flags(sim)
    sim.add_argument("--aps", type=float, help="online mode: agents arrive as a Poisson process at APS agents/s")
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
    add_sim_flags(plan)


def config(args, cluster: str):
    from dualjax.config import ClusterSpec
    from dualjax.sim import SimConfig
    return SimConfig(ClusterSpec.parse(cluster), hardware=args.hardware, model=args.model, workload=args.workload,
                     agents=args.agents, turns=args.turns, policy=args.policy, aps=getattr(args, "aps", None),
                     layerwise=args.layerwise, use_store=not args.no_store, snic_mbps=args.snic_mbps,
                     block_tokens=args.block_tokens, prefill_chunk=args.prefill_chunk,
                     compute_quota_ms=args.compute_quota_ms, workload_seed=args.seed)


def _write_json(path: str | None, obj: dict) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(obj, f, indent=1)


def cmd_sim(args) -> int:
    from dualjax.sim import simulate
    cfg = config(args, args.cluster)
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


def cmd_calibrate(args) -> int:
    from dualjax.sim.calibrate import calibrate
    from dualjax.sim.profiles import DEFAULT_LOCAL
    path = args.out or DEFAULT_LOCAL
    hw = calibrate(args.model, args.workload, decode_slots=args.decode_slots, path=path)
    a, b, c = hw.prefill_fit
    print(f"local profile ({args.model}) -> {path}\n"
          f"  prefill passes: {len(hw.pass_table)} padded shapes (rows x new x prefix), from "
          f"{min(r[3] for r in hw.pass_table) * 1e3:.0f} to {max(r[3] for r in hw.pass_table) * 1e3:.0f} ms; "
          f"the hosts take x{hw.prefill_scale:.2f}\n"
          f"  packing fit: {a:.3g} s x new x (cached + new/2) + {b:.3g} s x new + {c:.3g} s per row\n"
          f"  decode step: {hw.decode_fit[0] * 1e3:.2f} ms + {hw.decode_fit[1] * 1e6:.3f} us x capacity\n"
          f"  with 1, 2, 3 other engines computing: a pass x{', '.join(f'{c:.2f}' for c in hw.contention)}, "
          f"a decode step x{', '.join(f'{c:.2f}' for c in hw.decode_contention)}\n"
          f"  storage read {hw.snic_bytes_per_s / 1e9:.2f} GB/s   relay {hw.cnic_bytes_per_s / 1e9:.2f} GB/s")
    return 0


def cmd_sweep(args, window) -> dict:
    """Simulate the P/D splits on the profile, with the plan's own hardware numbers where they apply."""
    import dataclasses

    from dualjax.sim.profiles import get_hardware
    from dualjax.sim.search import sweep_pd
    if args.nodes < 2:
        raise ValueError(f"--nodes must be >= 2 to split into prefill and decode nodes, got {args.nodes}")
    cfg = config(args, "1p1d")
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


def main_validate(argv) -> int:
    from dualjax.sim.validate import main
    main(argv)
    return 0

