"""The e2e benchmark's configurations simulated and compared with its real runs (`dualjax sim validate`).

`compare(real, hw, out)` simulates every configuration an e2e result (`dualjax bench e2e --json`) ran, on
the profile `hw` with the settings its runs recorded (cluster, policy, scheduler, storage cap, PE memory
budget, Basic's batches ahead) and the real runs' own start-up profile (the PEs' packing fit, the
scheduler's prefill rate), and reports per configuration the real JCT's repeats (least / median / most),
`jct_error[run]` = simulated / median real JCT - 1 (target |x| <= 0.15) and whether the simulation lies
within the real range (`table`), and `speedup_error[key]` (target |x| <= 0.10) for DualPath over Basic per
cluster, the step without scheduling over DualPath (`CLUSTER-naive-over-dualpath`) and, where they ran,
PE-only (layerwise) and DualPath over Basic under the memory budget (`1p1d-hbm-pe-only`,
`1p1d-hbm-dualpath`) and Basic one batch ahead over none (`1p1d-basic-ahead1`), each beside the spread of
its same-round real ratios. The uncapped control, and any run that compiled on its clock, are shown and
left out of `max_abs_jct_error` (`left_out` says why).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import statistics

from dualjax.core.config import ClusterSpec, SimConfig
from dualjax.core.report import spread as _spread
from dualjax.sim import simulate
from dualjax.sim.resources import PassTable

log = logging.getLogger("dualjax.sim.validate")
CONTROL_RUN = "control-uncapped-1p1d-basic"  # the e2e benchmark's name for its uncapped control


def compare(real: dict, hw, out: str) -> dict:
    """The comparison of the e2e result `real` with its simulations on profile `hw` (`dualjax.sim.profiles.
    Hardware`), whose outputs go to `out`/sim/NAME."""
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
        r = simulate(cfg, out=os.path.join(out, "sim", name), hardware=_scaled(hw, speed[name]), progress=False)
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
        "targets": {"jct_error": 0.15, "speedup_error": 0.10}, "profile": hw.notes,
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
    pairs += [(f"{name.split('-')[0]}-naive-over-dualpath", name, f"{name.split('-')[0]}-dualpath") for name in jct
              if name.endswith("-naive")]  # round-robin-naive (older results: dualpath-naive, reads by queue)
    pairs += [("1p1d-hbm-pe-only", "1p1d-basic-hbm", "1p1d-pe-only-hbm"),
              ("1p1d-hbm-dualpath", "1p1d-basic-hbm", "1p1d-dualpath-hbm"),
              ("1p1d-basic-ahead1", "1p1d-basic", "1p1d-basic-ahead1")]
    return [(k, a, b) for k, a, b in pairs if a in jct and b in jct]


def unreadable_runs(real: dict) -> str | None:
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
