"""The tokens must not depend on how KV was moved: the runs `dualjax verify` compares.

One fixed workload (the tiny model by default, or `--model` a preset or checkpoint directory; 8 agents
x 6 turns whose prompts cross several blocks)
runs under PE-only, DE-only, a random path per request, the DualPath scheduler and plans (`PlanSweep`:
every split of a request's hit blocks at a block boundary, and recomputed tails of none, some and all of
them; the built-in split and recompute policies); read deadlines (`DeadlineSweep`: on either side's read,
firing before it starts, during it and after its end, behind a 1 MB/s storage NIC; `dualpath-deadline`
and `hicache-timeout`); layerwise on and off; embedded and under mpiexec; and as a reference that keeps
no store and recomputes every prompt. Every store-backed run must produce bit-identical generated
tokens, equal to the reference's.

`--hostfile` checks a cluster instead: `--hostfile N` on N hosts made as Linux namespaces of the machine
verify runs on (`dualjax.runtime.cluster.netns`, root: MPI between them can only use the network), `--hostfile FILE`
on the hosts of a hostfile (`slurm`: the allocation's). It runs 1P2D with DE reads (every hit block relayed
DE -> PE between hosts) and 2P2D with DualPath's scheduler, each launched as `dualjax run --hostfile`
launches; their tokens must equal the embedded reference's, and MPI must have moved the KV over the
network (`over_network`: each rank shares memory only with ranks on its own host, and on namespaced
hosts their links carried at least the KV bytes the hosts sent). On real hosts `--out` must be a
directory rank 0's host shares with this one.

`verify` prints a line per run as it ends (`progress=False`: none) and returns the comparison.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import shutil
import subprocess
import time

from dualjax.core.config import ClusterSpec, RunConfig
from dualjax.core.policies import Plan, Policy
from dualjax.outputs import load_run
from dualjax.runtime.cluster.runner import launch_mpi, mpiexec_cmd, run_embedded


class PlanSweep(Policy):
    """Every plan a request's hit blocks allow, in turn (verify's policy; stateful, so which request gets
    which plan depends on the order of placement, the plans made do not). The n-th request with k hit
    blocks (n from 0): for n <= k, the DE reads the first n blocks and the PE the rest (every block
    boundary, both ends included: all blocks on one side), nothing recomputed; n = k + 1 recomputes all
    k; later ones recompute a tail of 1 .. k - 1 blocks in turn and split the rest in the middle."""
    name = "plan-sweep"

    def __init__(self):
        self.seen = collections.Counter()

    def path(self, request, pe, de) -> Plan:
        block = request.block_tokens
        k = request.hit_tokens // block
        n, self.seen[k] = self.seen[k], self.seen[k] + 1
        if n <= k:
            return Plan(de_tokens=n * block)
        tail = k if n == k + 1 or k < 2 else 1 + (n - k - 2) % (k - 1)
        return Plan(de_tokens=(k - tail) // 2 * block, recompute_tokens=tail * block)


class DeadlineSweep(Policy):
    """Read deadlines that fire before a read starts, during it and after its end, on either side's read, in
    turn (verify's policy): the n-th request with hit blocks gets (side, deadline) number n of `CASES`. During:
    1.5 blocks' time at its node's storage NIC rate (a read of 2 or more blocks cannot end in it)."""
    name = "deadline-sweep"
    CASES = (("pe", "before"), ("de", "during"), ("pe", "during"), ("de", "after"), ("pe", "after"),
             ("de", "before"))

    def __init__(self):
        self.n = 0

    def path(self, request, pe, de):
        if not request.hit_tokens:
            return "pe"
        side, when = self.CASES[self.n % len(self.CASES)]
        self.n += 1
        rate = (pe if side == "pe" else de).read_tokens_per_s
        during = 1.5 * request.block_tokens / rate if rate and rate != float("inf") else 0.05
        deadline = {"before": 0.0, "during": during, "after": 1e3}[when]
        return Plan(de_tokens=request.hit_tokens if side == "de" else 0, deadline_s=deadline)


PLAN_SWEEP = "dualjax.runtime.verify:PlanSweep"
DEADLINE_SWEEP = "dualjax.runtime.verify:DeadlineSweep"
DEADLINE_MBPS = 1.0  # the deadline runs' storage NICs: a block of `tiny` (32 KiB) takes 33 ms, reads are cut mid-way
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
    ("plans-layerwise-embedded", "1p1d", PLAN_SWEEP, True, "embedded"),
    ("plans-basic-embedded", "1p2d", PLAN_SWEEP, False, "embedded"),
    ("split-layerwise-embedded", "2p2d", "dualpath-split", True, "embedded"),
    ("recompute-layerwise-embedded", "2p1d", "dualpath-recompute", True, "embedded"),
    ("plans-layerwise-mpiexec", "1p2d", PLAN_SWEEP, True, "mpiexec"),
    ("deadlines-layerwise-embedded", "1p1d", DEADLINE_SWEEP, True, "embedded"),
    ("dualpath-deadline-layerwise-embedded", "2p2d", "dualpath-deadline", True, "embedded"),
    ("hicache-timeout-layerwise-embedded", "1p1d", "hicache-timeout:timeout_base_s=0.05", True, "embedded"),
    ("deadlines-layerwise-mpiexec", "1p2d", DEADLINE_SWEEP, True, "mpiexec"),
]
DEADLINES = {DEADLINE_SWEEP, "dualpath-deadline", "hicache-timeout:timeout_base_s=0.05"}  # behind DEADLINE_MBPS
QUICK = [r for r in RUNS if r[0] in ("pe-layerwise-embedded", "de-layerwise-embedded", "random-basic-embedded",
                                     "plans-layerwise-embedded", "deadlines-layerwise-embedded")]
# (name, cluster, policy, layerwise) of `--hostfile`
HOST_RUNS = [("de-layerwise-1p2d-hosts", "1p2d", "de-only", True),
             ("dualpath-layerwise-2p2d-hosts", "2p2d", "dualpath", True)]


def tokens_of(out_dir: str) -> dict[tuple[int, int], list[int]]:
    """Each request's generated token ids in a real run's outputs, by (agent, turn)."""
    t = load_run(out_dir, ["agent", "turn", "generated"]).requests
    return {(int(a), int(k)): g.tolist() for a, k, g in zip(t["agent"], t["turn"], t["generated"])}


def plans_of(out_dir: str, block_tokens: int) -> dict:
    """The plans a real run made: requests per path, and per number of hit blocks in the store (k), the
    DE's share (blocks) of the plans that recomputed nothing and the tails (blocks) recomputed."""
    t = load_run(out_dir, ["path", "hit_tokens", "de_tokens", "recomputed_tokens"]).requests
    splits, tails = collections.defaultdict(set), collections.defaultdict(set)
    for hit, de, rec in zip(t["hit_tokens"], t["de_tokens"], t["recomputed_tokens"]):
        k = int(hit + rec) // block_tokens
        if k:
            (tails[k] if rec else splits[k]).add(int(rec if rec else de) // block_tokens)
    return {"paths": dict(collections.Counter(str(p) for p in t["path"])),
            "de_blocks": {k: sorted(v) for k, v in sorted(splits.items())},
            "recomputed_blocks": {k: sorted(v) for k, v in sorted(tails.items())}}


def deadlines_of(out_dir: str) -> dict:
    """What a real run's read deadlines did: requests with hit blocks by what their reads kept by the
    deadline: none (fired before the read, or before its first block), part (fired during it) or all."""
    t = load_run(out_dir, ["hit_tokens", "recomputed_tokens"]).requests
    kept = collections.Counter("none" if not hit else "part" if rec else "all"
                               for hit, rec in zip(t["hit_tokens"], t["recomputed_tokens"]) if hit + rec)
    return {k: kept[k] for k in ("none", "part", "all")}


def run_one(base: RunConfig, name: str, cluster: str, policy: str, layerwise: bool, launcher: str, out: str):
    cfg = base.replace(cluster=ClusterSpec.parse(cluster), policy=policy, layerwise=layerwise,
                       out=os.path.join(out, name), store=os.path.join(out, name, "store"))
    if policy in DEADLINES:
        cfg = cfg.replace(snic_mbps=DEADLINE_MBPS)
    shutil.rmtree(cfg.out, ignore_errors=True)
    if launcher == "embedded":
        run_embedded(cfg, progress=False)
    elif launch_mpi(cfg, quiet=True) != 0:
        raise RuntimeError(f"verify run {name} failed under mpiexec")
    return tokens_of(cfg.out)


def _compare(result: dict, name: str, reference: dict, got: dict, note: str = "", progress: bool = True) -> None:
    result["runs"].append(name)
    for key, want in reference.items():
        if got.get(key) != want:
            result["mismatches"].append({"run": name, "agent": key[0], "turn": key[1], "reference": want,
                                         "got": got.get(key)})
    ok = not any(m["run"] == name for m in result["mismatches"])
    if progress:
        print(f"verify: {name}: {'ok' if ok else 'MISMATCH'}{note}", flush=True)


def verify(out: str, quick: bool = False, agents: int | None = None, turns: int | None = None,
           model: str = "tiny", hosts: int | str | None = None, progress: bool = True) -> dict:
    base = RunConfig(ClusterSpec(1, 1), model=model, workload="agentic-tiny",
                     agents=agents or (3 if quick else None), turns=turns or (4 if quick else None))
    t0 = time.time()
    reference = run_one(base.replace(use_store=False), "reference", "1p1d", "pe-only", True, "embedded", out)
    result = {"identical": True, "requests": len(reference), "runs": ["reference"], "mismatches": []}
    if hosts:
        result["hosts"] = on_hosts(base, hosts, out, reference, result, progress)
    else:
        for name, cluster, policy, layerwise, launcher in (QUICK if quick else RUNS):
            _compare(result, name, reference, run_one(base, name, cluster, policy, layerwise, launcher, out),
                     progress=progress)
            if policy == PLAN_SWEEP:
                result.setdefault("plans", {})[name] = plans_of(os.path.join(out, name), base.block_tokens)
            if policy in DEADLINES:
                result.setdefault("deadlines", {})[name] = deadlines_of(os.path.join(out, name))
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


def on_hosts(base: RunConfig, hosts: int | str, out: str, reference: dict, result: dict,
             progress: bool = True) -> dict:
    """HOST_RUNS across hosts, compared with `reference` into `result`: `hosts` namespaced hosts made
    here (`dualjax.runtime.cluster.netns`), or the hosts of a hostfile (or `slurm`), started by Hydra's
    launcher. Returns each run's `_host_run` (or why it was skipped: too few hosts). Raises
    NetnsError where namespaced hosts cannot be made."""
    from dualjax.runtime.cluster.netns import Hosts
    from dualjax.runtime.cluster.placement import Placement, PlacementError, read_nodes
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
                if progress:
                    print(f"verify: {name}: skipped ({e})", flush=True)
                continue
            got = runs[name] = _host_run(name, cfg, run, made.net_bytes if isinstance(hosts, int) else None)
            _compare(result, name, reference, tokens_of(cfg.out), f" (scheduler {got['scheduler']}; PE "
                     f"{', '.join(got['prefill'])}; DE {', '.join(got['decode'])}; over the network: "
                     f"{'yes' if got['over_network'] else 'NO'})", progress)
    return runs
