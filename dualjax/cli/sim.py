"""The simulator's commands: `dualjax sim`, `dualjax sim ablation`, `dualjax sim validate`, `dualjax sim sweep`,
`dualjax calibrate`, `dualjax plan --sweep`."""

from __future__ import annotations

from dualjax.core.config import ClusterSpec, ConfigError, SimConfig, add_flags, from_args, number
from dualjax.outputs import write_json, writing


def add_parsers(sub, parent: list, argv: list[str]) -> None:
    """`sim` (a simulation) with its subcommands `ablation`, `validate`, `paper` and `fit`, and `calibrate`; `argv`: the
    command line's words from the subcommand on (a lazy subcommand's flags load only when it runs)."""
    from dualjax.cli.parsing import OwnFlagsAfter, add_lazy, json_flag, out_flag, plot_flag
    sim = sub.add_parser("sim", parents=parent, help="simulate a cluster (any size) with the runtime's scheduler "
                         "and policies; subcommands: ablation, validate, paper, fit, sweep",
                         description="A simulation with the flags below, or a SUBCOMMAND with its own flags after "
                         "it (`dualjax sim SUBCOMMAND --help`); the simulation's flags before a SUBCOMMAND are "
                         "refused.")
    add_flags(sim, SimConfig)
    sim.add_argument("--find-capacity", action="store_true",
                     help="search the highest APS whose steady-state window meets the SLO (from --aps, default 1); "
                     "each trial runs until TTFT over a 150-s window is within 5%% of its value 30 minutes earlier "
                     "and scores that window")
    sim.add_argument("--slo-reading", metavar="READING",
                     help="for --find-capacity, how the steady window is scored against the SLO (TTFT <= 4 s, TPOT "
                     "<= 50 ms; the paper does not name the statistic, so this is an assumption): mean (default), "
                     "p90, p99, or attainment (a fraction of its requests within both limits)")
    sim.add_argument("--slo-attainment", type=number(high=1.0),
                     help="with --slo-reading attainment: the fraction of the window's requests that must meet the "
                     "SLO (default 0.9)")
    out_flag(sim, None, "the run's request table, report.json and plots, as a real run's; not with --find-capacity")
    json_flag(sim, "the report (without hosts and storage series), or the capacity search")
    sim.add_argument("--quiet", action="store_true", help="no progress bar")
    sim.set_defaults(func=main)
    subs = sim.add_subparsers(dest="sim_command", metavar="SUBCOMMAND", action=OwnFlagsAfter)
    abl = subs.add_parser("ablation", parents=parent, help="Basic, + layerwise prefill, + dual-path loading (naive "
                          "scheduler), + the full scheduler, and Oracle (dualjax/sim/ablation.py)")
    add_flags(abl, SimConfig, skip=("policy", "scheduler", "layerwise", "aps"))
    json_flag(abl, "the ablation table")
    plot_flag(abl, "a bar plot of JCT per step")
    abl.set_defaults(func=ablation_main)
    add_lazy(subs, "validate", "dualjax.cli.validate", "the e2e benchmark's configurations, for real and in the "
             "simulator, compared", argv[:2] == ["sim", "validate"])
    add_lazy(subs, "paper", "dualjax.cli.paper", "the paper's evaluation points simulated: JSON, a markdown table "
             "and a figure", argv[:2] == ["sim", "paper"])
    add_lazy(subs, "sweep", "dualjax.cli.sweep", "a grid of simulations (policies x workloads x clusters x storage "
             "rates x seeds, or regimes) on every core or MPI rank, resumable", argv[:2] == ["sim", "sweep"])
    add_lazy(subs, "fit", "dualjax.cli.fit", "fit paper-h800's three fitted inputs to the paper's figures and "
             "write the fit file", argv[:2] == ["sim", "fit"])
    cal = sub.add_parser("calibrate", parents=parent, help="measure this machine into the simulator's `local` profile")
    cal.add_argument("--model", default="small", help="the model preset to measure (default small)")
    cal.add_argument("--workload", default="agentic-e2e", help="the workload preset whose pass shapes to measure "
                     "(default agentic-e2e, the e2e benchmark's)")
    cal.add_argument("--decode-slots", type=int, default=8,
                     help="sequences a decode host decodes together: the decode step measured (default 8)")
    json_flag(cal, "the profile (default runs/calibrate/local.json, the `local` profile)")


def add_sweep_flags(plan) -> None:
    """`dualjax plan --sweep`'s settings (on a parser or an argument group)."""
    plan.add_argument("--nodes", type=int, default=6, help="nodes to split for --sweep (default 6)")
    add_flags(plan, SimConfig, skip=("cluster", "aps"))


