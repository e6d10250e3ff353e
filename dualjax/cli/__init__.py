"""The `dualjax` command: demo, run, verify, report, plan, sim, calibrate, validate, bench."""
