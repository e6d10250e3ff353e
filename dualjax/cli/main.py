"""The `dualjax` command line.

    dualjax demo [--quick] [--model M]          the main job: a small agentic run, PE-only vs dual-path
    dualjax run --cluster 1p1d ... --out DIR    one run (mpiexec by default, --embedded in-process)
                                                --model: a preset or a checkpoint directory (docs/models.md)
    dualjax verify [--model M] --json FILE      bit-identical tokens across paths, modes and launchers
    dualjax report DIR... [--png FILE]          compare runs in one table and one figure
    dualjax plan --gpus-per-node 8 ... [--sweep] the P/D ratio window for given hardware (and a simulated sweep)
    dualjax sim --cluster 2p4d ... [--json FILE] simulate a cluster at any scale (same scheduler and policies)
    dualjax sim validate --json FILE            the e2e configurations for real and simulated, compared
    dualjax sim ablation --cluster 2p4d ...     Basic, + layerwise, + dual-path, + scheduler, Oracle (JSON + PNG)
    dualjax workload stats NAME [--json FILE]   a workload's turns, append, gen, total and mean context
    dualjax calibrate                           measure this machine into the simulator's `local` profile
    dualjax bench {model,kvstore,relay,layerwise,e2e,dataplane} [--json FILE]

Bad input (flags, presets, files, stores) ends with one line naming what was wrong and exit code 2;
anything else is a bug and shows its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from dualjax.cli.errors import user_errors
from dualjax.core.config import RunConfig, add_flags, from_args, use_compile_cache
from dualjax.outputs import output_dir, output_file

BENCHES = {"model": "dualjax.bench.model", "kvstore": "dualjax.bench.kvstore", "relay": "dualjax.bench.relay",
           "layerwise": "dualjax.bench.layerwise", "e2e": "dualjax.bench.e2e", "dataplane": "dualjax.bench.dataplane"}


def cmd_run(args) -> int:
    from dualjax.runtime.launch import check_run, failed_hosts, launch_mpi, run_embedded, summary_line
    from dualjax.runtime.preflight import REFUSED
    cfg = from_args(RunConfig, args)
    check_run(cfg, embedded=args.embedded)
    if not args.embedded:
        rc = launch_mpi(cfg, quiet=args.quiet)
        if rc and rc != REFUSED:  # a refusal is rank 0's one line already
            print(f"dualjax run: a host failed (exit code {rc})", file=sys.stderr)
            for path in failed_hosts(cfg.out):  # mpiexec may have ended the job before it forwarded the host's print
                with open(path) as f:
                    print(f"{path}:\n{f.read()}", file=sys.stderr)
        return rc  # on success rank 0 printed the summary
    print(summary_line(run_embedded(cfg, progress=not args.quiet)))
    return 0


def build_parser() -> argparse.ArgumentParser:
    from dualjax.cli import plan, sim, workload
    parser = argparse.ArgumentParser(prog="dualjax", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="a small agentic workload on an embedded 1P1D cluster")
    demo.add_argument("--quick", action="store_true", help="fewer agents and turns, the tiny model (CI smoke run)")
    demo.add_argument("--model", help="model preset or checkpoint directory (default: small, or tiny with --quick)")
    demo.add_argument("--out", default="runs/demo", type=output_dir, help="output directory (default runs/demo)")
    run = sub.add_parser("run", help="one run on a cluster")
    add_flags(run, RunConfig)
    run.add_argument("--embedded", action="store_true", help="all hosts in this process (no MPI)")
    run.add_argument("--quiet", action="store_true", help="no progress bar")
    ver = sub.add_parser("verify", help="bit-identical tokens across paths, layerwise modes and launchers")
    ver.add_argument("--json", metavar="FILE", type=output_file)
    ver.add_argument("--out", default="runs/verify", type=output_dir)
    ver.add_argument("--quick", action="store_true", help="fewer agents, embedded only")
    ver.add_argument("--model", default="tiny", help="model preset or checkpoint directory (default tiny)")
    ver.add_argument("--hosts", metavar="N|FILE", help="check 1P2D and 2P2D across hosts: N made as Linux namespaces "
                     "here (root), or a hostfile's (docs/cluster.md)")
    plan.add_parser(sub)
    sim.add_parsers(sub)
    workload.add_parser(sub)
    rep = sub.add_parser("report", help="compare runs in one table and one figure")
    rep.add_argument("dirs", nargs="+", help="run output directories (each with report.json)")
    rep.add_argument("--png", default="report.png", type=output_file, help="figure path (default report.png)")
    sub.add_parser("bench", help=f"benchmarks: {', '.join(BENCHES)}")
    return parser


def dispatch(args) -> int:
    if args.command == "run":
        return cmd_run(args)
    module = {"demo": "demo", "verify": "verify", "plan": "plan", "sim": "sim", "calibrate": "calibrate",
              "report": "report", "workload": "workload"}[args.command]
    return importlib.import_module(f"dualjax.cli.{module}").main(args)


def _own_parser(command: list[str], module: str, argv: list[str]) -> int:
    """`module.main(argv)`, a command with its own parser, its bad input reported in one line."""
    try:
        importlib.import_module(module).main(argv)
    except user_errors() as e:
        print(f"dualjax {' '.join(command)}: error: {e}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    use_compile_cache()
    if argv[:2] == ["sim", "ablation"]:
        from dualjax.cli.sim import ablation_main
        return ablation_main(argv[2:])
    if argv[:2] == ["sim", "validate"]:
        return _own_parser(argv[:2], "dualjax.cli.validate", argv[2:])
    if argv[:1] == ["bench"]:
        if len(argv) < 2 or argv[1] not in BENCHES:
            print(f"usage: dualjax bench {{{','.join(BENCHES)}}} [--json FILE] [--quick] ...", file=sys.stderr)
            return 2
        return _own_parser(argv[:2], BENCHES[argv[1]], argv[2:])
    args = build_parser().parse_args(argv)
    try:
        return dispatch(args)
    except user_errors() as e:
        print(f"dualjax {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
