"""Path policies on the real runtime: DualPath's and the field's, where loading the hit KV loses and where it wins.

    dualjax bench policies --json FILE [--quick] [--policies A,B,...] [--launchers embedded,mpiexec]
                           [--repeats N] [--max-wall-s S] [--model M]

Each policy of `--policies` (default: dualpath, pe-only, dualpath-recompute, dualpath-deadline, llmd-pull,
hit-ratio, hicache-timeout; `NAME:arg=value,...` sets a policy's arguments) runs the offline agentic workload
(`agentic-e2e` cut to 2 agents x 4 turns: a 1,024-token first round, 64-token appends, 8 generated tokens) on a
1P1D cluster of the `small` model (`--model`), embedded (every host in this process) and under mpiexec (one
process per host; `--launchers`), in two regimes that differ only in the per-host storage NIC cap:

* storage-starved: the cap reads hit KV at an eighth (`STARVED`) of the rate at which a PE computes prompt
  tokens, so loading a hit token takes 8x as long as recomputing it on one NIC, 4x with both hosts' reading;
* storage-rich: the cap reads 8x (`RICH`) that rate: loading wins.

The rate is the one every PE profiles at start-up (`runtime.startup.prefill_tokens_per_s`: new tokens per
second of a 256-token prefill over a 1,024-token cached prefix), measured here before the runs; a hit token's
bytes are what the store reads for it (the block's bytes over its tokens). The crossover cap, at which loading a
hit token takes as long as recomputing it, is their product; each regime's cap is its factor times it.

Every configuration runs `--repeats` times (default 3), round after round; within a round the (launcher,
regime) cells go in turn and the policies in each cell in an order rotated by one every round, so load from
other work on a shared machine falls on every policy alike. Each run starts from an empty store (hits come
from the run's own earlier turns). The JSON gives per regime x launcher x policy the JCT's least, median and
most over the repeats, the medians of TTFT p50 and p99, of the share of hit tokens recomputed (recomputed over
read + recomputed) and of the storage-NIC bytes read; per regime and launcher the best policy (least median
JCT) and each policy's median JCT over the best's; and what was emulated (the caps, the model, the measured
rate, this machine's cores). All hosts share this machine's cores: compute is contended too; only the storage
NIC is emulated.

Wall time is bounded (`--max-wall-s`, default 600 s): before each run its wall is predicted from the
launcher's runs so far (its first run: the slowest run yet, times 3 for mpiexec's start-up); a run predicted
to end past the bound is skipped and listed in `skipped`. --quick (CI): dualpath and dualpath-recompute x the
two regimes x 1 repeat, embedded only, 2 agents x 3 turns.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import pathlib
import shutil
import statistics
import time

from dualjax.bench.common import bench_args, emit, show_progress
from dualjax.bench.e2e import spread
from dualjax.core.config import ClusterSpec, ConfigError, RunConfig, number
from dualjax.core.policies import policy_class
from dualjax.outputs import output_dir

log = logging.getLogger("dualjax.bench.policies")

POLICIES = ["dualpath", "pe-only", "dualpath-recompute", "dualpath-deadline", "llmd-pull", "hit-ratio",
            "hicache-timeout"]
QUICK_POLICIES = ["dualpath", "dualpath-recompute"]
LAUNCHERS = ("embedded", "mpiexec")
MODEL, WORKLOAD, CLUSTER = "small", "agentic-e2e", "1p1d"
AGENTS, TURNS = 2, 4
QUICK_AGENTS, QUICK_TURNS = 2, 3
REPEATS = 3
STARVED, RICH = 0.125, 8.0  # each regime's storage NIC rate in hit tokens/s over the PE's prefill rate
REGIMES = {"storage-starved": STARVED, "storage-rich": RICH}
MPI_STARTUP = 3.0  # mpiexec's first run is predicted at this many times the slowest embedded run


def main(argv=None, args=None) -> dict:
    args = bench_args("policies", __doc__, add_arguments, argv, args)
    show_progress()
    t_start = time.time()
    policies = _policies(args.policies, QUICK_POLICIES if args.quick else POLICIES)
    launchers = ["embedded"] if args.quick and args.launchers is None else _launchers(args.launchers)
    repeats = args.repeats or (1 if args.quick else REPEATS)
    base = RunConfig(ClusterSpec.parse(CLUSTER), model=args.model, workload=WORKLOAD,
                     agents=QUICK_AGENTS if args.quick else AGENTS, turns=QUICK_TURNS if args.quick else TURNS)
    shutil.rmtree(args.out, ignore_errors=True)
    emulated = _emulated(base)
    log.info("prefill %.0f tokens/s x %.0f B per hit token: crossover %.2f MB/s; caps %s",
             emulated["prefill_tokens_per_s"], emulated["hit_bytes_per_token"], emulated["crossover_mbps"],
             emulated["snic_mbps"])
    runs, skipped, walls = {}, {}, {"embedded": [], "mpiexec": []}
    for k in range(repeats):
        for launcher in launchers:
            for regime in REGIMES:
                for i in range(len(policies)):
                    policy = policies[(i + k) % len(policies)]
                    name = f"{launcher}-{regime}-{_slug(policy)}" + (f"-r{k}" if k else "")
                    predicted = _predict(walls, launcher)
                    if time.time() - t_start + predicted > args.max_wall_s:
                        skipped[name] = f"skipped: predicted {predicted:.0f} s would end past --max-wall-s " \
                                        f"{args.max_wall_s:.0f}"
                        log.info("%-48s %s", name, skipped[name])
                        continue
                    cfg = base.replace(out=os.path.join(args.out, name), policy=policy,
                                       snic_mbps=emulated["snic_mbps"][regime])
                    runs[name] = _run(cfg, launcher) | {"launcher": launcher, "regime": regime, "policy": policy,
                                                        "repeat": k}
                    walls[launcher].append(runs[name]["wall_s"])
    result = _result(runs, policies, launchers) | {
        "emulated": emulated, "repeats": repeats, "runs": runs, "skipped": skipped, "max_wall_s": args.max_wall_s,
        "workload": {"name": WORKLOAD, "agents": base.agents, "turns": base.turns, "cluster": CLUSTER},
        "notes": "Per regime x launcher x policy over the repeats: JCT least/median/most, medians of TTFT p50/p99, "
                 "of the share of hit tokens recomputed and of the storage-NIC bytes; `relative_jct` is each "
                 "policy's median JCT over the best's in the same regime and launcher. Hosts share this "
                 "machine's cores; only the per-host storage NIC is emulated."}
    result["wall_s"] = time.time() - t_start
    emit(result, args.json)
    return result


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="runs/bench-policies", type=output_dir, help="where the runs go")
    p.add_argument("--policies", help=f"comma-separated policies, NAME or NAME:arg=value,... (default "
                   f"{','.join(POLICIES)}; --quick {','.join(QUICK_POLICIES)})")
    p.add_argument("--launchers", help="comma-separated, of embedded and mpiexec (default both; --quick embedded)")
    p.add_argument("--repeats", type=number(1, kind=int, low_ok=True), help=f"runs of each configuration "
                   f"(default {REPEATS}, --quick 1): the JSON gives their least, median and most")
    p.add_argument("--max-wall-s", type=number(), default=600.0, help="wall-time bound, s (default 600): a run "
                   "predicted to end past it is skipped")
    p.add_argument("--model", default=MODEL, help=f"model preset (default {MODEL})")


def _policies(text: str | None, default: list[str]) -> list[str]:
    """The policy references of `--policies` ("a,b:x=1,y=2,c": a setting after a comma belongs to the policy
    before it), each checked to resolve (a PolicyError names what is wrong)."""
    if text is None:
        return list(default)
    refs: list[str] = []
    for word in (w.strip() for w in text.split(",")):
        if not word:
            raise ConfigError(f"--policies: an empty name in {text!r}")
        if "=" in word and ":" not in word and refs:
            refs[-1] += "," + word
        else:
            refs.append(word)
    for ref in refs:
        policy_class(ref)
    if len(set(refs)) != len(refs):
        raise ConfigError(f"--policies: a policy twice in {text!r}")
    return refs


def _launchers(text: str | None) -> list[str]:
    if text is None:
        return list(LAUNCHERS)
    words = [w.strip() for w in text.split(",")]
    bad = [w for w in words if w not in LAUNCHERS]
    if bad or not words or len(set(words)) != len(words):
        raise ConfigError(f"--launchers: {text!r}; give embedded, mpiexec or both, comma-separated")
    return words


def _slug(policy: str) -> str:
    return policy.replace(":", "-").replace(",", "-").replace("=", "")


def _emulated(cfg: RunConfig) -> dict:
    """The regimes' storage NIC caps from the PE's prefill rate, measured here as a PE profiles it at start-up,
    and the bytes the store reads per hit token; with the model and this machine's cores."""
    from dualjax.runtime.startup import prefill_tokens_per_s
    from dualjax.runtime.store import run_layout
    layout = run_layout(cfg)
    rate = prefill_tokens_per_s(cfg.model)
    per_token = layout.block_bytes / layout.block_tokens
    crossover = rate * per_token / 1e6
    return {"model": cfg.model, "cores": os.cpu_count(), "prefill_tokens_per_s": rate,
            "hit_bytes_per_token": per_token, "crossover_mbps": crossover,
            "snic_mbps": {regime: f * crossover for regime, f in REGIMES.items()},
            "load_over_recompute": {regime: 1 / f for regime, f in REGIMES.items()},
            "how": "crossover = the PE's prefill rate (runtime.startup.prefill_tokens_per_s: a 256-token prefill "
                   "over 1,024 cached tokens, the start-up profile) x the store's bytes per hit token; each "
                   "regime's per-host storage NIC cap is its factor times it, so loading a hit token takes "
                   "load_over_recompute times as long as recomputing it on one NIC"}


