"""The paper's ablation in one run: Basic, + layerwise prefill, + dual-path loading (no scheduling),
+ scheduling (DualPath), and Oracle beside them (docs/paper.md §10, §11), on one cluster and workload.

Steps (name: policy, scheduler, hardware), in `STEPS`:

* `basic`: PE-only reads, no layerwise prefill (a PE loads a batch, then computes it: `basic_ahead`),
  full scheduling;
* `layerwise`: PE-only reads, layerwise prefill;
* `dual-path`: both read paths without the scheduling algorithm (`scheduler` naive: round-robin engines,
  no alpha/beta/Z rules, and a PE packs every ready request: no compute quota). The §7 read-path rule
  (the side with the shorter read queue) is part of the scheduling algorithm, so the path is chosen
  blind to load too: alternating request by request (policy `round-robin`). This is the default
  reading of the paper's "+ dual-path loading" because it puts exactly half the requests on each side
  with nothing drawn (a run is reproducible and has no chance imbalance between the sides);
* `dual-path-random`: the same with a seeded coin per request (policy `random`), the other blind reading;
* `dual-path-queue`: naive engines with DualPath's read-path rule (the shorter read queue): the part of
  the scheduling algorithm that chooses the path, without the parts that choose engines and pack passes;
* `dualpath`: the full DualPath scheduler (inter-engine alpha/beta/Z, the read-path rule and the
  intra-engine quota);
* `oracle`: the full scheduler with free I/O (`profiles.oracle_of`: no storage reads, host-device copies,
  P->D transfers or host buffers);
* `round-robin` (extra): reads alternating sides under the full scheduler, for storage-NIC balance.

`PAPER_STEPS` are the paper's five in its order. `ablation` returns `jct_s`, `vs_basic` (JCT / Basic
JCT - 1) and `snic_max_over_avg`, each keyed by step, and per step the latency percentiles, what the PEs
did and the busiest resources.
"""

from __future__ import annotations

import dataclasses

from dualjax.core.config import SimConfig
from dualjax.sim import simulate
from dualjax.sim.profiles import Hardware, get_hardware, oracle_of

STEPS = (("basic", dict(policy="basic", scheduler="full")),
         ("layerwise", dict(policy="pe-only", scheduler="full")),
         ("dual-path", dict(policy="round-robin", scheduler="naive")),
         ("dual-path-random", dict(policy="random", scheduler="naive")),
         ("dual-path-queue", dict(policy="dualpath", scheduler="naive")),
         ("dualpath", dict(policy="dualpath", scheduler="full")),
         ("oracle", dict(policy="dualpath", scheduler="full", snic_mbps=None)),
         ("round-robin", dict(policy="round-robin", scheduler="full")))
PAPER_STEPS = ("basic", "layerwise", "dual-path", "dualpath", "oracle")


def step_report(cfg: SimConfig, step: str, hardware: Hardware | None = None) -> dict:
    """One step of the ablation on `cfg` (its policy, scheduler and layerwise settings are the step's)."""
    hw = hardware or get_hardware(cfg.hardware)
    changes = dict(STEPS)[step]
    return simulate(dataclasses.replace(cfg, layerwise=None, **changes), progress=False,
                    hardware=oracle_of(hw) if step == "oracle" else hw)


def summary(r: dict) -> dict:
    """What the ablation keeps of a step's report (the simulator's own figures without the hardware)."""
    own = r["sim"]
    return {"requests": r["requests"], "jct_s": r["jct_s"], "tokens_per_s": r["tokens_per_s"],
            "ttft_s": r["ttft_s"], "tpot_s": r["tpot_s"], "ttst_s": r["ttst_s"], "paths": r["paths"],
            "snic_max_over_avg": r["snic_max_over_avg"], "prefill": own["prefill"], "utilisation": own["utilisation"],
            "sim": {k: v for k, v in own.items() if k not in ("hardware", "prefill", "utilisation")},
            "wall_s": own["wall_s"], "events": own["events"]}


def describe(name: str, r: dict) -> str:
    """One line of a step's figures (the ablation's progress)."""
    own = r["sim"]
    return (f"  {name:16s} JCT {r['jct_s']:9.1f} s  TTFT p50 {r['ttft_s']['p50']:7.2f} s  TPOT p50 "
            f"{(r['tpot_s']['p50'] or 0) * 1e3:5.1f} ms  rows/pass {own['prefill']['rows_per_pass'] or 0:5.2f}  "
            f"PE SNIC busy {own['pe_snic_busy_mean']:.0%}  SNIC max/avg {r['snic_max_over_avg'] or float('nan'):.2f}  "
            f"busiest {own['utilisation']['binding']}  ({own['wall_s']:.0f} s)")


def ablation(cfg: SimConfig, log=print, steps: tuple[str, ...] | None = None, hardware: Hardware | None = None) -> dict:
    """Simulate every step on `cfg` (on `hardware`, default `cfg.hardware`; Oracle: the same, I/O free)."""
    out = {"cluster": cfg.cluster.name, "agents": cfg.agents, "workload": cfg.workload, "model": cfg.model,
           "hardware": cfg.hardware, "jct_s": {}, "vs_basic": {}, "snic_max_over_avg": {}, "steps": {}}
    for name, changes in STEPS:
        if steps is not None and name not in steps:
            continue
        r = step_report(cfg, name, hardware)
        out["jct_s"][name] = r["jct_s"]
        out["snic_max_over_avg"][name] = r["snic_max_over_avg"]
        out["steps"][name] = {**changes, **summary(r)}
        log(describe(name, r))
    if "basic" in out["jct_s"]:
        base = out["jct_s"]["basic"]
        out["vs_basic"] = {k: v / base - 1 for k, v in out["jct_s"].items()}
    return out
