"""`dualjax plan`: the P/D ratio window of the hardware (docs/paper.md, P/D window), its binding
constraints, and with `--sweep` every P/D split of a node count simulated, with a recommendation."""

from __future__ import annotations

import json


def add_parser(sub) -> None:
    from dualjax.cli.sim import add_sweep_flags
    plan = sub.add_parser("plan", help="the P/D ratio window for given hardware (and a simulated sweep)")
    plan.add_argument("--gpus-per-node", type=int, default=8)
    plan.add_argument("--snic-per-node", type=float, default=1.0)
    plan.add_argument("--snic-gbps", type=float, help="Gbit/s per storage NIC (default: --cnic-gbps)")
    plan.add_argument("--cnic-gbps", type=float, default=400.0, help="Gbit/s of one GPU's compute NIC")
    plan.add_argument("--dram-gbs", type=float, default=500.0, help="GB/s of host DRAM bandwidth per node")
    plan.add_argument("--json", metavar="FILE")
    add_sweep_flags(plan)


def main(args) -> int:
    from dualjax.core.planner import pd_window
    w = pd_window(args.gpus_per_node, args.snic_per_node, args.cnic_gbps, args.dram_gbs, args.snic_gbps)
    print(f"P/D window: {w.min_p_over_d} ({float(w.min_p_over_d):.3f}) <= P/D <= {w.max_p_over_d} "
          f"({float(w.max_p_over_d):.3f})")
    print(f"  lower bound set by {w.binding_min}; upper bound set by {' and '.join(w.binding)}")
    result = w.to_json()
    if args.sweep:
        from dualjax.cli.sim import cmd_sweep
        result.update(cmd_sweep(args, w))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0
