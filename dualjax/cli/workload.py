"""`dualjax workload stats|fit|shape`: a workload's statistics against the paper's Table 2, the fits behind
the fitted presets, and the turn-length shape of recorded sessions.

`stats NAME [NAME ...] [--agents N] [--json FILE]` prints and writes, per workload, `agents`, `requests`,
`turns_mean`, per-request means (`append_mean`, `gen_mean`, `context_mean`: the prompt length), per-agent
means of each agent's own means (`append_agent_mean`, `gen_agent_mean`, `context_agent_mean`),
`total_mean` (per agent), `max_total` and `hit_rate` (the simulator's store, `--block-tokens` blocks); for
the paper presets also Table 2 (docs/paper.md §9) and each column's relative error under both readings
(`table_2`: per request, as `paper-64k` is fitted, and per trajectory, as `paper-64k-157` is).
`fit NAME` re-derives a fitted preset's constants (`PAPER_JOINT_FIT`, `HIT_FIT` in dualjax/core/workload.py);
`shape DIR` measures how a session's turn length falls with its turn count (`TRACE_SHAPE`).
"""

from __future__ import annotations

from dualjax.core.workload import length_stats, table_2
from dualjax.outputs import write_json


def add_parser(sub, parent: list) -> None:
    from dualjax.cli.parsing import json_flag
    wl = sub.add_parser("workload", help="workload statistics (`dualjax workload stats NAME --json FILE`)",
                        parents=parent)
    wsub = wl.add_subparsers(dest="workload_command", required=True, metavar="SUBCOMMAND")
    st = wsub.add_parser("stats", help="turns, append, gen, total, mean context and hit rate of workloads, against "
                         "Table 2 for the paper presets (docs/paper.md §9)", parents=parent)
    st.add_argument("names", nargs="+", metavar="NAME", help="workload presets or trajectory files *.jsonl")
    st.add_argument("--agents", type=int, help="override the presets' number of agents")
    st.add_argument("--seed", type=int, default=0, help="workload seed (default 0)")
    st.add_argument("--block-tokens", type=int, default=64, help="KV block size of the hit rate (default 64)")
    json_flag(st, "the statistics (one object; a list for several workloads)")
    fit = wsub.add_parser("fit", help="re-derive a fitted preset's constants (paper-*-N and hit-* presets)",
                          parents=parent)
    fit.add_argument("name", metavar="NAME",
                     help="paper-32k-60, paper-48k-106, paper-64k-157, hit-65, hit-85 or hit-95")
    fit.add_argument("--agents", type=int, help="agents of the fit (default 8,192 for paper presets, 2,048 for hit-*)")
    fit.add_argument("--seed", type=int, default=0, help="workload seed (default 0)")
    json_flag(fit, "the fitted constants")
    sh = wsub.add_parser("shape", help="how recorded sessions' turn length falls with their turn count", parents=parent)
    sh.add_argument("path", metavar="DIR", help="a directory of recorded sessions (docs/workloads.md's format)")
    json_flag(sh, "the shape")


def stats(name: str, agents: int | None = None, seed: int = 0, block_tokens: int = 64) -> dict:
    """The statistics of workload `name` (as the simulator draws it), with Table 2 under both readings when
    the paper has the dataset."""
    from dualjax.core.config import SimConfig
    from dualjax.sim import workload_lengths
    append, gen, _, _ = workload_lengths(SimConfig(workload=name, agents=agents, workload_seed=seed))
    out = {"workload": name, "seed": seed, **length_stats(list(zip(append, gen)), block_tokens)}
    if (table := table_2(out, name)) is not None:
        out["table_2"] = table
    return out


def _print(r: dict) -> None:
    print(f"{r['workload']}: {r['agents']} agents, {r['requests']} requests, turns {r['turns_mean']:.1f}, "
          f"total {r['total_mean']:.0f} (max {r['max_total']}), hit rate {r['hit_rate']:.4f}")
    print(f"  per request:    append {r['append_mean']:.0f}, gen {r['gen_mean']:.0f}, "
          f"mean context {r['context_mean']:.0f}")
    print(f"  per trajectory: append {r['append_agent_mean']:.0f}, gen {r['gen_agent_mean']:.0f}, "
          f"mean context {r['context_agent_mean']:.0f}")
    if (t := r.get("table_2")) is None:
        return
    print(f"  Table 2 {t['dataset']}: " + ", ".join(f"{k.removesuffix('_mean')} {v:,}" for k, v in t["paper"].items()))
    for reading in ("request", "agent"):
        mark = " (fitted)" if reading == t["fitted_reading"] else ""
        print(f"    vs per {'request' if reading == 'request' else 'trajectory'}{mark}: "
              + ", ".join(f"{k.removesuffix('_mean')} {v:+.1%}" for k, v in t[reading]["error"].items()))


def main(args) -> int:
    if args.workload_command == "fit":
        from dualjax.core.workload import fit_workload
        result = fit_workload(args.name, args.agents, args.seed)
        print(", ".join(f"{k} {v}" for k, v in result.items() if k != "error")
              + ("; error " + ", ".join(f"{k} {v:+.2%}" for k, v in result["error"].items()) if "error" in result
                 else ""))
    elif args.workload_command == "shape":
        from dualjax.core.sessions import SessionError, load_sessions, turn_shape
        from dualjax.core.workload import WorkloadError
        try:
            result = {"path": args.path, **turn_shape(load_sessions(args.path))}
        except SessionError as e:
            raise WorkloadError(str(e)) from None
        print(f"{result['sessions']} sessions: context growth per turn ~ turns^-{result['power']:.3f} "
              f"(Pearson r of the logs {result['pearson']:+.2f}), residual log spread {result['spread']:.3f}; "
              f"turns mean {result['turns_mean']:.1f}, log spread {result['turns_log_spread']:.2f}")
    else:
        result = [stats(n, args.agents, args.seed, args.block_tokens) for n in args.names]
        for r in result:
            _print(r)
        result = result[0] if len(result) == 1 else result
    if args.json:
        write_json(args.json, result)
    return 0