def _run(cfg: RunConfig, launcher: str) -> dict:
    """One run of `cfg` by `launcher` into `cfg.out` (emptied first): its figures, or its error."""
    from dualjax.runtime.cluster.runner import check_run, failed_hosts, launch_mpi, run_embedded
    shutil.rmtree(cfg.out, ignore_errors=True)
    check_run(cfg, embedded=launcher == "embedded")
    t0 = time.time()
    if launcher == "embedded":
        r = run_embedded(cfg, progress=False)
    else:
        rc = launch_mpi(cfg, quiet=True)
        path = os.path.join(cfg.out, "report.json")
        if rc or not os.path.exists(path):
            why = "".join(pathlib.Path(p).read_text() for p in failed_hosts(cfg.out))[-2000:]
            log.warning("%s: mpiexec exit code %s", cfg.out, rc)
            return {"wall_s": time.time() - t0, "error": f"mpiexec exit code {rc}: {why}"}
        with open(path) as f:
            r = json.load(f)
    out = figures(r) | {"wall_s": time.time() - t0}
    log.info("%-48s JCT %6.2f s  wall %6.1f s  recomputed %5.1f%%  SNIC %6.1f MB  paths %s",
             os.path.basename(cfg.out), r["jct_s"], out["wall_s"], 100 * (out["recomputed_share"] or 0),
             out["storage_bytes"] / 1e6, r["paths"])
    return out


