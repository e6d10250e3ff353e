"""`dualjax workload stats NAME [--agents N] [--json FILE]`: a workload's docs/paper.md §9 Table-2 statistics.

Prints and writes `agents`, `turns_mean`, `append_mean`, `gen_mean`, `total_mean` (per agent),
`context_mean` (per request: the prompt length) and `max_total`; for the paper presets also the
table's values and each statistic's relative error against them.
"""

from __future__ import annotations

from dualjax.core.workload import PAPER_TABLE, length_stats
from dualjax.outputs import write_json


def add_parser(sub, parent: list) -> None:
    from dualjax.cli.parsing import json_flag
    wl = sub.add_parser("workload", help="workload statistics (`dualjax workload stats NAME --json FILE`)",
                        parents=parent)
    wsub = wl.add_subparsers(dest="workload_command", required=True, metavar="SUBCOMMAND")
    st = wsub.add_parser("stats", help="turns, append, gen, total and mean context of a workload (docs/paper.md §9)",
                         parents=parent)
    st.add_argument("name", help="a workload preset or a trajectory file *.jsonl")
    st.add_argument("--agents", type=int, help="override the preset's number of agents")
    st.add_argument("--seed", type=int, default=0, help="workload seed (default 0)")
    json_flag(st, "the statistics")


def stats(name: str, agents: int | None = None, seed: int = 0) -> dict:
    """The statistics of workload `name` (as the simulator draws it), with the paper's table when it has one."""
    from dualjax.core.config import SimConfig
    from dualjax.sim import workload_lengths
    append, gen, _, _ = workload_lengths(SimConfig(workload=name, agents=agents, workload_seed=seed))
    out = {"workload": name, "seed": seed, **length_stats(list(zip(append, gen)))}
    if name in PAPER_TABLE:
        keys = ("append_mean", "gen_mean", "total_mean", "context_mean")
        out["paper_table"] = dict(zip(keys, PAPER_TABLE[name]))
        out["error"] = {k: out[k] / v - 1 for k, v in out["paper_table"].items()}
    return out


def main(args) -> int:
    result = stats(args.name, args.agents, args.seed)
    print(f"{args.name}: {result['agents']} agents, {result['requests']} requests, "
          f"turns {result['turns_mean']:.1f}, append {result['append_mean']:.0f}, gen {result['gen_mean']:.0f}, "
          f"total {result['total_mean']:.0f} (max {result['max_total']}), mean context {result['context_mean']:.0f}")
    if "error" in result:
        print("  vs docs/paper.md §9 Table 2: " + ", ".join(f"{k} {v:+.1%}" for k, v in result["error"].items()))
    if args.json:
        write_json(args.json, result)
    return 0
