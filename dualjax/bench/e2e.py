"""End to end: DualPath against the Basic baseline on embedded clusters, storage-bound.

    dualjax bench e2e --json FILE [--quick | --hbm] [--repeats N]

Offline agentic workload (`agentic-e2e`: 10 agents x 5 turns, 1,024-token first round, 64-token
appends, 8 generated tokens) on the `small` model. First an uncapped control run (compute-bound:
storage is a page-cache read). The per-host storage NIC cap is then set so that one NIC would need
6x (`--storage-factor`) the control's JCT to read every hit block: loading dominates compute, as in
the paper's regime (at 4x, compute contention on the shared cores held the speed-ups further below
theory; --quick, a CI smoke run of 3 agents x 3 turns, uses 4x all the same: the capped runs take
two thirds of the time and loading still dominates). Then, in order of importance: 1p1d and 1p2d
under basic / dualpath, and dual-path loading without the scheduling algorithm, the ablation's step
(`dualjax sim ablation`'s `dual-path`: `--scheduler naive`, round-robin engines and no compute quota,
and `--policy round-robin`, reads alternating sides request by request, as no read queue chooses
them; `naive_over_dualpath` is what scheduling buys here) (the --quick set); the --hbm set: 1p1d
under basic / pe-only / dualpath with a PE device-memory budget (`--pe-hbm-mb`) that holds every
layer of about one request's KV, where Basic (which loads a batch's every layer into device memory,
then computes it) batches one request at a time and layerwise prefill (two layers per row, reads into
host DRAM) is not held back, and 1p1d Basic without the budget loading no batch and one batch ahead of
the one computing (`--basic-ahead` 0, the default, and 1: what overlapping loads with compute gives
it); then 2p1d and the remaining pe-only runs, and 2p2d under dualpath and round-robin for storage-NIC balance. All runs
share this process and the machine's cores, so hosts also contend for compute; only the per-host
storage NIC bandwidth and the PE memory budget are emulated. Each configuration runs `--repeats`
times (default 3, --quick 1), round after round, the control again in every round after the first;
the tables give the median, `jct_repeats_s` each configuration's least, median and most. Every
run's hosts compile its pass shapes before its clock (`runtime.warmup.warm_shapes`); a run's
`unwarmed_passes` lists any pass that compiled on its clock (none expected).

Wall time is bounded (`--max-wall-s`, default 14 minutes, whatever the machine). A warm-up run of
the control's configuration compiles the pass shapes at its start-up (most of its wall; later runs
in this process find them compiled) and shows which shapes the control computes most; the control's
most frequent pass shapes, timed
bare right before and after it (`speed_probe`; again after every capped run), tell `sim validate`
how fast the machine ran then.
This happens first at a small size (2 agents; --quick: its own 3), and again at the most agents
up to the preset's whose warm-up, control and essential runs are predicted to fit, each scaled in
proportion to the agents (an upper bound): a slow machine never spends its bound compiling the
preset's size. Each capped run is predicted from the control (the storage factor times the control
over the run's storage NICs; Basic loading no batch ahead adds its compute), the essential runs (the
--quick set, the --hbm set, or both) are kept and the rest while they fit; if the essential ones do
not fit, the agents shrink until they do and the control runs again at that size (the baseline of
the capped runs). Before each run its prediction is scaled by how far the runs so far overran
theirs; a run then predicted to end past the bound is skipped. The JSON lists what ran (`ran`) and
what did not and why (`skipped`).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import logging
import os
import shutil
import statistics
import time
from typing import NamedTuple

from dualjax.bench.common import bench_args, emit, show_progress
from dualjax.core.config import ClusterSpec, RunConfig, number
from dualjax.core.report import spread as report_spread
from dualjax.core.workload import get_workload, turn_lengths
from dualjax.outputs import comparison, load_run, output_dir
from dualjax.plots import plot_compare
from dualjax.runtime.cluster.runner import run_embedded
from dualjax.runtime.startup import prefill_seconds

log = logging.getLogger("dualjax.bench.e2e")

QUICK = [("1p1d", "basic"), ("1p1d", "dualpath"), ("1p2d", "basic"), ("1p2d", "dualpath")]
NAIVE = ["1p1d", "1p2d"]  # the step without the scheduling algorithm beside DualPath, on these clusters
NAIVE_POLICY = "round-robin"  # its reads: alternating sides (no read queue picks them), under `--scheduler naive`
REPEATS, QUICK_REPEATS = 3, 1  # runs of each configuration (--repeats)
FULL = QUICK + [("2p1d", "basic"), ("2p1d", "dualpath"), ("1p1d", "pe-only"), ("1p2d", "pe-only"),
                ("2p1d", "pe-only"), ("2p2d", "dualpath"), ("2p2d", "round-robin")]
FACTOR = 6.0  # the storage factor (below): loading dominates compute
QUICK_AGENTS, QUICK_TURNS, QUICK_FACTOR = 3, 3, 4.0  # --quick: still storage-bound, two thirds of the capped time
HBM = ["basic", "pe-only", "dualpath"]  # on 1p1d with the PE memory budget
CONTROL = "control-uncapped-1p1d-basic"
BASIC_COMPUTE = 1.0  # Basic loading no batch ahead loads, then computes: at most the control's compute on top
MIN_AGENTS = 2  # the size measured first (the default and --hbm sets), before growing to what fits
RUN_OVERHEAD_S = 5.0  # least wall of a run beyond its JCT once the warm-up compiled (start-up, stats, report)
MARGIN = 0.9  # the runs are sized to this share of the wall time left
PROBE_SHAPES = 4  # the speed probe times the control's most frequent pass shapes, once each


def main(argv=None, args=None) -> dict:
    args = bench_args("e2e", __doc__, add_arguments, argv, args)
    show_progress()
    t_start = time.time()
    shutil.rmtree(args.out, ignore_errors=True)
    k = args.storage_factor or (QUICK_FACTOR if args.quick else FACTOR)
    walls: dict[str, dict] = {}  # per run: its JCT and its wall time
    run = functools.partial(_run, args.out, walls)
    args.repeats = args.repeats or (QUICK_REPEATS if args.quick else REPEATS)
    planned, essential = _planned(args.quick, args.hbm, args.repeats)
    budget = lambda: MARGIN * (args.max_wall_s - (time.time() - t_start))  # noqa: E731
    m = _measure(run, walls, planned, essential, k, budget, args.quick)
    hit_bytes = sum(h["storage_bytes"] for h in m.control["hosts"])
    cap = hit_bytes / (k * m.control["jct_s"])
    log.info("cap: %.1f MB/s per host (one NIC would read the %.0f MB of hits in %gx the uncapped JCT)",
             cap / 1e6, hit_bytes / 1e6, k)
    skipped = {_dir(r): "left out: predicted from the control (measured after the warm-up) to end past "
                         "--max-wall-s after the essential runs" for r in m.left_out}
    out = _capped(run, walls, m, k, cap, lambda: time.time() - t_start, args, skipped)
    figure = os.path.join(args.out, "jct_per_policy.png")
    plot_compare(figure, comparison([(os.path.basename(d), load_run(d, ["ttft"])) for d in out["reports"]]))
    result = _result(args, m, out, k, cap, hit_bytes, planned, essential, figure, skipped, walls)
    result["wall_s"] = time.time() - t_start
    emit(result, args.json)
    return result


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="runs/bench-e2e", type=output_dir, help="where the runs and plots go")
    p.add_argument("--storage-factor", type=number(),
                   help=f"the cap makes one storage NIC need this many times the uncapped JCT (default {FACTOR:g}; "
                   f"{QUICK_FACTOR:g} with --quick)")
    p.add_argument("--max-wall-s", type=number(inf_ok=True), default=840.0,
                   help="skip runs that would end past this many seconds of wall time (default 840)")
    p.add_argument("--repeats", type=int, choices=range(1, 21), metavar="N",
                   help=f"runs of each configuration, round after round (default {REPEATS}; {QUICK_REPEATS} with "
                   "--quick): the JSON gives their least, median and most")
    p.add_argument("--hbm", action="store_true",
                   help="only the control and 1p1d basic / pe-only / dualpath under the PE memory budget")


class Spec(NamedTuple):
    """One run to make after the control: its cluster and policy, under the PE memory budget or not, Basic's batches
    ahead, the scheduler (full, or naive: round-robin engines and no compute quota), storage capped or not
    (the control again), which repeat of its configuration."""

    cluster: str
    policy: str
    hbm: bool = False
    ahead: int = 0
    scheduler: str = "full"
    capped: bool = True
    repeat: int = 0


SETTINGS = ("policy", "snic_mbps", "pe_hbm_mb", "basic_ahead", "basic_lands", "layerwise", "scheduler")


def _run(out: str, walls: dict, base: RunConfig, name: str, **changes) -> dict:
    """One embedded run of `base` with `changes` into `out/name`, emptied first (a run again under the
    same name, e.g. the control at fewer agents, would otherwise find the blocks the last one stored
    and hit where the simulator, and a first run, miss); its JCT, wall and settings go into `walls`
    (`sim validate` simulates each run with its settings)."""
    cfg = base.replace(out=os.path.join(out, name), **changes)
    shutil.rmtree(cfg.out, ignore_errors=True)
    t0 = time.time()
    r = run_embedded(cfg, progress=False)
    peak = max(h["buffer_peak_bytes"] for h in r["hosts"] if h["role"] == "prefill")
    walls[name] = {"jct_s": r["jct_s"], "wall_s": time.time() - t0, "rows_per_pass": rows_per_pass(r),
                   "pe_buffer_peak_mb": peak / 1e6, "agents": cfg.agents, "config": name, "repeat": 0,
                   "unwarmed_passes": unwarmed_passes(cfg, r), "startup_s": r["runtime"]["startup"]["max_s"],
                   "settings": {"cluster": cfg.cluster.name} | {k: getattr(cfg, k) for k in SETTINGS}}
    log.info("%-22s JCT %6.2f s  wall %6.1f s  paths %s  SNIC max/avg %s  rows/pass %.2f  PE buffer peak %.1f MB",
             name, r["jct_s"], walls[name]["wall_s"], r["paths"],
             None if r["snic_max_over_avg"] is None else round(r["snic_max_over_avg"], 2), rows_per_pass(r),
             walls[name]["pe_buffer_peak_mb"])
    return r


@dataclasses.dataclass
class Measured:
    """The machine measured before the capped runs: the configuration they run (`base`, at the agents
    chosen), its uncapped control, the speed probe around it, the runs kept and left out."""

    base: RunConfig
    control: dict
    shapes: list
    probes: list
    overhead_s: float
    runs: list
    left_out: list
    preset_agents: int
    measured: dict  # per size measured: the warm-up's and the control's JCT and wall


def _warm_control(run, base: RunConfig, walls_of) -> tuple[dict, list, list, dict]:
    """The warm-up (the control's configuration: it compiles the pass shapes the compute-bound control
    meets, so that the control times compute, not compilation), then the control with the speed probe
    timed right before and after it: (control, probe shapes, probes, the two runs' walls)."""
    shapes = pass_shapes(run(base, "warmup", policy="basic"))[:PROBE_SHAPES]
    probes = [speed_probe(base.model, shapes)]
    control = run(base, CONTROL, policy="basic")
    probes.append(speed_probe(base.model, shapes))
    walls_of[CONTROL]["probe_bare_s"] = probes[-2:]
    return control, shapes, probes, {n: dict(walls_of[n]) for n in ("warmup", CONTROL)}


def _measure(run, walls: dict, planned: list, essential: int, k: float, budget, quick: bool) -> Measured:
    """Warm-up and control at a small size first (the --quick size, else MIN_AGENTS), then at the
    most agents up to the preset's predicted to fit (`_grow_to`), then the runs fitted to the wall
    left (`_fit_wall`), with the control again if that shrinks the agents."""
    base = RunConfig(ClusterSpec(1, 1), model="small", workload="agentic-e2e",
                     agents=QUICK_AGENTS if quick else None, turns=QUICK_TURNS if quick else None)
    preset = base.agents or get_workload(base.workload).agents
    base = base.replace(agents=preset if quick else min(preset, MIN_AGENTS))
    control, shapes, probes, first = _warm_control(run, base, walls)
    measured = {base.agents: first}
    # beyond its JCT a run costs its start-up and report, and the speed probe after it (two passes a shape)
    overhead = max(RUN_OVERHEAD_S, first[CONTROL]["wall_s"] - control["jct_s"]) + 2 * max(probes)
    units = sum(_cost(r, k) for r in planned[:essential])
    agents = _grow_to(base.agents, preset, first["warmup"]["wall_s"], control["jct_s"], units,
                      (essential + 2) * overhead, budget())
    if agents > base.agents:
        log.info("growing to %d agents: predicted to fit --max-wall-s from the runs at %d", agents, base.agents)
        base = base.replace(agents=agents)
        control, shapes, probes, measured[agents] = _warm_control(run, base, walls)
        overhead = max(RUN_OVERHEAD_S, measured[agents][CONTROL]["wall_s"] - control["jct_s"]) + 2 * max(probes)
    runs, agents, left_out = _fit_wall(planned, essential, k, control["jct_s"], overhead, budget(), base.agents)
    if agents != base.agents:
        log.info("sized to %d agents so that the runs fit --max-wall-s", agents)
        base = base.replace(agents=agents)
        control = run(base, CONTROL, policy="basic")  # the baseline at the capped runs' size
        probes.append(speed_probe(base.model, shapes))
        walls[CONTROL]["probe_bare_s"] = probes[-2:]
    return Measured(base, control, shapes, probes, overhead, runs, left_out, preset, measured)


def _grow_to(start: int, preset: int, warm_s: float, control_s: float, units: float, overhead_s: float,
             budget_s: float) -> int:
    """The most agents, from `start` up to `preset`, whose warm-up (`warm_s` wall at `start`), control
    (`control_s`) and essential capped runs (`units` control JCTs) fit `budget_s` with `overhead_s`,
    all scaled in proportion to the agents: an upper bound, since more agents batch more rows per pass
    and compile fewer new shapes than the first ones did."""
    for agents in range(preset, start, -1):
        if agents / start * (warm_s + (1 + units) * control_s) + overhead_s <= budget_s:
            return agents
    return start


def _capped(run, walls: dict, m: Measured, k: float, cap: float, elapsed, args, skipped: dict) -> dict:
    """The runs after the control in order, each skipped (into `skipped`) when its prediction, scaled by
    how far the runs so far overran theirs (a slowed machine), would end past `--max-wall-s`: per cluster
    and policy the median JCT of its repeats, and the storage-NIC balance and rows per pass of the run at
    that median, the memory-budget runs apart; every configuration's repeats (`spread`); run dirs."""
    max_wall_s = args.max_wall_s
    out = {"jct": {}, "balance": {}, "balance_all": {}, "rows": {}, "reports": []}
    hbm_mb = _hbm_budget_mb(m.base)
    out["hbm"] = {"pe_hbm_mb": hbm_mb, "jct_s": {}, "rows_per_pass": {}, "pe_buffer_peak_mb": {},
                  "note": "1p1d under the PE memory budget: it holds every layer of about one request's KV; Basic "
                          "loads a batch's every layer into device memory (its PE buffer is the budget), then "
                          "computes it; layerwise reads into host DRAM and holds two layers per row on the device"}
    out["basic_ahead"] = {}  # cluster -> {batches ahead: JCT} of Basic without the budget
    overran, last_probe = [1.0], m.probes[-1]
    done: dict[str, list] = {CONTROL: [(Spec("1p1d", "basic", capped=False), m.control)]}  # by configuration
    for spec in m.runs:
        name, expect = _dir(spec), _cost(spec, k) * m.control["jct_s"]
        predicted = expect * max(overran) + m.overhead_s
        if elapsed() + predicted > max_wall_s:
            skipped[name] = f"skipped: predicted {predicted:.0f} s would end past --max-wall-s {max_wall_s:.0f}"
            log.info("%-22s %s", name, skipped[name])
            continue
        if spec.capped:
            r = run(m.base, name, cluster=ClusterSpec.parse(spec.cluster), policy=spec.policy, snic_mbps=cap / 1e6,
                    pe_hbm_mb=hbm_mb if spec.hbm else None, basic_ahead=spec.ahead, scheduler=spec.scheduler)
        else:
            r = run(m.base, name, policy="basic")
        probe = speed_probe(m.base.model, m.shapes)  # between this run and the next
        walls[name]["probe_bare_s"], last_probe = [last_probe, probe], probe
        walls[name] |= {"config": _name(spec), "repeat": spec.repeat}
        overran.append(r["jct_s"] / expect)
        done.setdefault(_name(spec), []).append((spec, r))
    out["repeats"] = {config: spread([r["jct_s"] for _, r in runs]) for config, runs in done.items()}
    for config, runs in done.items():
        if config == CONTROL:
            continue
        spec, r = sorted(runs, key=lambda sr: sr[1]["jct_s"])[(len(runs) - 1) // 2]  # the run at the median
        out["reports"].append(os.path.join(args.out, _dir(spec)))
        _record(out, spec, r, out["repeats"][config]["median"])
    if "basic" in out["hbm"]["jct_s"]:
        out["hbm"]["vs_basic"] = {pol: t / out["hbm"]["jct_s"]["basic"] for pol, t in out["hbm"]["jct_s"].items()}
    out["naive"] = _naive(done)
    return out


def spread(values: list[float]) -> dict:
    """Repeats of one figure: each, their least, median and most, and (most - least) / median."""
    return {"values": values, **report_spread(values)}


def _naive(done: dict) -> dict:
    """Per cluster, what the scheduling algorithm buys: the JCT of the step without it (`--scheduler
    naive --policy round-robin`) over DualPath's, per round where both ran (a same-round ratio, under the
    same load) and of the medians."""
    out = {}
    for cluster in NAIVE:
        full = {s.repeat: r["jct_s"] for s, r in done.get(f"{cluster}-dualpath", [])}
        naive = {s.repeat: r["jct_s"] for s, r in done.get(f"{cluster}-{NAIVE_POLICY}-naive", [])}
        rounds = sorted(set(full) & set(naive))
        if rounds:
            out[cluster] = {"per_round": spread([naive[k] / full[k] for k in rounds]),
                            "of_medians": statistics.median(naive.values()) / statistics.median(full.values())}
    return out


def _record(out: dict, spec: Spec, r: dict, jct: float) -> None:
    """A capped run's figures into `_capped`'s tables (`jct`: its configuration's median JCT): under the
    memory budget by policy, Basic by its batches ahead, and the runs of the default settings by cluster
    and policy (the step without scheduling as `POLICY-naive`)."""
    cluster, policy = spec.cluster, spec.policy + ("-naive" if spec.scheduler == "naive" else "")
    if policy == "basic" and not spec.hbm:
        out["basic_ahead"].setdefault(cluster, {})[spec.ahead] = jct
    if spec.ahead:
        return
    if spec.hbm:
        out["hbm"]["jct_s"][policy] = jct
        out["hbm"]["rows_per_pass"][policy] = rows_per_pass(r)
        out["hbm"]["pe_buffer_peak_mb"][policy] = max(h["buffer_peak_bytes"] for h in r["hosts"]
                                                      if h["role"] == "prefill") / 1e6
        return
    out["jct"].setdefault(cluster, {})[policy] = jct
    out["balance"].setdefault(cluster, {})[policy] = r["snic_max_over_avg"]
    out["balance_all"].setdefault(cluster, {})[policy] = r["snic_max_over_avg_all_windows"]
    out["rows"].setdefault(cluster, {})[policy] = rows_per_pass(r)


def _result(args, m: Measured, out: dict, k: float, cap: float, hit_bytes: float, planned: list, essential: int,
            figure: str, skipped: dict, walls: dict) -> dict:
    """The benchmark's JSON object (less its wall time)."""
    jct = out["jct"]
    speedup = {c: v["basic"] / v["dualpath"] for c, v in jct.items() if "basic" in v and "dualpath" in v}
    theory = {c: (ClusterSpec.parse(c).prefill + ClusterSpec.parse(c).decode) / ClusterSpec.parse(c).prefill
              for c in speedup}
    result = {
        "benchmark": "e2e", "model": "small", "workload": m.base.workload, "quick": args.quick, "hbm_only": args.hbm,
        "agents": m.base.agents, "turns": m.base.turns, "preset_agents": m.preset_agents,
        "sizing": {"measured": m.measured, "run_overhead_s": m.overhead_s, "margin": MARGIN,
                   "planned": [_dir(r) for r in planned],
                   "essential": [_dir(r) for r in planned[:essential]]},
        "cap_mbps": cap / 1e6,
        "cap_reason": f"one storage NIC needs {k:g}x the uncapped control's JCT to read every hit block",
        "control_uncapped_jct_s": m.control["jct_s"], "hit_bytes": hit_bytes,
        "control_rows_per_pass": rows_per_pass(m.control),
        # what every run here profiled at start-up (once per process): the simulator replays it
        "runtime_profile": {"prefill_tokens_per_s": m.control["runtime"]["prefill_tokens_per_s"],
                            "pack_fit": next(h["pack_fit"] for h in m.control["hosts"] if h["role"] == "prefill")},
        # the control's most frequent pass shapes [rows, new, prefix, passes], timed bare (passes x seconds)
        # right before and after it (and after it again at a shrunk size); each run's in `runs` (probe_bare_s)
        "speed_probe": {"shapes": m.shapes, "bare_s": m.probes},
        "speedup": speedup, "theory": theory, "efficiency": {c: speedup[c] / theory[c] for c in speedup},
        "jct_s": jct, "snic_max_over_avg": out["balance"], "snic_max_over_avg_all_windows": out["balance_all"],
        "rows_per_pass": out["rows"],
        "plots": [figure] + [os.path.join(d, "storage.png") for d in out["reports"]],
        "hbm": out["hbm"], "basic_ahead": out["basic_ahead"],
        # every configuration's JCT over its repeats (min / median / max); the tables above hold the medians
        "repeats": args.repeats, "jct_repeats_s": out["repeats"],
        # the step without the scheduling algorithm over DualPath, where storage binds: > 1 is what it buys
        "naive_over_dualpath": out["naive"],
        "ran": [n for n in map(_dir, m.runs) if n not in skipped], "skipped": skipped,
        "max_wall_s": args.max_wall_s, "runs": walls,
        "notes": "Embedded clusters in one process on this machine: hosts share the CPU, so compute is "
                 "contended too; the per-host storage NIC cap and the PE memory budget are the things emulated. "
                 "Basic = PE-only reads without layerwise prefill.",
    }
    if "dualpath" in jct.get("1p1d", {}) and "basic" in jct.get("2p1d", {}):
        result["dualpath_1p1d_over_basic_2p1d"] = jct["1p1d"]["dualpath"] / jct["2p1d"]["basic"]
    return result


def rows_per_pass(report: dict) -> float:
    """Mean rows of a prefill pass over the run's PEs (from each PE's passes by padded shape)."""
    tallies = [t for h in report["hosts"] if h["role"] == "prefill" for t in h["pass_shapes"]]
    return sum(t["rows"] * t["passes"] for t in tallies) / max(1, sum(t["passes"] for t in tallies))


def pass_shapes(report: dict) -> list[tuple[int, int, int, int]]:
    """[(rows, padded new, padded prefix, passes)] of a run's prefill passes over its PEs, the most
    frequent first."""
    counts: dict[tuple[int, int, int], int] = {}
    for t in (t for h in report["hosts"] if h["role"] == "prefill" for t in h["pass_shapes"]):
        key = (t["rows"], t["new"], t["prefix"])
        counts[key] = counts.get(key, 0) + t["passes"]
    return [(*key, n) for key, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]


def unwarmed_passes(cfg: RunConfig, report: dict) -> list[tuple[int, int, int, int]]:
    """[(rows, padded new, padded prefix, passes)] of a run's prefill passes whose shape its hosts did not
    compile before the clock (`runtime.warmup.warm_shapes`): each compiled on the clock, so a run with any
    carries compilation in its JCT. [] when none."""
    ran = pass_shapes(report)
    if not ran:
        return []
    from dualjax.runtime.store import run_layout, run_model
    from dualjax.runtime.warmup import warm_shapes
    warmed = set(warm_shapes(cfg, run_model(cfg).config, run_layout(cfg).block_tokens))
    return [s for s in ran if tuple(s[:3]) not in warmed]


def speed_probe(model: str, shapes: list[tuple[int, int, int, int]]) -> float:
    """Seconds of `shapes`' passes timed bare, once each (`prefill_seconds`, the function the calibrated
    pass table is measured with), weighted by their passes: `sim validate` sets it against the profile's
    table for the same shapes, so that the simulator computes at the speed the real runs saw (this
    shared machine's speed can change several-fold between a calibration and a later run)."""
    return sum(n * prefill_seconds(model, prefix, new, repeats=1, rows=rows) for rows, new, prefix, n in shapes)


def _planned(quick: bool, hbm_only: bool, repeats: int = 1) -> tuple[list[Spec], int]:
    """(runs in order of importance, how many lead that always run): the --hbm set, the --quick set (each
    DualPath beside its step without scheduling), or the quick set, the rest of the --hbm set, then the
    others; each `repeats` times (`_repeated`)."""
    hbm = [Spec("1p1d", pol, hbm=True) for pol in HBM] + [Spec("1p1d", "basic"), Spec("1p1d", "basic", ahead=1)]
    if hbm_only:
        return _repeated(hbm, len(hbm), repeats)
    quick_runs = [r for c, pol in QUICK
                  for r in [Spec(c, pol)] + ([Spec(c, NAIVE_POLICY, scheduler="naive")]
                                            if pol == "dualpath" and c in NAIVE else [])]
    if quick:
        return _repeated(quick_runs, len(quick_runs), repeats)
    extra = [r for r in hbm if r not in quick_runs]
    return _repeated(quick_runs + extra + [Spec(c, pol) for c, pol in FULL[len(QUICK):]],
                     len(quick_runs) + len(extra), repeats)


def _repeated(configs: list[Spec], essential: int, repeats: int) -> tuple[list[Spec], int]:
    """(runs, how many lead that always run): each configuration `repeats` times, round after round, the
    essential ones' rounds first (so that every configuration meets the machine's load as the others do);
    each round after the first also runs the uncapped control again (its first run, measured before
    these, sizes them)."""
    control = Spec("1p1d", "basic", capped=False)
    head = [c._replace(repeat=k) for k in range(repeats) for c in ([control] if k else []) + configs[:essential]]
    tail = [c._replace(repeat=k) for k in range(repeats) for c in configs[essential:]]
    return head + tail, len(head)


def _name(run: Spec) -> str:
    """The run's configuration, by which repeats are grouped (the control's: `CONTROL`)."""
    if not run.capped:
        return CONTROL
    return (f"{run.cluster}-{run.policy}" + ("-hbm" if run.hbm else "") + (f"-ahead{run.ahead}" if run.ahead else "")
            + ("-naive" if run.scheduler == "naive" else ""))


def _dir(run: Spec) -> str:
    """The run's own name (its output directory under --out): its configuration's, and its repeat after
    the first."""
    return _name(run) + (f"-r{run.repeat}" if run.repeat else "")


def _cost(run: Spec, k: float) -> float:
    """A run's predicted JCT in units of the control's: the control again 1; a capped run the storage
    factor over the run's storage NICs (Basic and PE-only read on P nodes, the others on P + D), at least
    one; Basic loading no batch ahead loads and computes in turn, so its compute adds to its loads."""
    if not run.capped:
        return 1.0
    c = ClusterSpec.parse(run.cluster)
    load = max(1.0, k / (c.prefill if run.policy in ("basic", "pe-only") else c.prefill + c.decode))
    return load + BASIC_COMPUTE if run.policy == "basic" and not run.ahead else load


def _fit_wall(runs: list, essential: int, k: float, control_s: float, overhead_s: float, budget_s: float,
              agents: int) -> tuple[list, int, list]:
    """(runs kept, agents, runs left out) so that the runs fit `budget_s` seconds, from the control's
    measured JCT `control_s` (a capped run's JCT is `_cost` times it) and a run's wall beyond its JCT
    (`overhead_s`). Runs past the first `essential` that do not fit are left out; if the essential
    ones do not fit, the agents shrink until they do (JCTs scale with the agents, overheads do not),
    with one more control run at the new size."""
    jcts = sum(_cost(r, k) for r in runs[:essential]) * control_s
    if jcts + essential * overhead_s > budget_s:
        scale = (budget_s - (essential + 1) * overhead_s) / (jcts + control_s)
        return runs[:essential], max(2, int(agents * scale)), runs[essential:]
    spent, kept, left = jcts + essential * overhead_s, list(runs[:essential]), []
    for r in runs[essential:]:
        more = _cost(r, k) * control_s + overhead_s
        if spent + more <= budget_s:
            kept.append(r)
            spent += more
        else:
            left.append(r)
    return kept, agents, left


def _hbm_budget_mb(cfg: RunConfig) -> float:
    """A PE memory budget that holds every layer of about one request's prompt KV (the workload's
    longest prompt), so that it binds Basic and not layerwise prefill (two layers per row)."""
    from models import get_config, kv_bytes_per_token
    spec = get_workload(cfg.workload, agents=cfg.agents, turns=cfg.turns)
    longest = max(int(a.sum() + g[:-1].sum()) for a, g in (turn_lengths(spec, i) for i in range(spec.agents)))
    return 1.2 * longest * kv_bytes_per_token(get_config(cfg.model)) / 1e6


if __name__ == "__main__":
    main()
