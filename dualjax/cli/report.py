"""`dualjax report DIR... [--json FILE] [--plot FILE]`: runs side by side, real and simulated alike
(docs/report.md), in one table; with --plot one figure of JCT per run, the TTFT CDFs and the
storage-NIC balance over time."""

from __future__ import annotations

import os

from dualjax.outputs import comparison, load_run, write_json, writing
from dualjax.plots import plot_compare

COLUMNS = (("run", "{}"), ("kind", "{}"), ("policy", "{}"), ("cluster", "{}"), ("requests", "{}"),
           ("JCT s", "{:.2f}"), ("tok/s", "{:.1f}"), ("hit", "{:.0%}"), ("TTFT p50", "{:.2f}"),
           ("TTFT p99", "{:.2f}"), ("TPOT p50", "{:.3f}"), ("SLO", "{:.0%}"), ("SNIC max/avg", "{:.2f}"),
           ("relay MB", "{:.1f}"), ("odd records", "{}"))


def values(name: str, r: dict) -> tuple:
    """One run's row of the table, unformatted."""
    c = r["config"]["cluster"]
    odd = sum(r["workload"]["odd_records"].values())
    return (name, r["kind"], r["policy"], f"{c['prefill']}p{c['decode']}d", r["requests"], r["jct_s"],
            r["tokens_per_s"], r["hit_rate"], r["ttft_s"]["p50"], r["ttft_s"]["p99"], r["tpot_s"]["p50"] or 0.0,
            r["slo"]["attained"], r["snic_max_over_avg"], r["relay_bytes"] / 1e6, odd)


def row(name: str, r: dict) -> list[str]:
    v = values(name, r)
    return [("-" if x is None else fmt.format(x)) for (_, fmt), x in zip(COLUMNS, v)]


def names(dirs: list[str]) -> list[str]:
    """Each directory's last component, or its whole path where two runs would share a name."""
    short = [os.path.basename(os.path.normpath(d)) for d in dirs]
    return [s if short.count(s) == 1 else os.path.normpath(d) for s, d in zip(short, dirs)]


def main(args) -> int:
    runs = [(n, load_run(d, ["ttft"])) for n, d in zip(names(args.dirs), args.dirs)]
    rows = [[c for c, _ in COLUMNS]] + [row(n, run.report) for n, run in runs]
    widths = [max(len(x[i]) for x in rows) for i in range(len(COLUMNS))]
    for x in rows:
        print("  ".join(v.rjust(w) for v, w in zip(x, widths)))
    for n, run in runs:  # what the KV store saw, summed over hosts (a simulated store sees no faults)
        if run.report["kind"] == "real" and any(run.report["store"].values()):
            print(f"store {n}: " + ", ".join(f"{k} {v}" for k, v in run.report["store"].items()))
    if args.json:
        write_json(args.json, [dict(zip((c for c, _ in COLUMNS), values(n, run.report))) for n, run in runs])
    if args.plot:
        with writing(args.plot):
            plot_compare(args.plot, comparison(runs))
        print(f"figure: {args.plot}")
    return 0
