"""`dualjax verify`: the tokens must not depend on how KV was moved.

One fixed workload (the tiny model by default, or `--model` a preset or checkpoint directory; 8 agents
x 6 turns whose prompts cross several blocks)
runs under PE-only, DE-only, a random path per request and the DualPath scheduler; layerwise on
and off; embedded and under mpiexec; and as a reference that keeps no store and recomputes every prompt. Every
store-backed run must produce bit-identical generated tokens, equal to the reference's.

`--hosts` checks a cluster instead: `--hosts N` on N hosts made as Linux namespaces of the machine verify runs on
(`dualjax.runtime.netns`, root: MPI between them can only use the network), `--hosts FILE` on the
hosts of a hostfile (`slurm`: the allocation's). It runs 1P2D with DE reads (every hit block relayed
DE -> PE between hosts) and 2P2D with DualPath's scheduler, each launched as `dualjax run --hostfile`
launches; their tokens must equal the embedded reference's, and MPI must have moved the KV over the
network (`over_network`: each rank shares memory only with ranks on its own host, and on namespaced
hosts their links carried at least the KV bytes the hosts sent). On real hosts `--out` must be a
directory rank 0's host shares with this one.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time

from dualjax.core.config import ClusterSpec, ConfigError, RunConfig
from dualjax.outputs import load_run
from dualjax.runtime.launch import launch_mpi, mpiexec_cmd, run_embedded

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
# (name, cluster, policy, layerwise) of `--hosts`
HOST_RUNS = [("de-layerwise-1p2d-hosts", "1p2d", "de-only", True),
             ("dualpath-layerwise-2p2d-hosts", "2p2d", "dualpath", True)]


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


def _compare(result: dict, name: str, reference: dict, got: dict, note: str = "") -> None:
    result["runs"].append(name)
    for key, want in reference.items():
        if got.get(key) != want:
            result["mismatches"].append({"run": name, "agent": key[0], "turn": key[1], "reference": want,
                                         "got": got.get(key)})
    ok = not any(m["run"] == name for m in result["mismatches"])
    print(f"verify: {name}: {'ok' if ok else 'MISMATCH'}{note}", flush=True)


def verify(out: str, quick: bool = False, agents: int | None = None, turns: int | None = None,
           model: str = "tiny", hosts: int | str | None = None) -> dict:
    base = RunConfig(ClusterSpec(1, 1), model=model, workload="agentic-tiny",
                     agents=agents or (3 if quick else None), turns=turns or (4 if quick else None))
    t0 = time.time()
    reference = run_one(base.replace(use_store=False), "reference", "1p1d", "pe-only", True, "embedded", out)
    result = {"identical": True, "requests": len(reference), "runs": ["reference"], "mismatches": []}
    if hosts:
        result["hosts"] = on_hosts(base, hosts, out, reference, result)
    else:
        for name, cluster, policy, layerwise, launcher in (QUICK if quick else RUNS):
            _compare(result, name, reference, run_one(base, name, cluster, policy, layerwise, launcher, out))
    result["identical"] = not result["mismatches"]
    result["wall_s"] = time.time() - t0
    return result


def _separate(placement: dict) -> bool:
    """Whether every rank shares memory (MPI's COMM_TYPE_SHARED) only with ranks on its own host."""
    host = {r["rank"]: r["host"] for r in placement["ranks"]}
    return all(host[p] == r["host"] for r in placement["ranks"] for p in r["shared_memory_with"])


def _host_run(name: str, cfg: RunConfig, run, net_bytes) -> dict:
    """One HOST_RUNS run, launched with `run` (subprocess.run, or on namespaced hosts); returns its
    placement, and whether MPI moved its KV over the network: every rank shares memory only with ranks
    on its own host, and (where `net_bytes` counts the hosts' links) the links carried at least the KV."""
    shutil.rmtree(cfg.out, ignore_errors=True)
    before = net_bytes() if net_bytes else None
    proc = run(mpiexec_cmd(cfg, quiet=True), capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"verify run {name} failed across hosts: {proc.stderr[-2000:]}")
    with open(os.path.join(cfg.out, "report.json")) as f:
        report = json.load(f)
    placement = report["runtime"]["placement"]
    got = {k: placement[k] for k in ("scheduler", "prefill", "decode")}
    got["kv_bytes"] = sum(h["kv_sent_bytes"] for h in report["hosts"])
    over = _separate(placement)
    if before is not None:  # one engine per node: every KV byte goes from one host to another
        after = net_bytes()
        got["network_bytes"] = sum(after[h]["tx"] - before[h]["tx"] for h in after)
        over = over and got["network_bytes"] >= got["kv_bytes"] > 0
    return got | {"over_network": over}


def on_hosts(base: RunConfig, hosts: int | str, out: str, reference: dict, result: dict) -> dict:
    """HOST_RUNS across hosts, compared with `reference` into `result`: `hosts` namespaced hosts made
    here (`dualjax.runtime.netns`), or the hosts of a hostfile (or `slurm`), started by Hydra's
    launcher. Returns each run's `_host_run` (or why it was skipped: too few hosts). Raises
    NetnsError where namespaced hosts cannot be made."""
    from dualjax.runtime.netns import Hosts
    from dualjax.runtime.placement import Placement, PlacementError, read_nodes
    made = Hosts(hosts) if isinstance(hosts, int) else contextlib.nullcontext()
    runs = {}
    with made:
        hostfile, run = (made.hostfile, made.run) if isinstance(hosts, int) else (hosts, subprocess.run)
        nodes, source = read_nodes(hostfile)
        for name, cluster, policy, layerwise in HOST_RUNS:
            cfg = base.replace(cluster=ClusterSpec.parse(cluster), policy=policy, layerwise=layerwise,
                               out=os.path.join(out, name), store=os.path.join(out, name, "store"), hostfile=hostfile)
            try:
                Placement.plan(cfg.cluster, nodes, source)
            except PlacementError as e:
                runs[name] = {"skipped": str(e)}
                print(f"verify: {name}: skipped ({e})", flush=True)
                continue
            got = runs[name] = _host_run(name, cfg, run, made.net_bytes if isinstance(hosts, int) else None)
            _compare(result, name, reference, tokens_of(cfg.out), f" (scheduler {got['scheduler']}; PE "
                     f"{', '.join(got['prefill'])}; DE {', '.join(got['decode'])}; over the network: "
                     f"{'yes' if got['over_network'] else 'NO'})")
    return runs


def hosts_arg(text: str | None) -> int | str | None:
    """`--hosts`: a number of namespaced hosts (>= 2), or a hostfile (or `slurm`)."""
    if text is None or text == "slurm":
        return text
    if not text.isdigit():
        if not os.path.isfile(text):
            raise ConfigError(f"--hosts: {text} is neither a number of hosts nor a hostfile")
        return text
    if int(text) < 2:
        raise ConfigError(f"--hosts: at least 2 hosts, got {text}")
    return int(text)


def main(args) -> int:
    from dualjax.runtime.netns import NetnsError
    try:
        result = verify(args.out, quick=args.quick, model=getattr(args, "model", "tiny"),
                        hosts=hosts_arg(getattr(args, "hosts", None)))
    except NetnsError as e:
        print(f"dualjax verify: error: --hosts: {e}", file=sys.stderr)
        return 2
    text = json.dumps(result, indent=1)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    summary = {k: v for k, v in result.items() if k != "mismatches"} | {"mismatches": len(result["mismatches"])}
    print(json.dumps(summary))
    networked = all(r.get("over_network", True) for r in result.get("hosts", {}).values())
    return 0 if result["identical"] and networked else 1
