"""`dualjax sim fit`: fit `paper-h800`'s three fitted inputs to the paper's figures and write the fit file.

    dualjax sim fit --json FILE [--tolerance 0.01]

Fits `prefill_half_tokens` to the shape of the paper's Fig. 3 (right), then `efficiency` to DualPath's
JCT (~5,450 s) and `snic_efficiency` to the + layerwise step's (~8,750 s) at 2P4D x 2,048 agents of
paper-64k on DeepSeek-V3.2 (`dualjax/sim/fit.py`), starting from the values the preset has now. Writes
the fit file to `--json FILE` (required): the targets, what the fitted values reach, the fitted rates
beside published physical figures, and every simulation it ran. A fit file is a profile `--hardware
FILE` takes; the `paper-h800` preset reads the packaged `dualjax/sim/paper_h800_fit.json`, which
changes only when it is named explicitly as FILE (in a commit that says why). Each simulation takes
a minute or so; a fit runs 6-12.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from dualjax.core.config import number
from dualjax.outputs import output_file, write_json
from dualjax.sim.fit import POINT, TARGETS, fit_paper
from dualjax.sim.profiles import PAPER_FIT, PAPER_H800


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", metavar="FILE", required=True, type=output_file,
                   help=f"the fit file, one JSON object (required; the packaged profile paper-h800 reads is "
                   f"{PAPER_FIT}: name it to replace it)")
    p.add_argument("--tolerance", type=number(high=0.5), default=0.01,
                   help="relative distance of each JCT from its target that ends the fit (default 0.01)")
    p.add_argument("--workload", default=POINT.workload,
                   help=f"the reading of the paper's 64K dataset the figures are matched on (default {POINT.workload}, "
                   "Table 2 read per request; paper-64k-157 reads it per trajectory, docs/workloads.md)")
    # tests: a small point whose targets come from a known profile (hidden)
    p.add_argument("--agents", type=number(kind=int), default=POINT.agents, help=argparse.SUPPRESS)
    p.add_argument("--turns", type=number(kind=int), help=argparse.SUPPRESS)
    p.add_argument("--cluster", default=POINT.cluster.name, help=argparse.SUPPRESS)
    p.add_argument("--targets", type=json.loads, help=argparse.SUPPRESS)


def main(argv=None, args=None) -> dict:
    """Run alone (`argv`) or from the `dualjax` parser (`args`)."""
    p = argparse.ArgumentParser(prog="dualjax sim fit", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    args = args if args is not None else p.parse_args(argv)
    cfg = dataclasses.replace(POINT, agents=args.agents, turns=args.turns, cluster=args.cluster,
                              workload=args.workload)
    targets = {**TARGETS, **(args.targets or {})}
    print(f"sim fit: {cfg.cluster.name} x {cfg.agents} agents of {cfg.workload}, {cfg.model}; targets: + layerwise "
          f"{targets['layerwise_jct_s']:,.0f} s, DualPath {targets['dualpath_jct_s']:,.0f} s, Fig. 3 {targets['fig3']}")
    fit = fit_paper(PAPER_H800, cfg, targets, args.tolerance)
    fit["command"] = " ".join(["dualjax sim fit", *(sys.argv[3:] if argv is None else argv)])
    write_json(args.json, fit)
    a = fit["achieved"]
    print("fitted: " + ", ".join(f"{k} = {v:.4g}" for k, v in fit["fitted"].items()) +
          f"; + layerwise {a['layerwise_jct_s']:,.0f} s, DualPath {a['dualpath_jct_s']:,.0f} s, Fig. 3 "
          + ", ".join(f"{b}: {v:.2f}x" for b, v in a["fig3"].items()) + f" ({fit['wall_s']:.0f} s) -> {args.json}")
    ph = fit["physical"]
    print(f"storage: {ph['snic_gbs_per_node']:.1f} GB/s per node ({ph['snic_over_threefs_peak']:.0%} of 3FS's "
          f"reported {ph['threefs_client_peak_gbs']:.1f} GB/s client peak; line {ph['snic_line_gbs_per_node']:.0f} "
          f"GB/s); compute: {ph['compute_fraction_of_bf16_peak']:.2f} of the "
          f"{ph['bf16_peak_tflops_per_gpu']:.0f} TFLOP/s bf16 peak")
    return fit
