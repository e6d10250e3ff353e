"""Golden simulator runs: a dozen small settings that together reach every mechanism and policy of the
simulator, and the fingerprint of each run (JCT, events, a sha256 of every request column, of the host
records and of the PE and link summaries). `golden.json` holds the blessed fingerprints and
`test_golden.py` checks that the code still gives them: a change meant to be exact (speed, structure)
leaves every one unmoved. A change meant to move results re-blesses in the same commit and says why:

    python -m tests.dualjax.sim.golden --bless [CASE ...]    # re-run and write golden.json
    python -m tests.dualjax.sim.golden [CASE ...]            # re-run and compare, with each case's wall time

A case's settings are `SimConfig` fields (the cluster as `PpDd`), plus `hw`: `Hardware` fields replacing
the named profile's. A workload of `{sessions}` or `{trajectories}` is a small recorded trace written by
`_sessions` or `_trajectories` below into a temporary directory (no public trace is needed).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import sys
import tempfile
import time

import numpy as np

from dualjax.core.config import SimConfig
from dualjax.sim import build
from dualjax.sim.profiles import get_hardware

GOLDEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "golden.json")
BLESS = "python -m tests.dualjax.sim.golden --bless"

# 2P4D on the paper's 64K workload with enough agents that requests queue for the PEs (the scheduler's
# alpha/beta/Z rules and DE memory bind) and Basic's JCT is ~25 % over DualPath's, each run about a second.
LOADED = dict(cluster="2p4d", workload="paper-64k", agents=1024, turns=12)

CASES: dict[str, dict] = {
    "dualpath": dict(LOADED),
    "basic": dict(LOADED, policy="basic"),
    # Basic loading one batch ahead into the host buffer, with PE device memory that binds
    "basic-ahead-host-hbm": dict(LOADED, policy="basic", basic_ahead=1, basic_lands="host", pe_hbm_mb=5_000),
    "layerwise-pe-only": dict(LOADED, policy="pe-only"),
    "naive": dict(LOADED, scheduler="naive"),
    "oracle": dict(LOADED, hardware="oracle"),
    "dualpath-split": dict(LOADED, policy="dualpath-split"),
    # storage slow enough that recomputing a hit tail ends requests sooner (most requests recompute some)
    "dualpath-recompute": dict(LOADED, agents=64, turns=16, policy="dualpath-recompute", snic_mbps=100),
    # one layer of KV in device memory at a time, reads alternating sides
    "round-robin-1-layer": dict(LOADED, policy="round-robin", layerwise_layers=1),
    # compute NICs share their line evenly between KV and model (EP) traffic
    "kv-priority-off": dict(LOADED, hw=dict(kv_priority=False)),
    "no-store": dict(LOADED, agents=128, use_store=False),
    # online: agents arrive as a Poisson process
    "online": dict(cluster="4p8d", workload="paper-64k", agents=256, turns=30, aps=0.3),
    "48p96d": dict(cluster="48p96d", workload="paper-32k", agents=256),
    # a dense model (no expert parallelism) within its 32K context
    "qwen": dict(cluster="2p4d", model="qwen2.5-7b", workload="paper-32k", agents=128),
    # recorded sessions: their own prompts, hash-id hits and recorded pauses
    "sessions-think": dict(cluster="2p4d", workload="sessions:{sessions}", agents=24, think_time="recorded"),
    # a trajectory file with synthetic think time, on a `local`-like measured profile: one GPU per node,
    # shared cores (contention), a padded pass table, the runtime's attention fit and a decode fit
    "local-trajectories": dict(
        cluster="1p2d", model="small", workload="{trajectories}", policy="dualpath",
        hw=dict(gpus_per_node=1, ep_gpus=0, ep_latency_us=[], loopbacks=False, padded=True,
                snic_bytes_per_s=400e6, snic_efficiency=1.0, cnic_bytes_per_s=2e9, dram_bytes_per_s=10e9,
                hbm_bytes=16e9, hbm_reserve_bytes=0.0, decode_batch=8, decode_step_overhead_s=0.0,
                contention=[1.7, 2.2], decode_contention=[1.3], prefill_tokens_per_s=6000.0,
                prefill_fit=[2e-9, 1.5e-4, 0.004], prefill_scale=1.15, decode_fit=[0.012, 2e-6],
                pass_table=[[1, 256, 0, 0.05], [4, 256, 0, 0.16], [1, 256, 2048, 0.09], [4, 256, 2048, 0.3],
                            [1, 1024, 0, 0.17], [1, 1024, 2048, 0.31]])),
}


def _sessions(d: str) -> str:
    """Six coding sessions of 5-10 requests: each prompt holds the previous one's full blocks (same hash
    ids) and new blocks, with recorded response and think times."""
    rng = np.random.default_rng(59)
    for s in range(6):
        ids, t, n_in, requests = [], 0.0, int(rng.integers(8_000, 30_000)), []
        for k in range(int(rng.integers(5, 11))):
            ids = ids + list(range(len(ids) + 1, n_in // 64 + 1))
            n_out, api = int(rng.integers(50, 600)), float(rng.uniform(2, 10))
            think = 0.0 if k == 0 else float(rng.uniform(5, 60))
            t += think
            requests.append({"t": round(t, 1), "in": n_in, "out": n_out, "hash_ids": list(ids), "api_time": api,
                             "think_time": think})
            t += api
            n_in += n_out + int(rng.integers(500, 4_000))
        with open(os.path.join(d, f"session_{s}.json"), "w") as f:
            json.dump({"id": f"s{s}", "block_size": 64, "requests": requests}, f)
    return d


def _trajectories(d: str) -> str:
    """Twelve agents of 6 turns, staggered starts and a mean think time of 2 s."""
    rng = np.random.default_rng(60)
    path = os.path.join(d, "agents.jsonl")
    with open(path, "w") as f:
        for a in range(12):
            turns = [{"append_len": int(rng.integers(600, 1200) if k == 0 else rng.integers(40, 300)),
                      "gen": int(rng.integers(4, 24))} for k in range(6)]
            f.write(json.dumps({"start": round(a * 0.25, 2), "think_s": 2.0, "turns": turns}) + "\n")
    return path


def _canonical(x) -> bytes:
    """JSON with sorted keys; floats as their shortest round-trip repr (exact, stable across machines)."""
    def plain(o):
        if isinstance(o, np.generic):
            return o.item()
        raise TypeError(f"cannot fingerprint {type(o).__name__}")
    return json.dumps(x, sort_keys=True, default=plain, allow_nan=True).encode()


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def run_case(settings: dict):
    """The finished Simulation of one case's settings."""
    settings = dict(settings)
    hw_changes = settings.pop("hw", None)
    with tempfile.TemporaryDirectory() as d:
        workload = settings.get("workload", "paper-64k")
        if "{sessions}" in workload:
            settings["workload"] = workload.format(sessions=_sessions(d))
        elif workload == "{trajectories}":
            settings["workload"] = _trajectories(d)
        cfg = SimConfig(**settings)
        hw = get_hardware(cfg.hardware)
        if hw_changes:
            hw = dataclasses.replace(hw, **{k: tuple(tuple(v) if isinstance(v, list) else v for v in x)
                                            if isinstance(x, list) else x for k, x in hw_changes.items()})
        return build(cfg, hardware=hw, progress=False).run()


