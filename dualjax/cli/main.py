"""The `dualjax` command line.

    dualjax demo [--quick] [--model M]          the main job: a small agentic run, PE-only vs dual-path
    dualjax run --cluster 1p1d ... --out DIR    one run (mpiexec by default, --embedded in-process;
                                                --hostfile FILE: across hosts)
    dualjax verify [--model M] --json FILE      bit-identical tokens across paths, modes and launchers
                                                (--hostfile N|FILE: across hosts)
    dualjax report DIR... [--plot FILE]         compare runs, real and simulated, in one table (and a figure)
    dualjax plan --gpus-per-node 8 ... [--sweep] the P/D ratio window for given hardware (and a simulated sweep)
    dualjax sim --cluster 2p4d ... [--out DIR]  simulate a cluster at any scale (same scheduler and policies)
    dualjax sim validate --json FILE            the e2e configurations for real and simulated, compared
    dualjax sim ablation --cluster 2p4d ...     Basic, + layerwise, + dual-path, + scheduler, Oracle (JSON; --plot)
    dualjax sim paper --json FILE [--no-large]  the paper's evaluation simulated: JSON, markdown table, figure
    dualjax sim fit                             fit paper-h800's three fitted inputs to the paper's figures
    dualjax workload stats NAME [--json FILE]   a workload's turns, append, gen, total and mean context
    dualjax calibrate [--model M]               measure this machine into the simulator's `local` profile
    dualjax bench {model,kvstore,relay,layerwise,e2e,dataplane,policies} [--json FILE]

Every subcommand takes --help and --log-level, and every one that shows progress --quiet (the
results are printed as without it). One name per thing: --model M (a preset; where a real model
runs, a checkpoint directory too: docs/models.md), --hostfile (the hosts to run on), --max-wall-s
(a wall-time bound). The output flags mean the same everywhere: --out DIR (run outputs,
docs/report.md), --json FILE (one JSON object), --plot FILE (a figure); nothing else is written but
`calibrate`'s product, the `local` profile in the per-user home ($DUALJAX_HOME, else
$XDG_DATA_HOME/dualjax, else ~/.local/share/dualjax), which `--hardware local` reads from any
directory. Bad input (flags, presets, files, stores) ends with one line naming what was wrong and
exit code 2; anything else is a bug and shows its traceback.
"""

from __future__ import annotations

import argparse
import sys

from dualjax.cli.errors import user_errors
from dualjax.cli.parsing import add_lazy, common, json_flag, out_flag, plot_flag, quiet_flag, set_log_level
from dualjax.core.config import RunConfig, add_flags, from_args, use_compile_cache
from dualjax.outputs import remove_unused_dirs

BENCHES = {"model": ("dualjax.bench.model", "prefill/decode throughput vs this machine's matmul FLOP/s"),
           "kvstore": ("dualjax.bench.kvstore", "block store vs raw file I/O of the same bytes"),
           "relay": ("dualjax.bench.relay", "DE->PE relay over MPI vs a plain Send"),
           "layerwise": ("dualjax.bench.layerwise", "layerwise prefill: overlap of storage loading and compute"),
           "e2e": ("dualjax.bench.e2e", "DualPath vs Basic on embedded clusters, storage-bound"),
           "dataplane": ("dualjax.bench.dataplane", "hit-KV bytes/s each read path delivers into prefill"),
           "policies": ("dualjax.bench.policies", "path policies, the field's too, where loading loses and wins")}


