"""The `dualjax` command line.

    dualjax demo [--quick]                      the main job: a small agentic run, PE-only vs dual-path
    dualjax run --cluster 1p1d ... --out DIR    one run (mpiexec by default, --embedded in-process)
    dualjax verify --json FILE                  bit-identical tokens across paths, modes and launchers
    dualjax report DIR... [--png FILE]          compare runs in one table and one figure
    dualjax plan --gpus-per-node 8 ... [--sweep] the P/D ratio window for given hardware (and a simulated sweep)
    dualjax sim --cluster 2p4d ... [--json FILE] simulate a cluster at any scale (same scheduler and policies)
    dualjax sim validate --json FILE            the e2e configurations for real and simulated, compared
    dualjax calibrate                           measure this machine into the simulator's `local` profile
    dualjax bench {model,kvstore,relay,layerwise,e2e} [--json FILE]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import subprocess
import sys

BENCHES = {"model": "benchmarks.model", "kvstore": "benchmarks.kvstore", "relay": "benchmarks.relay",
           "layerwise": "benchmarks.layerwise", "e2e": "benchmarks.e2e"}


def add_run_flags(p: argparse.ArgumentParser) -> None:
    """Flags shared by `dualjax run` and `python -m mpi4py -m launch.main`."""
    p.add_argument("--cluster", default="1p1d", help="PpDd: P prefill hosts, D decode hosts (default 1p1d)")
    p.add_argument("--model", default="tiny", help="model preset (tiny, small, ...)")
    p.add_argument("--workload", default="agentic-tiny",
                   help="preset (agentic-tiny, agentic-small, paper-32k/48k/64k), a trajectory file *.jsonl, "
                        "or mooncake:PATH[:LIMIT[:LENGTH_SCALE]]")
    p.add_argument("--agents", type=int, help="override the preset's number of agents")
    p.add_argument("--turns", type=int, help="override the preset's turns per agent")
    p.add_argument("--policy", default="dualpath", help="read-path policy: basic, pe-only, de-only, round-robin, "
                   "random, dualpath (default)")
    p.add_argument("--aps", type=float, help="online mode: agents arrive as a Poisson process at APS agents/s")
    p.add_argument("--snic-mbps", type=float, help="per-host storage NIC cap in MB/s (default: uncapped)")
    p.add_argument("--layerwise", action=argparse.BooleanOptionalAction, default=True,
                   help="layerwise prefill (default) or load-everything-first (--no-layerwise)")
    p.add_argument("--no-store", action="store_true", help="reference run: no store, every prompt recomputed")
    p.add_argument("--store", help="store directory (default: OUT/store)")
    p.add_argument("--out", required=True, help="output directory for requests.jsonl and report.json")
    p.add_argument("--block-tokens", type=int, default=64)
    p.add_argument("--decode-slots", type=int, default=8)
    p.add_argument("--prefill-chunk", type=int, default=2048, help="most new tokens of a request per prefill pass")
    p.add_argument("--compute-quota-ms", type=float, default=300.0,
                   help="predicted prefill time a PE packs into one pass (default 300)")
    p.add_argument("--pe-buffer-mb", type=float, default=512.0)
    p.add_argument("--de-buffer-mb", type=float, default=512.0)
    p.add_argument("--seed", type=int, default=0, help="workload seed")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--inject-failure", type=int, metavar="RANK", help=argparse.SUPPRESS)


def config_from_args(args):
    from dualjax.config import ClusterSpec, RunConfig
    return RunConfig(cluster=ClusterSpec.parse(args.cluster), model=args.model, workload=args.workload,
                     agents=args.agents, turns=args.turns, policy=args.policy, aps=args.aps, layerwise=args.layerwise,
                     use_store=not args.no_store, snic_mbps=args.snic_mbps, block_tokens=args.block_tokens,
                     decode_slots=args.decode_slots, prefill_chunk=args.prefill_chunk,
                     compute_quota_ms=args.compute_quota_ms, pe_buffer_mb=args.pe_buffer_mb, de_buffer_mb=args.de_buffer_mb,
                     workload_seed=args.seed, store=args.store, out=args.out, inject_failure=args.inject_failure)


def validate(cfg) -> None:
    """Fail fast, before any process starts: presets exist, buffers hold a block, the store matches."""
    import models
    from dualjax.buffers import HostBuffer
    from dualjax.layout import open_store, run_layout
    from dualjax.policies import get_policy
    from dualjax.workload import load_workload
    model_cfg = models.get_config(cfg.model)
    layout = run_layout(cfg)
    get_policy(cfg.policy)
    load_workload(cfg.workload, model_cfg.vocab, cfg.workload_seed, cfg.agents, cfg.turns, cfg.aps)
    HostBuffer("PE", int(cfg.pe_buffer_mb * 2**20)).check_fits(layout.block_bytes)
    HostBuffer("DE", int(cfg.de_buffer_mb * 2**20)).check_fits(layout.block_bytes)
    open_store(cfg)


def mpiexec() -> str:
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    found = beside if os.path.exists(beside) else shutil.which("mpiexec")
    if not found:
        raise SystemExit("mpiexec not found: `pip install mpich` (a dependency of dualjax) provides it")
    return found


def launch_mpi(cfg, argv: list[str]) -> int:
    """Start `mpiexec -n 1+P+D python -m mpi4py -m launch.main ARGV`; returns its exit code."""
    cmd = [mpiexec(), "-n", str(cfg.cluster.size), sys.executable, "-m", "mpi4py", "-m", "launch.main", *argv]
    return subprocess.run(cmd).returncode


def cmd_run(args, argv: list[str]) -> int:
    from dualjax.runtime import run_embedded
    cfg = config_from_args(args)
    validate(cfg)
    if not args.embedded:
        rc = launch_mpi(cfg, [a for a in argv if a != "--embedded"])
        if rc:
            print(f"dualjax run: a host failed (exit code {rc}); see its traceback above", file=sys.stderr)
            return rc
        return 0  # rank 0 printed the summary
    print(summary_line(run_embedded(cfg, progress=not args.quiet)))
    return 0


def cmd_plan(args) -> int:
    from dualjax.planner import pd_window
    w = pd_window(args.gpus_per_node, args.snic_per_node, args.cnic_gbps, args.dram_gbs, args.snic_gbps)
    print(f"P/D window: {w.min_p_over_d} ({float(w.min_p_over_d):.3f}) <= P/D <= {w.max_p_over_d} "
          f"({float(w.max_p_over_d):.3f})")
    print(f"  lower bound set by {w.binding_min}; upper bound set by {' and '.join(w.binding)}")
    result = w.to_json()
    if args.sweep:
        from dualjax.sim.cli import cmd_sweep
        result.update(cmd_sweep(args, w))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


def summary_line(report: dict) -> str:
    return (f"{report['config']['cluster']['prefill']}p{report['config']['cluster']['decode']}d "
            f"{report['policy']}: {report['requests']} requests  JCT {report['jct_s']:.2f} s  {report['tokens_per_s']:.1f} tok/s  "
            f"hit {report['hit_rate']:.1%}  paths {report['paths']}  relay {report['relay_bytes'] / 2**20:.1f} MiB")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:2] == ["sim", "validate"]:
        from dualjax.sim.cli import main_validate
        return main_validate(argv[2:])
    if argv and argv[0] == "bench":
        if len(argv) < 2 or argv[1] not in BENCHES:
            print(f"usage: dualjax bench {{{','.join(BENCHES)}}} [--json FILE] [--quick] ...", file=sys.stderr)
            return 2
        importlib.import_module(BENCHES[argv[1]]).main(argv[2:])
        return 0
    parser = argparse.ArgumentParser(prog="dualjax", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="a small agentic workload on an embedded 1P1D cluster")
    demo.add_argument("--quick", action="store_true", help="fewer agents and turns (CI smoke run)")
    demo.add_argument("--out", default="runs/demo", help="output directory (default runs/demo)")
    run = sub.add_parser("run", help="one run on a cluster")
    add_run_flags(run)
    run.add_argument("--embedded", action="store_true", help="all hosts in this process (no MPI)")
    ver = sub.add_parser("verify", help="bit-identical tokens across paths, layerwise modes and launchers")
    ver.add_argument("--json", metavar="FILE")
    ver.add_argument("--out", default="runs/verify")
    ver.add_argument("--quick", action="store_true", help="fewer agents, embedded only")
    plan = sub.add_parser("plan", help="the P/D ratio window of PAPER.md §8 for given hardware")
    plan.add_argument("--gpus-per-node", type=int, default=8)
    plan.add_argument("--snic-per-node", type=float, default=1.0)
    plan.add_argument("--snic-gbps", type=float, help="Gbit/s per storage NIC (default: --cnic-gbps)")
    plan.add_argument("--cnic-gbps", type=float, default=400.0, help="Gbit/s of one GPU's compute NIC")
    plan.add_argument("--dram-gbs", type=float, default=500.0, help="GB/s of host DRAM bandwidth per node")
    plan.add_argument("--json", metavar="FILE")
    from dualjax.sim.cli import add_parsers, add_sweep_flags
    add_sweep_flags(plan)
    add_parsers(sub)
    rep = sub.add_parser("report", help="compare runs in one table and one figure")
    rep.add_argument("dirs", nargs="+", help="run output directories (each with report.json)")
    rep.add_argument("--png", default="report.png", help="figure path (default report.png)")
    sub.add_parser("bench", help=f"benchmarks: {', '.join(BENCHES)}")
    args = parser.parse_args(argv)
    from dualjax.config import ConfigError
    from kvstore import StoreError
    try:
        if args.command == "demo":
            from dualjax.demo import main as demo_main
            return demo_main(args)
        if args.command == "run":
            return cmd_run(args, argv[1:])
        if args.command == "verify":
            from dualjax.verify import main as verify_main
            return verify_main(args)
        if args.command == "plan":
            return cmd_plan(args)
        if args.command in ("sim", "calibrate"):
            from dualjax.sim.cli import cmd_calibrate, cmd_sim
            return cmd_sim(args) if args.command == "sim" else cmd_calibrate(args)
        if args.command == "report":
            from dualjax.compare import main as report_main
            return report_main(args)
    except (ConfigError, KeyError, ValueError, StoreError, FileNotFoundError) as e:  # bad flags, presets, stores
        # (and SimError, a ValueError): one clear line
        print(f"dualjax {args.command}: error: {e}", file=sys.stderr)
        return 2
    return 2


if __name__ == "__main__":
    sys.exit(main())
