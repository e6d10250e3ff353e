"""`dualjax report DIR...`: several runs side by side in one table and one figure."""

from __future__ import annotations

import os

from dualjax.outputs import load_run
from dualjax.plots import plot_compare

COLUMNS = (("run", "{}"), ("policy", "{}"), ("cluster", "{}"), ("requests", "{}"), ("JCT s", "{:.2f}"),
           ("tok/s", "{:.1f}"), ("hit", "{:.0%}"), ("TTFT p50", "{:.2f}"), ("TTFT p99", "{:.2f}"),
           ("TPOT p50", "{:.3f}"), ("SLO", "{:.0%}"), ("SNIC max/avg", "{}"), ("relay MB", "{:.1f}"))


def row(name: str, r: dict) -> list[str]:
    c = r["config"]["cluster"]
    bal = r.get("snic_max_over_avg")
    values = (name, r["policy"], f"{c['prefill']}p{c['decode']}d", r["requests"], r["jct_s"], r["tokens_per_s"],
              r["hit_rate"], r["ttft_s"]["p50"], r["ttft_s"]["p99"], r["tpot_s"]["p50"] or 0.0,
              r["slo"]["attained"], "-" if bal is None else f"{bal:.2f}", r["relay_bytes"] / 1e6)
    return [fmt.format(v) for (_, fmt), v in zip(COLUMNS, values)]


def main(args) -> int:
    runs = [(os.path.basename(os.path.normpath(d)), *load_run(d)) for d in args.dirs]
    rows = [[c for c, _ in COLUMNS]] + [row(name, r) for name, r, _ in runs]
    widths = [max(len(x[i]) for x in rows) for i in range(len(COLUMNS))]
    for x in rows:
        print("  ".join(v.rjust(w) for v, w in zip(x, widths)))
    for name, r, _ in runs:  # what the KV store saw, summed over hosts
        if r.get("store"):
            print(f"store {name}: " + ", ".join(f"{k} {v}" for k, v in r["store"].items()))
    plot_compare(args.png, runs)
    print(f"figure: {args.png}")
    return 0