def fingerprint(settings: dict) -> dict:
    """What a case's run must reproduce exactly: JCT and event count (readable), requests, and a sha256 of
    each request column's bytes (dtype and shape included), of the host records, of `pe_summary()` and of
    `link_summary()`. Nothing depends on wall time (the Simulation's `wall_s` is left out)."""
    sim = run_case(settings)
    cols = sim.columns()
    col_sha = {}
    for name in sorted(cols):
        a = np.ascontiguousarray(cols[name])
        col_sha[name] = _sha(f"{a.dtype.str}{a.shape}".encode() + a.tobytes())
    return {"jct_s": float(np.nanmax(cols["done"]) - np.nanmin(cols["arrival"])), "events": sim.events_done,
            "requests": int(len(cols["done"])), "columns": col_sha,
            "hosts": _sha(_canonical([dataclasses.asdict(h) for h in sim.host_stats()])),
            "pe_summary": _sha(_canonical(sim.pe_summary())), "link_summary": _sha(_canonical(sim.link_summary()))}


def moved(blessed: dict, now: dict) -> list[str]:
    """The fields of a fingerprint that differ, each as `field: old -> new` (a column by name)."""
    out = []
    for k in ("jct_s", "events", "requests"):
        if blessed.get(k) != now.get(k):
            out.append(f"{k}: {blessed.get(k)!r} -> {now.get(k)!r}")
    old_cols, new_cols = blessed.get("columns", {}), now.get("columns", {})
    cols = sorted(c for c in set(old_cols) | set(new_cols) if old_cols.get(c) != new_cols.get(c))
    if cols:
        out.append(f"columns: {', '.join(cols)}")
    out += [k for k in ("hosts", "pe_summary", "link_summary") if blessed.get(k) != now.get(k)]
    return out


def load() -> dict:
    with open(GOLDEN) as f:
        return json.load(f)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.dualjax.sim.golden", description=__doc__.split("\n\n")[0])
    p.add_argument("cases", nargs="*", metavar="CASE", help=f"cases to run (default: all): {', '.join(CASES)}")
    p.add_argument("--bless", action="store_true", help="write the runs' fingerprints to golden.json")
    args = p.parse_args(argv)
    if unknown := [c for c in args.cases if c not in CASES]:
        print(f"unknown case(s) {', '.join(unknown)}; cases: {', '.join(CASES)}", file=sys.stderr)
        return 2
    golden = load() if os.path.exists(GOLDEN) else {}
    bad = 0
    for name in args.cases or list(CASES):
        t = time.perf_counter()
        fp = fingerprint(CASES[name])
        wall = time.perf_counter() - t
        old = golden.get(name, {})
        diff = moved(old.get("fingerprint", {}), fp) + (["settings"] if old.get("settings") != CASES[name] else [])
        if args.bless:
            golden[name] = {"settings": CASES[name], "fingerprint": fp}
            print(f"{name:22s} JCT {old.get('fingerprint', {}).get('jct_s')!r} -> {fp['jct_s']!r}"
                  f"{'' if diff else ' (unchanged)'}  ({wall:.2f} s)")
        else:
            bad += bool(diff)
            print(f"{name:22s} {'moved: ' + '; '.join(diff) if diff else 'ok'}  ({wall:.2f} s)")
    if args.bless:
        golden = {k: golden[k] for k in CASES if k in golden}  # the case list's order; dropped cases go
        with open(GOLDEN, "w") as f:
            json.dump(golden, f, indent=1)
            f.write("\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
