"""`dualjax plan`: the P/D ratio window of the hardware (docs/paper.md, P/D window), its binding
constraints, and with `--sweep` every P/D split of a node count simulated, with a recommendation.

The window from the flags alone is the paper's: every storage NIC reading at its line rate. A sweep
judges its splits by the window of the cluster it simulates: storage at the rate the profile says it
delivers (`snic_efficiency` of the line rate) and the decode nodes' device memory for the KV of the
agents in flight (`dualjax.sim.search.de_memory`)."""

from __future__ import annotations

import dataclasses

from dualjax.outputs import write_json


def add_parser(sub, parent: list) -> None:
    from dualjax.cli.parsing import json_flag
    from dualjax.cli.sim import add_sweep_flags
    plan = sub.add_parser("plan", help="the P/D ratio window for given hardware (and a simulated sweep)",
                          parents=parent)
    plan.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node (default 8)")
    plan.add_argument("--snic-per-node", type=float, default=1.0, help="storage NICs per node (default 1)")
    plan.add_argument("--snic-gbps", type=float, help="Gbit/s per storage NIC (default: --cnic-gbps)")
    plan.add_argument("--cnic-gbps", type=float, default=400.0, help="Gbit/s of one GPU's compute NIC")
    plan.add_argument("--dram-gbs", type=float, default=500.0, help="GB/s of host DRAM bandwidth per node")
    json_flag(plan, "the window (and the sweep)")
    plan.add_argument("--sweep", action="store_true",
                      help="also simulate every P/D split of --nodes nodes and recommend one")
    sweep = plan.add_argument_group("the sweep's settings (only with --sweep)")
    add_sweep_flags(sweep)
    plan.set_defaults(sweep_flags=sweep._group_actions)  # refused without --sweep: it would ignore them


def _show(title: str, w) -> None:
    print(f"{title}: {w.min_p_over_d} ({float(w.min_p_over_d):.3f}) <= P/D <= {w.max_p_over_d} "
          f"({float(w.max_p_over_d):.3f})")
    print(f"  lower bound set by {w.binding_min}; upper bound set by {' and '.join(w.binding)}")


def simulated_window(args):
    """The window of the cluster a sweep simulates: the flags' hardware with storage at the profile's
    effective rate, and the DE memory of `--nodes` nodes for the workload's agents."""
    from dualjax.core.config import ClusterSpec, SimConfig, from_args
    from dualjax.core.planner import pd_window
    from dualjax.sim.profiles import get_hardware
    from dualjax.sim.search import de_memory
    cfg = from_args(SimConfig, args, cluster=ClusterSpec(1, 1))
    hw = dataclasses.replace(get_hardware(cfg.hardware), gpus_per_node=args.gpus_per_node)
    if cfg.snic_mbps:  # --snic-mbps: MB/s per node delivered, as `sim.build` takes it
        nics, snic = 1, cfg.snic_mbps * 8e-3
    else:
        nics, snic = args.snic_per_node, (args.snic_gbps or args.cnic_gbps) * hw.snic_efficiency
    memory = de_memory(cfg, args.nodes, hw)
    w = pd_window(args.gpus_per_node, nics, args.cnic_gbps, args.dram_gbs, snic, memory)
    _show(f"P/D window of the simulated cluster (storage NICs at {snic:.0f} Gbit/s, {nics:g} per node; "
          f"{args.nodes} nodes)", w)
    fit = [f"{d}d {c / 1e6:.1f} M" for d, c in enumerate(memory.capacity_tokens, 1)]
    print(f"  DE memory: {memory.demand_tokens / 1e6:.1f} M tokens of KV in flight; decode nodes hold "
          f"{', '.join(fit)}")
    return w


def main(args) -> int:
    from dualjax.cli.parsing import changed
    from dualjax.core.config import ConfigError
    from dualjax.core.planner import pd_window
    if not args.sweep and (given := changed(args, args.sweep_flags)):
        raise ConfigError(f"{', '.join(given)}: only with --sweep (the window from the flags alone simulates nothing)")
    w = pd_window(args.gpus_per_node, args.snic_per_node, args.cnic_gbps, args.dram_gbs, args.snic_gbps)
    _show("P/D window", w)
    result = w.to_json()
    if args.sweep:
        from dualjax.cli.sim import cmd_sweep
        sim_w = simulated_window(args)
        result["simulated_window"] = sim_w.to_json()
        result.update(cmd_sweep(args, sim_w))
    if args.json:
        write_json(args.json, result)
    return 0