def main(args) -> int:
    from dualjax.sim import simulate
    cfg = from_args(SimConfig, args)
    if not args.find_capacity and args.slo_attainment is not None:
        raise ConfigError("--slo-attainment: only with --find-capacity")
    if not args.find_capacity and args.slo_reading is not None:
        raise ConfigError("--slo-reading: only with --find-capacity")
    reading = args.slo_reading or ("attainment" if args.slo_attainment is not None else "mean")
    if args.find_capacity:
        from dualjax.sim.search import SLO_READINGS
        if reading not in SLO_READINGS:
            raise ConfigError(f"--slo-reading: {reading!r} is not one of {', '.join(SLO_READINGS)}")
    if args.slo_attainment is not None and reading != "attainment":
        raise ConfigError(f"--slo-attainment: only with --slo-reading attainment, not {reading}")
    if args.find_capacity:
        from dualjax.sim.search import find_capacity
        if args.out:
            raise ConfigError("--out: a capacity search writes no run outputs (--json writes its result)")
        attainment = args.slo_attainment or 0.9
        print(f"capacity search: {cfg.cluster.name} {cfg.policy} on {cfg.hardware}, {cfg.workload}")
        result = find_capacity(cfg, attainment, args.aps or 1.0, reading=reading)
        w = result["window_s"] or [0.0, 0.0]
        rule = (f">= {attainment:.0%} of the requests" if reading == "attainment"
                else f"the {reading} TTFT and TPOT of the requests")
        print(f"capacity: {result['capacity_aps']:.3f} agents/s with {rule} arriving in the steady-state window "
              f"{w[0]:.0f}-{w[1]:.0f} s within the SLO")
        if args.json:
            write_json(args.json, result)
        return 0
    report = simulate(cfg, out=args.out, progress=not args.quiet)
    t, own = report["ttft_s"], report["sim"]
    print(f"sim {cfg.cluster.name} {report['policy']} on {cfg.hardware}: {report['requests']} requests  "
          f"JCT {report['jct_s']:.1f} s  {report['tokens_per_s']:.0f} tok/s  TTFT p50 {t['p50']:.2f} s "
          f"p99 {t['p99']:.2f} s  TPOT p50 {(report['tpot_s']['p50'] or 0) * 1e3:.1f} ms  "
          f"SNIC max/avg {report['snic_max_over_avg'] or float('nan'):.2f}  "
          f"{own['events']} events in {own['wall_s']:.1f} s ({own['events_per_s']:.0f}/s)"
          + (f"  -> {args.out}" if args.out else ""))
    if args.json:
        write_json(args.json, {k: v for k, v in report.items() if k not in ("storage_series", "hosts")})
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


def ablation_main(args) -> int:
    """`dualjax sim ablation ... [--json FILE] [--plot FILE]`: the ablation table, its JSON and a bar plot."""
    from dualjax.sim.ablation import ablation
    cfg = from_args(SimConfig, args)
    print(f"ablation: {cfg.cluster.name} x {cfg.agents or 'preset'} agents of {cfg.workload}, {cfg.model} on "
          f"{cfg.hardware}")
    result = ablation(cfg)
    print(f"{'step':12s} {'JCT s':>9s} {'vs Basic':>9s} {'SNIC max/avg':>13s}")
    for k, v in result["jct_s"].items():
        print(f"{k:12s} {v:9.1f} {result['vs_basic'].get(k, 0):+9.1%} {result['snic_max_over_avg'][k] or 0:13.2f}")
    if args.plot:
        with writing(args.plot):
            plot_ablation(args.plot, result)
        result["plot"] = args.plot
    if args.json:
        write_json(args.json, result)
    return 0


def plot_ablation(path: str, result: dict) -> None:
    """JCT per ablation step, labelled with its change against Basic."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = list(result["jct_s"])
    fig, ax = plt.subplots(figsize=(8, 4))
    bars = ax.bar(range(len(names)), [result["jct_s"][n] for n in names], color="tab:blue")
    for b, n in zip(bars, names):
        ax.annotate(f"{result['vs_basic'].get(n, 0):+.0%}", (b.get_x() + b.get_width() / 2, b.get_height()),
                    ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(names)), names, rotation=20, ha="right")
    ax.set(ylabel="job completion time (s)",
           title=f"ablation: {result['cluster']} x {result['agents']} agents, {result['workload']}, {result['model']}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
