"""`dualjax sim validate`: the e2e benchmark's configurations, for real and in the simulator.

    dualjax sim validate --json FILE [--quick] [--repeats N] [--real E2E.json]

Runs `dualjax bench e2e` (or reads its JSON with `--real`), then simulates every configuration it
ran on the `local` profile and compares (`dualjax.sim.validate`): per configuration the real JCT's
repeats, `jct_error[run]` = simulated / median real JCT - 1 (target |x| <= 0.15) and `speedup_error[key]`
(target |x| <= 0.10), the uncapped control and any run that compiled on its clock shown and left out
of `max_abs_jct_error` (`left_out` says why). The profile is calibrated first when missing or with
--recalibrate: before the real runs, so that both are measured under the same load and the
calibration's time comes off the wall bound.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time

from dualjax.bench.common import emit, show_progress
from dualjax.cli.parsing import quiet_flag
from dualjax.core.config import ConfigError, number
from dualjax.core.paths import local_profile
from dualjax.outputs import output_dir, output_file, unwritable_file
from dualjax.sim.profiles import get_hardware
from dualjax.sim.validate import REAL_KEYS, compare, unreadable_runs

log = logging.getLogger("dualjax.cli.validate")
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
    p.add_argument("--hardware", metavar="FILE", help="the `local` profile this machine's runs are simulated on "
                   "(default: the one `dualjax calibrate` writes, `--hardware local`; calibrated first when missing)")
    quiet_flag(p)
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
    args.hardware = args.hardware or local_profile()
    show_progress()  # unless --quiet (`parsing.set_log_level`)
    t0 = time.time()
    real = _load_real(p, args.real) if args.real else None
    if real is None and args.max_wall_s <= SIM_RESERVE_S:
        p.error(f"--max-wall-s {args.max_wall_s:g} leaves no time for the e2e benchmark ({SIM_RESERVE_S:g} s are "
                "kept for the simulations)")
    if args.recalibrate or not os.path.exists(args.hardware):  # first, so that its time is known, not guessed
        if why := unwritable_file(args.hardware):
            p.error(f"--hardware: {why}")
        _calibrate(args, real)
    hw = get_hardware(args.hardware)  # a bad profile is bad input now, not after the e2e benchmark
    if real is None:
        from dualjax.bench import e2e
        left = args.max_wall_s - (time.time() - t0) - SIM_RESERVE_S
        if left <= 0:
            raise ConfigError(f"calibrating took {time.time() - t0:.0f} s of --max-wall-s {args.max_wall_s:g}, leaving "
                              f"none for the e2e benchmark; the profile is written to {args.hardware}: run again")
        real = e2e.main(["--out", os.path.join(args.out, "real"), "--max-wall-s", str(left),
                         "--json", os.path.join(args.out, "e2e.json")] +
                        (["--quick"] if args.quick else []) +
                        (["--repeats", str(args.repeats)] if args.repeats else []) +
                        (["--storage-factor", str(args.storage_factor)] if args.storage_factor else []))
    result = compare(real, hw, args.out)
    result["wall_s"] = time.time() - t0
    emit(result, args.json)
    return result


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
    if why := f"missing {', '.join(missing)}" if missing else unreadable_runs(real):
        p.error(f"--real {path} is not a `dualjax bench e2e --json` result ({why})")
    return real


def _calibrate(args, real: dict | None) -> None:
    """Measure the profile at `args.hardware` for the e2e runs (`real`, or the ones about to run): on
    their model and workload, over the shapes their agents and turns reach; quick (fewer timings)
    for the --quick set, whose runs are small."""
    from dualjax.bench.e2e import QUICK_AGENTS, QUICK_TURNS
    from dualjax.cli.calibrate import calibrate
    quick = real.get("quick", False) if real else args.quick
    log.info("calibrating (%s%s)", args.hardware, ", quick" if quick else "")
    calibrate(real.get("model", "small") if real else "small", real["workload"] if real else "agentic-e2e",
              store_dir=os.path.join(args.out, "calibrate-store"), path=args.hardware,
              agents=real.get("agents") if real else (QUICK_AGENTS if quick else None),
              turns=real.get("turns") if real else (QUICK_TURNS if quick else None), quick=quick)
