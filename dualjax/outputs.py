"""Run outputs: `requests.jsonl` (one line per request), `report.json` (run metrics, from
`dualjax.core.report`) and the plots, for real runs and simulations alike."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import zipfile

import numpy as np

from dualjax.core.records import HostStats
from dualjax.core.report import columns, normalise, summarize
from dualjax.plots import plot_run


class OutputError(FileNotFoundError):
    """A directory that holds no run outputs, or damaged ones."""


def unwritable_dir(path: str) -> str | None:
    """Why `path` cannot hold a command's outputs, or None: it is made now, with its parents, so that
    a long run never ends failing to write its result."""
    if os.path.exists(path) and not os.path.isdir(path):
        return f"{path} is a file, not a directory"
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        return f"cannot make directory {path}: {e.strerror}"
    if not os.access(path, os.W_OK | os.X_OK):
        return f"cannot write into {path}: permission denied"
    return None


def unwritable_file(path: str) -> str | None:
    """Why a command cannot write the file `path` (its JSON, a figure, a profile), or None: its
    directory is made now (`unwritable_dir`)."""
    if os.path.isdir(path) or path.endswith(os.sep):
        return f"{path} is a directory, not a file"
    if why := unwritable_dir(os.path.dirname(path) or "."):
        return why
    if os.path.exists(path) and not os.access(path, os.W_OK):
        return f"cannot write {path}: permission denied"
    return None


def _flag_type(check):
    """The argparse type that refuses a value for which `check` gives a reason."""
    def parse(path: str) -> str:
        if why := check(path):
            raise argparse.ArgumentTypeError(why)
        return path
    return parse


output_dir = _flag_type(unwritable_dir)  # argparse type of a directory a command writes into
output_file = _flag_type(unwritable_file)  # argparse type of a file a command writes


def _on_run_clock(h: HostStats, t0: float) -> HostStats:
    """A copy of `h` whose storage series counts seconds since the run's first arrival `t0`."""
    if h.snic is None:
        return h
    shift = h.snic.wall0 - t0
    series = [(t + shift, b) for t, b in h.snic.series if t + shift >= 0] or [(0.0, 0)]
    return dataclasses.replace(h, snic=dataclasses.replace(h.snic, series=series))


def write_report(out_dir: str, cols: dict[str, np.ndarray], hosts: list[HostStats], cfg, policy: str,
                 slo: tuple[float, float], extra: dict | None = None) -> dict:
    """report.json (plus `extra` keys) and the plots under `out_dir`; returns the report."""
    os.makedirs(out_dir, exist_ok=True)
    report = summarize(cols, hosts, cfg, policy, slo)
    report.update(extra or {})
    report["storage_series"] = {f"{h.role}{h.rank}": h.snic.series for h in hosts if h.snic is not None}
    with open(os.path.join(out_dir, "report.json"), "w") as f:
        json.dump(report, f, indent=1)
    plot_run(out_dir, report, cols["ttft"])
    return report


def write_run(out_dir: str, records: list[dict], hosts: list[HostStats], cfg, policy: str,
              slo: tuple[float, float], extra: dict | None = None) -> dict:
    """A real run's requests.jsonl, report.json (plus `extra` keys) and plots under `out_dir`;
    returns the report. Does not modify `records` or `hosts`."""
    os.makedirs(out_dir, exist_ok=True)
    t0 = min(r["arrival"] for r in records)
    hosts = [_on_run_clock(h, t0) for h in hosts]
    records = normalise(records)
    with open(os.path.join(out_dir, "requests.jsonl"), "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    return write_report(out_dir, columns(records), hosts, cfg, policy, slo, extra)


def load_ttft(run_dir: str) -> np.ndarray:
    """Per-request TTFT of a run directory: from requests.jsonl, or a simulation's requests.npz."""
    npz = os.path.join(run_dir, "requests.npz")
    path = npz if os.path.exists(npz) else os.path.join(run_dir, "requests.jsonl")
    try:
        if path == npz:
            with np.load(npz) as z:
                return z["ttft"]
        with open(path) as f:
            return np.array([json.loads(line)["ttft"] for line in f], float)
    except OSError as e:
        raise OutputError(f"{path}: {e.strerror}") from None
    except (ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile) as e:  # cut short, not JSON, no TTFT
        raise OutputError(f"{path} is damaged: {e!r}") from None


REPORT_KEYS = ("config", "policy", "jct_s")  # what `dualjax report` and the comparison plot read first


def load_run(run_dir: str) -> tuple[dict, np.ndarray]:
    """(report, per-request TTFT) of a run's or a simulation's --out directory."""
    report_path = os.path.join(run_dir, "report.json")
    if not os.path.exists(report_path):
        raise OutputError(f"{run_dir}: no report.json (is it a run's --out directory?)")
    try:
        with open(report_path) as f:
            report = json.load(f)
    except OSError as e:
        raise OutputError(f"{report_path}: {e.strerror}") from None
    except ValueError as e:
        raise OutputError(f"{report_path} is damaged: {e}") from None
    if not isinstance(report, dict) or any(k not in report for k in REPORT_KEYS):
        raise OutputError(f"{report_path} is not a dualjax run's report (no {', '.join(REPORT_KEYS)})")
    return report, load_ttft(run_dir)
