"""`dualjax calibrate`: measure this machine into the simulator's `local` hardware profile.

The profile is the command's product: it goes to the per-user data home (`dualjax.core.paths`:
`$DUALJAX_HOME`, else `$XDG_DATA_HOME/dualjax`, else `~/.local/share/dualjax`, file `local.json`),
where `--hardware local` finds it from any working directory, or to `--json FILE` instead (then
`--hardware FILE` reads it). The scratch store and runs it measures with live in a temporary
directory (under `--dir`, default the working directory), removed when it ends: nothing else is
written.

What it measures, with the runtime's own code: `dualjax.bench.calibrate`.
"""

from __future__ import annotations

from dualjax.bench.calibrate import measure
from dualjax.core.config import ConfigError
from dualjax.core.paths import local_profile
from dualjax.outputs import unwritable_file
from dualjax.sim.profiles import Hardware, save_hardware


def calibrate(model: str = "small", workload: str = "agentic-e2e", store_dir: str | None = None,
              decode_slots: int = 8, block_tokens: int = 64, path: str | None = None, agents: int | None = None,
              turns: int | None = None, quick: bool = False, scratch: str | None = None) -> Hardware:
    """Measure (`dualjax.bench.calibrate.measure`, which says what each argument does), write the `local`
    profile to `path` (default: `dualjax.core.paths.local_profile()`) and return it."""
    hw = Hardware(**measure(model, workload, store_dir, decode_slots, block_tokens, agents, turns, quick, scratch))
    save_hardware(hw, path or local_profile())
    return hw


def main(args) -> int:
    """`dualjax calibrate`: measure, write the profile (the `local` home, or --json), print what it holds."""
    path = args.json or local_profile()
    if why := unwritable_file(path):  # bad input now, not once measured
        raise ConfigError(f"--json: {why}" if args.json else f"the local profile: {why} ($DUALJAX_HOME names "
                          "another home)")
    if not getattr(args, "quiet", False):
        from dualjax.bench.common import show_progress
        show_progress()
    hw = calibrate(args.model, args.workload, decode_slots=args.decode_slots, path=path,
                   scratch=getattr(args, "dir", None))
    a, b, c = hw.prefill_fit
    reader = f"--hardware {path}" if args.json else "--hardware local"
    print(f"local profile ({args.model}) -> {path} ({reader} reads it)\n"
          f"  prefill passes: {len(hw.pass_table)} padded shapes (rows x new x prefix), from "
          f"{min(r[3] for r in hw.pass_table) * 1e3:.0f} to {max(r[3] for r in hw.pass_table) * 1e3:.0f} ms; "
          f"the hosts take x{hw.prefill_scale:.2f}\n"
          f"  packing fit: {a:.3g} s x new x (cached + new/2) + {b:.3g} s x new + {c:.3g} s per row\n"
          f"  decode step: {hw.decode_fit[0] * 1e3:.2f} ms + {hw.decode_fit[1] * 1e6:.3f} us x capacity\n"
          f"  with 1, 2, 3 other engines computing: a pass x{', '.join(f'{c:.2f}' for c in hw.contention)}, "
          f"a decode step x{', '.join(f'{c:.2f}' for c in hw.decode_contention)}\n"
          f"  storage read {hw.snic_bytes_per_s / 1e9:.2f} GB/s   relay {hw.cnic_bytes_per_s / 1e9:.2f} GB/s")
    return 0
