"""`dualjax sim paper`: the paper's evaluation points simulated, in one JSON, a markdown table and a figure.

    dualjax sim paper --json FILE [--md FILE] [--plot FILE] [--out DIR] [--jobs N] [--no-large] [--sensitivity]
                      [--max-wall-s S] [--quiet]

On `paper-h800` as `dualjax sim fit` fitted it (or `--hardware FIT_OR_PROFILE`): the ablation at 2P4D x
1,024 and 2,048 agents, DualPath / Basic / Oracle at 512, 2,048 and 4,096 agents, storage-NIC balance
of round-robin reads against DualPath, online TTFT / TTST / TPOT at 0.4 APS, the online capacity of
Basic and DualPath, Basic's loading discipline and layerwise's layers both ways, and 48P96D x 49,152
agents (`--no-large` leaves it out). `--sensitivity` adds the headline with each assumed input at x0.5
and x1.5. Keys: `ablation` {agents: {step: jct_s}}, `offline` {agents: {policy: jct_s}}, `capacity_aps`
{policy: aps}, `snic_max_over_avg` {policy: x}, `online` {ttft_s, ttst_s, tpot_s}, `large` {jct_s,
wall_s}, `mechanisms`, `sensitivity`, `fit` (the fitted inputs, their targets and what they reached),
`paper` (the paper's figures), `details` (every run), `skipped`, `out` (the runs' directory). Points
that would pass `--max-wall-s` are skipped and listed. Progress goes to the terminal, one line per run.

The points run as `dualjax sim sweep` runs its grid (docs/sweep.md): on `--jobs` processes (default: every
core), the longest first, each run's outputs in `--out DIR/<point-id>/` (default: FILE-runs beside
--json); run again with the same --out, the command reads back every point it finished before. The 48P96D
point runs last with no other beside it, so its wall time is that of one `dualjax sim` on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

from dualjax.core.config import number
from dualjax.outputs import output_dir, output_file, write_json, writing
from dualjax.sim.paper import ABLATION_STEPS, OFFLINE, QUICK, Scale, markdown, reproduce
from dualjax.sim.profiles import PAPER_FIT, get_hardware


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", metavar="FILE", type=output_file, required=True,
                   help="write the result as one JSON object to FILE")
    p.add_argument("--md", metavar="FILE", type=output_file, help="also write the markdown table to FILE")
    p.add_argument("--plot", metavar="FILE", type=output_file, help="also draw the figure (PNG) to FILE")
    p.add_argument("--hardware", default="paper-h800",
                   help="paper-h800 (its packaged fit), a fit file of `dualjax sim fit`, or a profile JSON")
    p.add_argument("--no-large", dest="large", action="store_false", help="leave out 48P96D x 49,152 agents")
    p.add_argument("--sensitivity", action="store_true",
                   help="also the headline (2P4D x 2,048) with each assumed input at x0.5 and x1.5")
    p.add_argument("--max-wall-s", type=number(inf_ok=True), default=float("inf"),
                   help="skip points predicted to end past this wall time (default: none skipped)")
    p.add_argument("--quick", action="store_true", help="every point at a tiny scale (2P2D, a few agents: CI)")
    p.add_argument("--out", metavar="DIR", type=output_dir, help="keep each point's run outputs in DIR, read back "
                   "by a later call with the same DIR (default: a temporary directory, removed at the end)")
    p.add_argument("--jobs", type=number(kind=int), metavar="N", help="processes (default: every core)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def main(argv=None, args=None) -> dict:
    """Run alone (`argv`) or from the `dualjax` parser (`args`)."""
    p = argparse.ArgumentParser(prog="dualjax sim paper", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    args = args if args is not None else p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="dualjax-paper-") as scratch:
        return _reproduce(args, args.out or scratch)


def _reproduce(args, out: str) -> dict:
    hw = get_hardware(args.hardware)
    fit_file = _fit_of(args.hardware)
    print(f"sim paper on {hw.name}{' (quick)' if args.quick else ''}: " + hw.notes.split(" Fit: ")[-1])
    from tqdm import tqdm
    result = reproduce(hw, fit_file, QUICK if args.quick else Scale(), args.large, args.sensitivity, args.max_wall_s,
                       log=tqdm.write, out=out, jobs=args.jobs, progress=not args.quiet)
    result["out"] = args.out
    result = json.loads(json.dumps(result))  # the keys as the file has them
    result["table"], result["plot"] = args.md, args.plot
    table = markdown(result)
    if args.md:
        with writing(args.md), open(args.md, "w") as f:
            f.write(table)
    if args.plot:
        with writing(args.plot):
            plot_paper(args.plot, result)
    write_json(args.json, result)
    print(table)
    print(f"-> {', '.join(f for f in (args.json, args.md, args.plot) if f)} ({result['wall_s']:.0f} s)")
    return result


def _fit_of(hardware: str) -> str | None:
    """The fit file behind a `--hardware` (the packaged one for paper-h800), or None."""
    if hardware == "paper-h800":
        return PAPER_FIT if os.path.exists(PAPER_FIT) else None
    if not os.path.isfile(hardware):
        return None
    with open(hardware) as f:  # `get_hardware` read it already: JSON
        d = json.load(f)
    return hardware if isinstance(d, dict) and "fitted" in d else None


def plot_paper(path: str, r: dict) -> None:
    """Four panels: the ablation (with the paper's fitted points), offline JCT by agents, online capacity,
    and storage-NIC balance."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(2, 2, figsize=(12, 8))
    sizes = sorted(r["ablation"], key=int)
    width = 0.8 / len(sizes)
    for i, a in enumerate(sizes):
        ax[0, 0].bar([k + i * width for k in range(len(ABLATION_STEPS))],
                     [r["ablation"][a].get(s) or 0 for s in ABLATION_STEPS], width, label=f"{a} agents")
    marks = [(k + (len(sizes) - 1) * width, r["paper"]["ablation_2048"][s]) for k, s in enumerate(ABLATION_STEPS)
             if s in r["paper"]["ablation_2048"]]
    ax[0, 0].scatter(*zip(*marks), color="k", marker="_", s=400, zorder=3, label="paper (fitted, 2,048)")
    ax[0, 0].set_xticks([k + width * (len(sizes) - 1) / 2 for k in range(len(ABLATION_STEPS))], ABLATION_STEPS)
    ax[0, 0].set(ylabel="JCT (s)", title="ablation")
    ax[0, 0].legend(fontsize=8)
    agents = sorted(r["offline"], key=int)
    for pol in OFFLINE:
        pts = [(int(a), r["offline"][a][pol]) for a in agents if r["offline"][a].get(pol) is not None]
        if pts:
            ax[0, 1].plot(*zip(*pts), marker="o", label=pol)
    ax[0, 1].set(xlabel="agents", ylabel="JCT (s)", title="offline (predictions)")
    ax[0, 1].legend(fontsize=8)
    for k, (panel, key, title) in enumerate(((ax[1, 0], "capacity_aps", "online capacity (APS, predictions)"),
                                             (ax[1, 1], "snic_max_over_avg", "storage-NIC max/avg (predictions)"))):
        names = list(r[key])
        panel.bar(names, [r[key][n] or 0 for n in names], color=["tab:orange", "tab:blue"][: len(names)])
        panel.set(title=title)
    fig.suptitle("dualjax sim paper: " + ("quick scale" if r["scale"]["cluster"] != "2p4d" else "2P4D, paper-64k, "
                                          "DeepSeek-V3.2"))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
