"""`dualjax sim validate`: the e2e benchmark's configurations, for real and in the simulator.

    dualjax sim validate --json FILE [--quick] [--repeats N] [--real E2E.json]

Runs `dualjax bench e2e` (or reads its JSON with `--real`), then simulates every configuration it
ran on the `local` profile with the settings its runs recorded (cluster, policy, scheduler, storage
cap, PE memory budget, Basic's batches ahead) and the real runs' own start-up profile (the PEs'
packing fit, the scheduler's prefill rate), and reports per configuration the real JCT's repeats
(least / median / most), `jct_error[run]` = simulated / median real JCT - 1 (target |x| <= 0.15)
and whether the simulation lies within the real range (`table`), and `speedup_error[key]` (target
|x| <= 0.10) for DualPath over Basic per cluster, the step without scheduling over DualPath
(`CLUSTER-naive-over-dualpath`) and, where they ran, PE-only (layerwise) and DualPath over Basic
under the memory budget (`1p1d-hbm-pe-only`, `1p1d-hbm-dualpath`) and Basic one batch ahead over
none (`1p1d-basic-ahead1`), each beside the spread of its same-round real ratios. The uncapped
control, and any run that compiled on its clock, are shown and left out of `max_abs_jct_error`
(`left_out` says why). The profile is calibrated first when missing or with --recalibrate: before
the real runs, so that both are measured under the same load and the calibration's time comes off
the wall bound.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import statistics
import time

from dualjax.bench.common import emit, show_progress
from dualjax.core.config import ClusterSpec, ConfigError, SimConfig, number
from dualjax.outputs import output_dir, output_file, unwritable_file
from dualjax.sim import simulate
from dualjax.sim.profiles import DEFAULT_LOCAL, get_hardware
from dualjax.sim.resources import PassTable

log = logging.getLogger("dualjax.cli.validate")
CONTROL_RUN = "control-uncapped-1p1d-basic"  # the e2e benchmark's name for its uncapped control
SIM_RESERVE_S = 60.0  # wall time kept for the simulations (a few seconds here; 3x slower machines fit too)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", metavar="FILE", type=output_file,
                   help="write the comparison as one JSON object to FILE (it is printed either way)")
    p.add_argument("--quick", action="store_true", help="the e2e benchmark's --quick configurations")
    p.add_argument("--storage-factor", type=number(), help="passed to the e2e benchmark (its default: 6)")
    p.add_argument("--repeats", type=int, choices=range(1, 21), metavar="N",
                   help="passed to the e2e benchmark: runs of each configuration (its default: 3; 1 with --quick)")
    p.add_argument("--real", metavar="E2E_JSON", help="reuse a `dualjax bench e2e --json` result instead of running it")
    p.add_argument("--out", metavar="DIR", default="runs/sim-validate", type=output_dir,
                   help="the real runs' and the simulations' outputs, and the e2e benchmark's JSON (e2e.json: "
                   "--real reads it again) (default runs/sim-validate)")
    p.add_argument("--profile", default=DEFAULT_LOCAL, help=f"the local profile (default {DEFAULT_LOCAL}; "
                   "calibrated first when missing)")
    p.add_argument("--recalibrate", action="store_true",
                   help="measure the profile again first, under the load the real runs will see (this machine's "
                   "speed can change several-fold between a calibration and a later run)")
    p.add_argument("--max-wall-s", type=number(inf_ok=True), default=840.0,
                   help="wall-time bound: calibration (when the profile is missing or --recalibrate) runs first, "
                   "then the e2e benchmark gets what it and the simulations leave (default 840)")


def main(argv=None, args=None) -> dict:
    """Run alone (`argv`) or from the `dualjax` parser (`args`)."""
    p = argparse.ArgumentParser(prog="dualjax sim validate", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    args = args if args is not None else p.parse_args(argv)
    show_progress()
    t0 = time.time()
    real = _load_real(p, args.real) if args.real else None
    if real is None and args.max_wall_s <= SIM_RESERVE_S:
        p.error(f"--max-wall-s {args.max_wall_s:g} leaves no time for the e2e benchmark ({SIM_RESERVE_S:g} s are "
                "kept for the simulations)")
    if args.recalibrate or not os.path.exists(args.profile):  # first, so that its time is known, not guessed
        if why := unwritable_file(args.profile):
            p.error(f"--profile: {why}")
        _calibrate(args, real)
    hw = get_hardware(args.profile)  # a bad profile is bad input now, not after the e2e benchmark
    if real is None:
        from dualjax.bench import e2e
        left = args.max_wall_s - (time.time() - t0) - SIM_RESERVE_S
        if left <= 0:
            raise ConfigError(f"calibrating took {time.time() - t0:.0f} s of --max-wall-s {args.max_wall_s:g}, leaving "
                              f"none for the e2e benchmark; the profile is written to {args.profile}: run again")
        real = e2e.main(["--out", os.path.join(args.out, "real"), "--max-wall-s", str(left),
                         "--json", os.path.join(args.out, "e2e.json")] +
                        (["--quick"] if args.quick else []) +
                        (["--repeats", str(args.repeats)] if args.repeats else []) +
                        (["--storage-factor", str(args.storage_factor)] if args.storage_factor else []))
    if "runtime_profile" in real:  # the real runs' own start-up profile: scheduler rate and packing fit
        rp = real["runtime_profile"]
        hw = dataclasses.replace(hw, prefill_tokens_per_s=rp["prefill_tokens_per_s"], prefill_fit=tuple(rp["pack_fit"]))
    quick = real.get("quick", False)
    base = SimConfig(ClusterSpec(1, 1), hardware="local", model=real.get("model", "small"), workload=real["workload"],
                     agents=real.get("agents", 3 if quick else None), turns=real.get("turns", 3 if quick else None))
    real_jct, sim_jct, errors, speed, spread, repeats, excluded = {}, {}, {}, {}, {}, {}, {}
    for name, settings, measured, probes, unwarmed in _configurations(real):
        cfg = dataclasses.replace(base, **settings)
        shapes = real.get("speed_probe", {}).get("shapes")
        speed[name] = statistics.mean(_speed_ratio(hw, shapes, _probe_of(real, run)) for run in probes)
        r = simulate(cfg, out=os.path.join(args.out, "sim", name), hardware=_scaled(hw, speed[name]), progress=False)
        repeats[name] = measured
        spread[name] = _spread(list(measured.values()))
        real_jct[name], sim_jct[name] = spread[name]["median"], r["jct_s"]
        errors[name] = r["jct_s"] / real_jct[name] - 1
        if unwarmed:
            excluded[name] = f"compiled on its clock: passes {unwarmed} were not warmed before it"
        elif name == CONTROL_NAME:
            excluded[name] = OUT_OF_SCOPE
    speedup_error, sim_speedup, real_speedup, speedup_spread = {}, {}, {}, {}
    for key, slow, fast in _speedups(real_jct):
        real_speedup[key] = real_jct[slow] / real_jct[fast]
        rounds = sorted(set(repeats[slow]) & set(repeats[fast]))
        if rounds:  # the same round's runs: the same load
            speedup_spread[key] = _spread([repeats[slow][k] / repeats[fast][k] for k in rounds])
        sim_speedup[key] = sim_jct[slow] / sim_jct[fast]
        speedup_error[key] = sim_speedup[key] / real_speedup[key] - 1
    table = _table(real_jct, sim_jct, errors, spread, speed, excluded)
    for row in table:
        log.info("%-28s real %7.2f s (%s)  sim %7.2f s  error %+6.1f%%  within the real range: %s  (speed x%.2f)%s",
                 row["run"], row["real_median_s"], "/".join(f"{v:.2f}" for v in row["real_min_median_max_s"]),
                 row["sim_s"], 100 * row["error"], row["within_spread"], row["speed_ratio"],
                 f"  [left out: {row['left_out']}]" if row["left_out"] else "")
    kept = {k: v for k, v in errors.items() if k not in excluded}
    result = {
        "benchmark": "sim-validate", "quick": quick, "cap_mbps": real["cap_mbps"],
        "jct_error": errors, "speedup_error": speedup_error, "real_jct_s": real_jct, "sim_jct_s": sim_jct,
        "real_speedup": real_speedup, "sim_speedup": sim_speedup,
        # the real runs' spread over repeats (min / median / max): real_jct_s and real_speedup are the medians
        "real_jct_spread": spread, "real_speedup_spread": speedup_spread, "table": table,
        "max_abs_jct_error": max(abs(v) for v in kept.values()) if kept else None,
        "max_abs_speedup_error": max(abs(v) for v in speedup_error.values()) if speedup_error else None,
        "left_out": excluded,
        "targets": {"jct_error": 0.15, "speedup_error": 0.10}, "profile": hw.notes, "wall_s": time.time() - t0,
        "speed_ratio": speed,
        "notes": "Real: embedded clusters sharing this machine's cores (see bench e2e); each configuration's "
                 "repeats give its spread, the median is compared. Simulated: the local "
                 "profile, one engine per host; engines computing at once slow each other by the measured "
                 "contention factor; PEs pack with the real runs' own fit. speed_ratio (per configuration): the "
                 "control's pass shapes timed bare right before and after each real run over the profile's "
                 "table for them, averaged over its repeats; the profile's passes and decode steps are scaled by "
                 "it (the machine's speed while those runs ran). max_abs_jct_error leaves out the runs in "
                 "left_out (why: there).",
    }
    emit(result, args.json)
    return result


REAL_KEYS = ("workload", "jct_s", "speedup", "cap_mbps", "control_uncapped_jct_s")
SIM_SETTINGS = ("policy", "snic_mbps", "pe_hbm_mb", "basic_ahead", "basic_lands", "layerwise", "scheduler")
CONTROL_NAME = "1p1d-control"
OUT_OF_SCOPE = ("outside the local profile's scope: compute-bound, so its JCT follows this shared machine's "
                "momentary speed, which the bare probe before and after a run cannot pin, and how its first turns "
                "batch follows the packing fit its start-up measured; the profile is validated where the emulated "
                "storage NICs set the JCT (docs/simulator.md)")


def _configurations(real: dict) -> list[tuple[str, dict, dict, list, list]]:
    """(name, the simulation's settings, {repeat: real JCT}, the runs whose speed probes apply, the passes
    that compiled on a run's clock) of every configuration of an e2e result: each with the settings its
    runs recorded (the control as `1p1d-control`), its repeats grouped by the configuration they
    recorded; or, for results from before runs recorded settings, the control and the runs under
    `jct_s` (cluster, policy and the cap)."""
    runs = real.get("runs", {})
    if any("settings" in w for w in runs.values()):
        grouped: dict[str, tuple] = {}
        for run, w in runs.items():
            if run == "warmup" or "settings" not in w:
                continue
            config = w.get("config", run)
            name = CONTROL_NAME if config == CONTROL_RUN else config
            if name not in grouped:
                settings = {k: w["settings"][k] for k in SIM_SETTINGS if k in w["settings"]}
                settings["cluster"] = ClusterSpec.parse(w["settings"]["cluster"])
                grouped[name] = (name, settings, {}, [], [])
            grouped[name][2][w.get("repeat", 0)] = w["jct_s"]
            grouped[name][3].append(run)
            grouped[name][4].extend(w.get("unwarmed_passes", []))
        return list(grouped.values())
    out = [(CONTROL_NAME, {"policy": "basic"}, {0: real["control_uncapped_jct_s"]}, [CONTROL_RUN], [])]
    for cluster, pols in real["jct_s"].items():
        out += [(f"{cluster}-{pol}", {"cluster": ClusterSpec.parse(cluster), "policy": pol,
                                      "snic_mbps": real["cap_mbps"]}, {0: jct}, [f"{cluster}-{pol}"], [])
                for pol, jct in pols.items()]
    return out


def _spread(values: list[float]) -> dict:
    """Repeats of one figure: their number, least, median and most, and (most - least) / median."""
    med = statistics.median(values)
    return {"n": len(values), "min": min(values), "median": med, "max": max(values),
            "spread": (max(values) - min(values)) / med if med else None}


def _table(real: dict, sim: dict, errors: dict, spread: dict, speed: dict, excluded: dict) -> list[dict]:
    """One row per configuration: the real JCT's repeats (least / median / most), the simulated JCT, its
    error against the median, whether it lies within the real runs' range, the speed ratio, and why the
    row is left out of the error bound (or None)."""
    return [{"run": name, "real_median_s": real[name], "n": spread[name]["n"],
             "real_min_median_max_s": [spread[name]["min"], spread[name]["median"], spread[name]["max"]],
             "real_spread": spread[name]["spread"], "sim_s": sim[name], "error": errors[name],
             "within_spread": spread[name]["min"] <= sim[name] <= spread[name]["max"],
             "speed_ratio": speed[name], "left_out": excluded.get(name)} for name in real]


def _speedups(jct: dict) -> list[tuple[str, str, str]]:
    """(key, slower run, faster run) of the speed-ups a validation compares: per cluster DualPath over Basic
    (the key: the cluster) and the step without scheduling over DualPath (`CLUSTER-naive-over-dualpath`:
    what scheduling buys, > 1 where it helps), and where they ran, layerwise (PE-only) and DualPath over
    Basic under the PE memory budget and Basic one batch ahead over none (`bench e2e`'s names)."""
    pairs = [(name.rsplit("-", 1)[0], name.replace("-dualpath", "-basic"), name) for name in jct
             if name.endswith("-dualpath") and name.count("-") == 1]
    pairs += [(f"{name.split('-')[0]}-naive-over-dualpath", name, name.removesuffix("-naive")) for name in jct
              if name.endswith("-dualpath-naive") and name.count("-") == 2]
    pairs += [("1p1d-hbm-pe-only", "1p1d-basic-hbm", "1p1d-pe-only-hbm"),
              ("1p1d-hbm-dualpath", "1p1d-basic-hbm", "1p1d-dualpath-hbm"),
              ("1p1d-basic-ahead1", "1p1d-basic", "1p1d-basic-ahead1")]
    return [(k, a, b) for k, a, b in pairs if a in jct and b in jct]


def _load_real(p: argparse.ArgumentParser, path: str) -> dict:
    """The `--real` e2e result, or a one-line error (exit 2) when it is not one."""
    try:
        with open(path) as f:
            real = json.load(f)
    except OSError as e:
        p.error(f"--real {path}: {e.strerror}")
    except ValueError as e:
        p.error(f"--real {path} is not JSON: {e}")
    missing = [k for k in REAL_KEYS if k not in real] if isinstance(real, dict) else list(REAL_KEYS)
    if why := f"missing {', '.join(missing)}" if missing else _unreadable_runs(real):
        p.error(f"--real {path} is not a `dualjax bench e2e --json` result ({why})")
    return real


def _unreadable_runs(real: dict) -> str | None:
    """Why the runs of an e2e result cannot be read as the simulations read them, or None."""
    if not real["jct_s"]:
        return "no capped runs"
    try:
        runs = _configurations(real)
    except (AttributeError, KeyError, TypeError) as e:  # an entry of another shape than e2e writes
        return f"its runs do not read: {type(e).__name__}: {e}"
    bad = [name for name, _, jcts, _, _ in runs for jct in jcts.values()
           if not isinstance(jct, (int, float)) or not jct > 0]
    return f"the JCT of {', '.join(bad)} is not a positive number of seconds" if bad else None


def _calibrate(args, real: dict | None) -> None:
    """Measure the profile at `args.profile` for the e2e runs (`real`, or the ones about to run): on
    their model and workload, over the shapes their agents and turns reach; quick (fewer timings)
    for the --quick set, whose runs are small."""
    from dualjax.bench.e2e import QUICK_AGENTS, QUICK_TURNS
    from dualjax.cli.calibrate import calibrate
    quick = real.get("quick", False) if real else args.quick
    log.info("calibrating (%s%s)", args.profile, ", quick" if quick else "")
    calibrate(real.get("model", "small") if real else "small", real["workload"] if real else "agentic-e2e",
              store_dir=os.path.join(args.out, "calibrate-store"), path=args.profile,
              agents=real.get("agents") if real else (QUICK_AGENTS if quick else None),
              turns=real.get("turns") if real else (QUICK_TURNS if quick else None), quick=quick)


def _speed_ratio(hw, shapes: list | None, bare_s: list | None) -> float:
    """How much slower this machine ran `shapes` ([rows, new, prefix, passes]: the real control's
    most frequent pass shapes), timed bare right before and after a real run (`bare_s`, passes x
    seconds), than the profile's pass table says: that run's simulation scales the profile's passes
    and decode steps by it, since a profile measured at another time (even a minute apart, on this
    shared machine) explains only runs under the same load. 1 without a probe or a table."""
    if not shapes or not bare_s or not hw.pass_table:
        return 1.0
    table = PassTable(hw.pass_table)
    return statistics.mean(bare_s) / sum(n * table(rows, new, prefix) for rows, new, prefix, n in shapes)


def _probe_of(real: dict, run: str) -> list | None:
    """The bare timings around the real run `run` (the e2e benchmark's `probe_bare_s`), else around
    its control (results before per-run probes), else None (older results: no probe)."""
    return real.get("runs", {}).get(run, {}).get("probe_bare_s") or real.get("speed_probe", {}).get("bare_s")


def _scaled(hw, speed: float):
    """`hw` with its passes and decode steps `speed` times as long."""
    return dataclasses.replace(hw, prefill_scale=hw.prefill_scale * speed,
                               decode_fit=hw.decode_fit and tuple(d * speed for d in hw.decode_fit))
