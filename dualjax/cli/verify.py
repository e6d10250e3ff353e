"""`dualjax verify`: the tokens must not depend on how KV was moved.

One fixed workload (the tiny model by default, or `--model` a preset or checkpoint directory; 8 agents
x 6 turns whose prompts cross several blocks)
runs under PE-only, DE-only, a random path per request and the DualPath scheduler; layerwise on
and off; embedded and under mpiexec; and as a reference that keeps no store and recomputes every prompt. Every
store-backed run must produce bit-identical generated tokens, equal to the reference's.
"""

from __future__ import annotations

import json
import os
import shutil
import time

from dualjax.core.config import ClusterSpec, RunConfig
from dualjax.outputs import load_run
from dualjax.runtime.launch import launch_mpi, run_embedded

# (name, cluster, policy, layerwise, launcher)
RUNS = [
    ("pe-layerwise-embedded", "1p1d", "pe-only", True, "embedded"),
    ("de-layerwise-embedded", "1p1d", "de-only", True, "embedded"),
    ("random-layerwise-embedded", "2p1d", "random", True, "embedded"),
    ("dualpath-layerwise-embedded", "2p2d", "dualpath", True, "embedded"),
    ("pe-basic-embedded", "1p1d", "pe-only", False, "embedded"),
    ("de-basic-embedded", "1p2d", "de-only", False, "embedded"),
    ("random-basic-embedded", "1p1d", "random", False, "embedded"),
    ("pe-layerwise-mpiexec", "1p1d", "pe-only", True, "mpiexec"),
    ("de-layerwise-mpiexec", "1p1d", "de-only", True, "mpiexec"),
    ("random-basic-mpiexec", "1p2d", "random", False, "mpiexec"),
]
QUICK = [r for r in RUNS if r[0] in ("pe-layerwise-embedded", "de-layerwise-embedded", "random-basic-embedded")]


def tokens_of(out_dir: str) -> dict[tuple[int, int], list[int]]:
    """Each request's generated token ids in a real run's outputs, by (agent, turn)."""
    t = load_run(out_dir, ["agent", "turn", "generated"]).requests
    return {(int(a), int(k)): g.tolist() for a, k, g in zip(t["agent"], t["turn"], t["generated"])}


def run_one(base: RunConfig, name: str, cluster: str, policy: str, layerwise: bool, launcher: str, out: str):
    cfg = base.replace(cluster=ClusterSpec.parse(cluster), policy=policy, layerwise=layerwise,
                       out=os.path.join(out, name), store=os.path.join(out, name, "store"))
    shutil.rmtree(cfg.out, ignore_errors=True)
    if launcher == "embedded":
        run_embedded(cfg, progress=False)
    elif launch_mpi(cfg, quiet=True) != 0:
        raise RuntimeError(f"verify run {name} failed under mpiexec")
    return tokens_of(cfg.out)


def verify(out: str, quick: bool = False, agents: int | None = None, turns: int | None = None,
           model: str = "tiny") -> dict:
    base = RunConfig(ClusterSpec(1, 1), model=model, workload="agentic-tiny",
                     agents=agents or (3 if quick else None), turns=turns or (4 if quick else None))
    t0 = time.time()
    reference = run_one(base.replace(use_store=False), "reference", "1p1d", "pe-only", True, "embedded", out)
    result = {"identical": True, "requests": len(reference), "runs": ["reference"], "mismatches": []}
    for name, cluster, policy, layerwise, launcher in (QUICK if quick else RUNS):
        got = run_one(base, name, cluster, policy, layerwise, launcher, out)
        result["runs"].append(name)
        for key, want in reference.items():
            if got.get(key) != want:
                result["mismatches"].append({"run": name, "agent": key[0], "turn": key[1], "reference": want,
                                             "got": got.get(key)})
        print(f"verify: {name}: {'ok' if not any(m['run'] == name for m in result['mismatches']) else 'MISMATCH'}",
              flush=True)
    result["identical"] = not result["mismatches"]
    result["wall_s"] = time.time() - t0
    return result


def main(args) -> int:
    result = verify(args.out, quick=args.quick, model=getattr(args, "model", "tiny"))
    text = json.dumps(result, indent=1)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    summary = {k: v for k, v in result.items() if k != "mismatches"} | {"mismatches": len(result["mismatches"])}
    print(json.dumps(summary))
    return 0 if result["identical"] else 1