def cmd_run(args) -> int:
    from dualjax.runtime.cluster.preflight import REFUSED
    from dualjax.runtime.cluster.runner import check_run, failed_hosts, launch_mpi, run_embedded, summary_line
    cfg = from_args(RunConfig, args)
    check_run(cfg, embedded=args.embedded)
    if not args.embedded:
        rc = launch_mpi(cfg, quiet=args.quiet)
        if rc and rc != REFUSED:  # a refusal is rank 0's one line already
            print(f"dualjax run: a host failed (exit code {rc})", file=sys.stderr)
            for path in failed_hosts(cfg.out):  # mpiexec may have ended the job before it forwarded the host's print
                with open(path) as f:
                    print(f"{path}:\n{f.read()}", file=sys.stderr)
        return rc  # on success rank 0 printed the summary line on stdout, as below
    print(summary_line(run_embedded(cfg, progress=not args.quiet)))
    return 0


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The whole parser. Subcommands that import JAX (`bench NAME`, `sim validate`) get their flags only
    when `argv` runs them (`parsing.add_lazy`); every one is listed by its parent's --help."""
    from dualjax.cli import plan, sim, workload
    argv = _words(argv or [])
    parser = argparse.ArgumentParser(prog="dualjax", description=__doc__, parents=[common()],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    parent = [common()]
    demo = sub.add_parser("demo", help="a small agentic workload on an embedded 1P1D cluster", parents=parent)
    demo.add_argument("--quick", action="store_true", help="fewer agents and turns, the tiny model (CI smoke run)")
    demo.add_argument("--model", help="model preset or checkpoint directory (default: small, or tiny with --quick)")
    out_flag(demo, "runs/demo", "the two runs' outputs")
    quiet_flag(demo)
    run = sub.add_parser("run", help="one run on a cluster", parents=parent,
                         description="One run; its summary line goes to stdout, embedded and under mpiexec.")
    add_flags(run, RunConfig)
    run.add_argument("--embedded", action="store_true", help="all hosts in this process (no MPI)")
    quiet_flag(run)
    run.set_defaults(func=cmd_run)
    ver = sub.add_parser("verify", help="bit-identical tokens across paths, layerwise modes and launchers",
                         parents=parent)
    json_flag(ver, "the comparison")
    out_flag(ver, "runs/verify", "the runs' outputs")
    ver.add_argument("--quick", action="store_true", help="fewer agents, embedded only")
    ver.add_argument("--model", default="tiny", help="model preset or checkpoint directory (default tiny)")
    ver.add_argument("--hostfile", metavar="N|FILE", help="check 1P2D and 2P2D across hosts: N made as Linux "
                     "namespaces here (root), or a hostfile's, or 'slurm' for the allocation's (docs/cluster.md)")
    quiet_flag(ver)
    plan.add_parser(sub, parent)
    sim.add_parsers(sub, parent, argv)
    _calibrate_parser(sub, parent)
    workload.add_parser(sub, parent)
    rep = sub.add_parser("report", help="compare runs, real and simulated, in one table (and one figure)",
                         parents=parent)
    rep.add_argument("dirs", nargs="+", metavar="DIR", help="run output directories (`--out` of run, sim, demo)")
    json_flag(rep, "the table (one object per run)")
    plot_flag(rep, "JCT per run, the TTFT CDFs and the storage-NIC balance over time")
    bench = sub.add_parser("bench", help=f"benchmarks: {', '.join(BENCHES)}", parents=parent)
    benches = bench.add_subparsers(dest="bench", required=True, metavar="NAME")
    for name, (module, help_) in BENCHES.items():
        add_lazy(benches, name, module, help_, argv[:2] == ["bench", name], _bench_flags)
    return parser


def _calibrate_parser(sub, parent: list) -> None:
    from dualjax.core.config import number
    from dualjax.core.paths import local_profile
    from dualjax.outputs import output_dir, output_file
    description = (f"Measure this machine into the simulator's `local` hardware profile, written to {local_profile()} "
                   "($DUALJAX_HOME, else $XDG_DATA_HOME/dualjax, else ~/.local/share/dualjax), where `--hardware "
                   "local` reads it from any directory; or with --json FILE to FILE instead (`--hardware FILE` reads "
                   "it). Nothing else is written: the scratch store and runs it measures with are removed when it "
                   "ends.")
    help_ = "measure this machine into the simulator's `local` profile"
    if "calibrate" in sub.choices:  # dualjax/cli/sim.py's older parser, until it drops it: this one replaces it
        cal = sub.choices["calibrate"] = argparse.ArgumentParser(prog=sub.choices["calibrate"].prog, parents=parent,
                                                                 description=description)
    else:
        cal = sub.add_parser("calibrate", parents=parent, help=help_, description=description)
    cal.add_argument("--model", default="small", help="model preset or checkpoint directory to measure (default "
                     "small: the e2e benchmark's, whose runs `sim validate` compares with the simulator's)")
    cal.add_argument("--workload", default="agentic-e2e", help="the workload preset whose pass shapes to measure "
                     "(default agentic-e2e, the e2e benchmark's)")
    cal.add_argument("--decode-slots", type=number(kind=int), default=8,
                     help="sequences a decode host decodes together: the decode step measured (default 8)")
    cal.add_argument("--json", metavar="FILE", type=output_file,
                     help="write the profile to FILE instead of the `local` profile's file (one JSON object)")
    cal.add_argument("--dir", metavar="DIR", type=output_dir, help="directory on the disk whose store read rate to "
                     "measure: the scratch store and runs go to a temporary directory there, removed at the end "
                     "(default: the working directory)")
    quiet_flag(cal)


def _words(argv: list[str]) -> list[str]:
    """`argv` without a leading --log-level: the subcommand's words first."""
    while argv and argv[0].startswith("--log-level"):
        argv = argv[1 if "=" in argv[0] else 2:]
    return argv


def _bench_flags(p: argparse.ArgumentParser) -> None:
    from dualjax.bench.common import add_common
    add_common(p)
    quiet_flag(p)  # the benchmarks' progress: INFO lines (`bench.common.show_progress`), off at WARNING


def dispatch(args) -> int:
    if hasattr(args, "func"):
        return args.func(args)
    import importlib
    return importlib.import_module(f"dualjax.cli.{args.command}").main(args)


def _name(args) -> str:
    """The subcommand as typed, for its error line: `sim ablation`, `bench e2e`, `workload stats`, `report`."""
    sub = (getattr(args, k, None) for k in ("sim_command", "bench", "workload_command"))
    return " ".join(x for x in (args.command, *sub) if x)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    use_compile_cache()
    code = 2
    try:
        args = build_parser(argv).parse_args(argv)
        set_log_level(getattr(args, "log_level", None), quiet=getattr(args, "quiet", False))
        try:
            code = dispatch(args)
        except user_errors() as e:
            print(f"dualjax {_name(args)}: error: {e}", file=sys.stderr)
    finally:  # bad input, a failed host, an interrupt, a scratch --dir: no empty directory made here left behind
        remove_unused_dirs()
    return code


if __name__ == "__main__":
    sys.exit(main())
