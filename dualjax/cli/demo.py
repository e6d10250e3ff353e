"""`dualjax demo`: a small agentic workload on an embedded 1P1D cluster, read over the PE path
only and then over both paths, under the same per-host storage NIC cap; prints what each
host's storage NIC and the DE->PE relay carried, and the job completion times (`--quiet`: without the
runs' progress bars)."""

from __future__ import annotations

import os
import shutil

from dualjax.core.config import ClusterSpec, RunConfig
from dualjax.runtime.cluster.runner import check_run, run_embedded

RUNS = (("PE path only", "pe-only"), ("DualPath", "dualpath"))


def _table(rows: list[tuple]) -> str:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(str(c).rjust(w) for c, w in zip(r, widths)) for r in rows)


def main(args) -> int:
    quick = args.quick
    # A storage-bound setting (as in the paper): at these caps loading the hit blocks takes several
    # times longer than computing on this machine, so the second read path can pay off.
    base = RunConfig(ClusterSpec(1, 1), model=args.model or ("tiny" if quick else "small"),
                     workload="agentic-tiny" if quick else "agentic-e2e", agents=4, turns=3 if quick else 4,
                     snic_mbps=2.0 if quick else 5.0)
    warm = os.path.join(args.out, "warmup")
    check_run(base.replace(out=warm))  # bad input (a model, a store) in one line, before the header
    print(f"dualjax demo: {base.model} model, {base.workload} workload, 1P1D embedded, storage NIC cap "
          f"{base.snic_mbps:g} MB/s per host (emulated; reads really come from the store on disk)")
    # Compile the programs first (same shapes, no cap), so neither measured run pays for it.
    shutil.rmtree(warm, ignore_errors=True)
    run_embedded(base.replace(snic_mbps=None, out=warm), progress=False)
    rows = [("read path", "JCT s", "tok/s", "hit", "PE SNIC MB", "DE SNIC MB", "relay MB", "paths")]
    jct = {}
    for label, policy in RUNS:
        out = os.path.join(args.out, policy)
        shutil.rmtree(out, ignore_errors=True)
        r = run_embedded(base.replace(policy=policy, out=out), progress=not args.quiet)
        snic = {h["role"]: h["storage_bytes"] / 1e6 for h in r["hosts"]}
        jct[policy] = r["jct_s"]
        rows.append((label, f"{r['jct_s']:.2f}", f"{r['tokens_per_s']:.1f}", f"{r['hit_rate']:.0%}",
                     f"{snic['prefill']:.1f}", f"{snic['decode']:.1f}", f"{r['relay_bytes'] / 1e6:.1f}",
                     " ".join(f"{k}:{v}" for k, v in sorted(r["paths"].items()))))
    print(_table(rows))
    print(f"speed-up of DualPath over the PE path alone: {jct['pe-only'] / jct['dualpath']:.2f}x "
          f"(outputs under {args.out}/)")
    return 0