def figures(report: dict) -> dict:
    """A run's figures from its report.json: JCT, TTFT p50/p99, the share of hit tokens recomputed (of the
    stored prefix's tokens: those read, `hit_tokens`, and those recomputed instead), the storage-NIC bytes
    over its hosts, their balance, the paths."""
    hit = report["hit_tokens"]
    return {"jct_s": report["jct_s"], "ttft_p50_s": report["ttft_s"]["p50"], "ttft_p99_s": report["ttft_s"]["p99"],
            "hit_tokens": hit, "recomputed_tokens": report["recomputed_tokens"],
            "recomputed_share": report["recomputed_tokens"] / stored if (stored := hit + report["recomputed_tokens"])
            else None,
            "storage_bytes": sum(h["storage_bytes"] for h in report["hosts"]),
            "snic_max_over_avg": report["snic_max_over_avg"], "paths": report["paths"]}


def _predict(walls: dict, launcher: str) -> float:
    """A run's predicted wall: the slowest of its launcher's runs so far; mpiexec's first, MPI_STARTUP times
    the slowest embedded run; the first run of all, none (it always runs)."""
    if walls[launcher]:
        return max(walls[launcher])
    if launcher == "mpiexec" and walls["embedded"]:
        return MPI_STARTUP * max(walls["embedded"])
    return 0.0


def _median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _result(runs: dict, policies: list[str], launchers: list[str]) -> dict:
    """The table (regime -> launcher -> policy), the best per regime and launcher, each policy's median JCT
    over the best's."""
    table: dict = {}
    best: dict = {}
    relative: dict = {}
    for regime in REGIMES:
        for launcher in launchers:
            cell = {}
            for policy in policies:
                done = [r for r in runs.values() if "error" not in r
                        and (r["regime"], r["launcher"], r["policy"]) == (regime, launcher, policy)]
                if not done:
                    continue
                cell[policy] = {"jct_s": spread([r["jct_s"] for r in done]),
                                **{k: _median([r[k] for r in done]) for k in (
                                    "ttft_p50_s", "ttft_p99_s", "recomputed_share", "storage_bytes")}}
            if not cell:
                continue
            table.setdefault(regime, {})[launcher] = cell
            top = min(cell, key=lambda p: cell[p]["jct_s"]["median"])
            best.setdefault(regime, {})[launcher] = top
            relative.setdefault(regime, {})[launcher] = {p: c["jct_s"]["median"] / cell[top]["jct_s"]["median"]
                                                         for p, c in cell.items()}
    return {"policies": policies, "launchers": launchers, "regimes": list(REGIMES), "table": table, "best": best,
            "relative_jct": relative}


if __name__ == "__main__":
    main()
