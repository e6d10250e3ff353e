"""The paper's ablation in one run: Basic, + layerwise prefill, + dual-path loading (naive scheduler),
+ the full scheduler, and Oracle beside them (docs/paper.md §9, §9), on one cluster and workload.

Steps (name: policy, layerwise, scheduler, hardware):

* `basic`: PE-only reads, no layerwise prefill, full scheduler;
* `layerwise`: PE-only reads, layerwise prefill;
* `dual-path`: DualPath's read-path choice with the naive scheduler (round-robin engines, no
  alpha/beta/Z rules);
* `dualpath`: the full DualPath scheduler;
* `oracle`: the full scheduler with free storage reads and transfers;
* `round-robin` (extra): reads alternating sides under the full scheduler, for storage-NIC balance.

`ablation` returns `jct_s`, `vs_basic` (JCT / Basic JCT - 1) and `snic_max_over_avg`, each keyed by
step, and per step the latency percentiles, what the PEs did and the busiest resources.
"""

from __future__ import annotations

import dataclasses

from dualjax.core.config import SimConfig
from dualjax.sim import simulate

STEPS = (("basic", dict(policy="basic", scheduler="full")),
         ("layerwise", dict(policy="pe-only", scheduler="full")),
         ("dual-path", dict(policy="dualpath", scheduler="naive")),
         ("dualpath", dict(policy="dualpath", scheduler="full")),
         ("oracle", dict(policy="dualpath", scheduler="full", hardware="oracle", snic_mbps=None)),
         ("round-robin", dict(policy="round-robin", scheduler="full")))


def ablation(cfg: SimConfig, log=print, steps: tuple[str, ...] | None = None) -> dict:
    """Simulate every step on `cfg` (its policy, scheduler and layerwise settings are the steps')."""
    out = {"cluster": cfg.cluster.name, "agents": cfg.agents, "workload": cfg.workload, "model": cfg.model,
           "hardware": cfg.hardware, "jct_s": {}, "vs_basic": {}, "snic_max_over_avg": {}, "steps": {}}
    for name, changes in STEPS:
        if steps is not None and name not in steps:
            continue
        r = simulate(dataclasses.replace(cfg, layerwise=None, **changes), progress=False)
        own = r["sim"]
        out["jct_s"][name] = r["jct_s"]
        out["snic_max_over_avg"][name] = r["snic_max_over_avg"]
        out["steps"][name] = {
            **changes, "requests": r["requests"], "tokens_per_s": r["tokens_per_s"], "ttft_s": r["ttft_s"],
            "tpot_s": r["tpot_s"], "ttst_s": r["ttst_s"], "paths": r["paths"], "prefill": own["prefill"],
            "utilisation": own["utilisation"], "wall_s": own["wall_s"]}
        log(f"  {name:12s} JCT {r['jct_s']:9.1f} s  TTFT p50 {r['ttft_s']['p50']:7.2f} s  TPOT p50 "
            f"{(r['tpot_s']['p50'] or 0) * 1e3:5.1f} ms  rows/pass {own['prefill']['rows_per_pass'] or 0:5.2f}  "
            f"SNIC max/avg {r['snic_max_over_avg'] or float('nan'):.2f}  busiest {own['utilisation']['binding']}  "
            f"({own['wall_s']:.0f} s)")
    if "basic" in out["jct_s"]:
        base = out["jct_s"]["basic"]
        out["vs_basic"] = {k: v / base - 1 for k, v in out["jct_s"].items()}
    return out
