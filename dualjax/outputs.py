"""Run outputs, one format for real runs and simulations (docs/report.md): `requests.parquet` (the
request table, one row per request), `report.json` (run metrics, from `dualjax.core.report`) and two
plots, written by `write_run` and read back by `load_run`.

The table is Parquet (zstd): columnar and compressed, so a simulated run of millions of requests stays
a few hundred MB and loads in seconds, and pandas, polars, DuckDB, R and Spark read it without dualjax;
a list column holds a real run's generated token ids. Each column's unit and meaning travel in the
file's schema metadata, and the file's metadata names its schema version and kind of run.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import os
from typing import NamedTuple

import numpy as np

from dualjax.core.records import HostStats
from dualjax.core.report import REQUEST_COLUMNS, SCHEMA_VERSION, balance_over_time, columns, normalise
from dualjax.plots import plot_run

TABLE, REPORT = "requests.parquet", "report.json"
KINDS = ("real", "simulated")
# what readers of report.json (`dualjax report`, `comparison`) take from it; each key's JSON types are the
# schema's (report.schema.json), and a parent is listed before its keys
READ_KEYS = ("config", "config.cluster", "config.cluster.prefill", "config.cluster.decode", "policy", "requests",
             "jct_s", "tokens_per_s", "hit_rate", "ttft_s", "ttft_s.p50", "ttft_s.p99", "tpot_s", "tpot_s.p50", "slo",
             "slo.attained", "snic_max_over_avg", "relay_bytes", "workload", "workload.odd_records", "store",
             "storage_series", "sim")
_JSON_TYPES = {"object": ((dict,), "an object"), "integer": ((int,), "an integer"),
               "number": ((int, float), "a number"), "string": ((str,), "a string"), "null": ((type(None),), "null"),
               "array": ((list,), "an array"), "boolean": ((bool,), "a boolean")}


class OutputError(FileNotFoundError):
    """A directory that holds no run outputs, damaged ones, or outputs of another schema version."""


_made: list[str] = []  # the outermost directory each unwritable_dir call made, for remove_unused_dirs


def unwritable_dir(path: str) -> str | None:
    """Why `path` cannot hold a command's outputs, or None: it is made now, with its parents, so that
    a long run never ends failing to write its result."""
    if os.path.exists(path) and not os.path.isdir(path):
        return f"{path} is a file, not a directory"
    top = os.path.abspath(path)
    while not os.path.exists(os.path.dirname(top)):
        top = os.path.dirname(top)
    made = not os.path.exists(top)
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        return f"cannot make directory {path}: {e.strerror}"
    if made:
        _made.append(top)
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
    if os.path.exists(path):
        return None if os.access(path, os.W_OK) else f"cannot write {path}: permission denied"
    try:  # made and removed: what permissions alone do not tell (root, /proc, a read-only mount)
        open(path, "x").close()
        os.remove(path)
    except FileExistsError:  # made meanwhile (another process checking the same flag)
        return None
    except OSError as e:
        return f"cannot write {path}: {e.strerror}"
    return None


@contextlib.contextmanager
def writing(path: str):
    """Around the code that writes the file `path`: a failure to write it (a disk full, a directory
    gone since the flags were checked) is OutputError `cannot write PATH: reason`, not a traceback."""
    try:
        yield
    except OSError as e:
        raise OutputError(f"cannot write {path}: {e.strerror or e}") from None


def write_json(path: str, obj) -> None:
    """`obj` as one indented JSON object in the file `path` (a command's --json)."""
    with writing(path), open(path, "w") as f:
        f.write(json.dumps(obj, indent=1) + "\n")


def remove_unused_dirs() -> None:
    """Remove the directories `unwritable_dir` made that are still empty: a command that ends in
    bad input leaves nothing behind."""
    for top in reversed(_made):
        for root, _, _ in os.walk(top, topdown=False):
            try:
                os.rmdir(root)  # only an empty directory goes
            except OSError:
                pass
    _made.clear()


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


def real_columns(records: list[dict], hosts: list[HostStats]) -> tuple[dict[str, np.ndarray], list[HostStats]]:
    """A real run's request table and host stats on the run's clock (seconds since the first arrival),
    from the driver's records (wall times). Does not modify `records` or `hosts`."""
    t0 = min(r["arrival"] for r in records)
    return columns(normalise(records)), [_on_run_clock(h, t0) for h in hosts]


# -- the request table ---------------------------------------------------------------------------------

def _arrow_table(cols: dict[str, np.ndarray], kind: str):
    """The request table as an Arrow table: REQUEST_COLUMNS' order and types, NaN -> null, units in the schema."""
    import pyarrow as pa
    arrays, fields = [], []
    for k, (typ, unit, meaning) in REQUEST_COLUMNS.items():
        v = cols[k]
        if typ == "float":
            a = pa.array(v, pa.float64(), mask=np.isnan(v))
        elif typ == "int":
            a = pa.array(v, pa.int64())
        elif typ == "str":
            a = pa.array(v.astype(str), pa.string()).dictionary_encode()
        else:
            a = _id_lists(v)
        arrays.append(a)
        fields.append(pa.field(k, a.type, metadata={"unit": unit, "meaning": meaning}))
    meta = {"dualjax.schema_version": str(SCHEMA_VERSION), "dualjax.kind": kind}
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields, metadata=meta))


def _id_lists(v: np.ndarray):
    """An object array of int arrays (None: null) as an Arrow list<int32> array, built from offsets."""
    import pyarrow as pa
    present = np.array([x is not None for x in v], bool)
    lengths = np.array([len(x) if x is not None else 0 for x in v], np.int32)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    values = np.concatenate([np.asarray(x, np.int32) for x in v if x is not None] or [np.zeros(0, np.int32)])
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, pa.int32()),
                                    mask=pa.array(~present) if not present.all() else None)


def write_table(path: str, cols: dict[str, np.ndarray], kind: str) -> None:
    """The request table `cols` (every column of REQUEST_COLUMNS) as a Parquet file."""
    import pyarrow.parquet as pq
    pq.write_table(_arrow_table(cols, kind), path, compression="zstd")


def read_table(path: str, columns: list[str] | None = None) -> dict[str, np.ndarray]:
    """Columns of a request table file as NumPy arrays: floats (null -> NaN), int64, `path` as str,
    `generated` as an object array of int32 arrays (None where null)."""
    import pyarrow.parquet as pq
    table = pq.read_table(path, columns=columns)
    out = {}
    for k in table.column_names:
        col = table.column(k)
        typ = REQUEST_COLUMNS.get(k, ("",))[0]
        if typ == "ids":
            out[k] = _lists_to_numpy(col.combine_chunks())
        elif typ == "str":  # dictionary-encoded: its few values indexed, not a Python string per row
            d = col.combine_chunks()
            out[k] = np.asarray(d.dictionary.to_pylist(), dtype=str)[d.indices.to_numpy()] if len(d) else \
                np.zeros(0, dtype=str)
        else:
            out[k] = col.to_numpy()
    return out


def _lists_to_numpy(a) -> np.ndarray:
    out = np.empty(len(a), dtype=object)
    if a.null_count == len(a):
        return out
    offsets, values = a.offsets.to_numpy(), a.values.to_numpy(zero_copy_only=False)
    valid = ~a.is_null().to_numpy(zero_copy_only=False)
    for i in np.flatnonzero(valid):
        out[i] = values[offsets[i]:offsets[i + 1]]
    return out


# -- a run directory -----------------------------------------------------------------------------------

def write_run(out_dir: str, cols: dict[str, np.ndarray], report: dict) -> None:
    """A run's request table, report.json and plots (storage.png, ttft_cdf.png) under `out_dir`."""
    os.makedirs(out_dir, exist_ok=True)
    write_table(os.path.join(out_dir, TABLE), cols, report["kind"])
    with open(os.path.join(out_dir, REPORT), "w") as f:
        f.write(report_json(report))
    plot_run(out_dir, report, cols["ttft"])


def report_json(report: dict) -> str:
    """report.json's text: indented for reading, except that each host's storage series is one line
    (a point per second per host; indented, it would be most of the file)."""
    series = report.get("storage_series")
    if not series:
        return json.dumps(report, indent=1)
    text = json.dumps({**report, "storage_series": "SERIES"}, indent=1)
    lines = ",\n".join(f"  {json.dumps(h)}: {json.dumps(points, separators=(',', ':'))}"
                        for h, points in series.items())
    return text.replace('"storage_series": "SERIES"', '"storage_series": {\n' + lines + "\n }")


class Run(NamedTuple):
    """A run read back: its report.json and its request table (NumPy columns by name)."""

    report: dict
    requests: dict[str, np.ndarray]


def load_report(run_dir: str) -> dict:
    """report.json of a run directory, checked to be a real or simulated run of this schema version."""
    path = os.path.join(run_dir, REPORT)
    if not os.path.exists(path):
        raise OutputError(f"{run_dir}: no {REPORT} (is it a run's --out directory?)")
    try:
        with open(path) as f:
            report = json.load(f)
    except OSError as e:
        raise OutputError(f"{path}: {e.strerror}") from None
    except ValueError as e:
        raise OutputError(f"{path} is damaged: {e}") from None
    if not isinstance(report, dict) or report.get("kind") not in KINDS:
        raise OutputError(f"{path} is neither a real nor a simulated dualjax run (no kind real or simulated)")
    if report.get("schema_version") != SCHEMA_VERSION:
        raise OutputError(f"{path} has schema version {report.get('schema_version')!r}; this dualjax reads "
                          f"version {SCHEMA_VERSION} (docs/report.md)")
    if why := _unreadable(report):
        raise OutputError(f"{path} is damaged: {why}")
    return report


@functools.cache
def _schema() -> dict:
    with open(os.path.join(os.path.dirname(__file__), "report.schema.json")) as f:
        return json.load(f)


def _unreadable(report: dict) -> str | None:
    """What of READ_KEYS `report` lacks or holds with another type than the schema's, or None."""
    schema = _schema()
    keys = READ_KEYS + (("sim.config", "sim.config.window_s") if report.get("sim") else ())
    for key in keys:
        *parents, last = key.split(".")
        v, node = report, schema
        for k in parents:
            v, node = v[k], node["properties"][k]  # a dict: each parent is checked before its keys
        if last not in v:
            return f"no {key}"
        kinds = node["properties"][last]["type"]
        kinds = kinds if isinstance(kinds, list) else [kinds]
        types = tuple(t for k in kinds for t in _JSON_TYPES[k][0])
        if not isinstance(v[last], types) or (isinstance(v[last], bool) and "boolean" not in kinds):
            return f"{key} is {json.dumps(v[last])[:40]}, not {' or '.join(_JSON_TYPES[k][1] for k in kinds)}"
    return None


def load_run(run_dir: str, columns: list[str] | None = None) -> Run:
    """(report, request table) of a real run's or a simulation's --out directory; `columns` reads only
    those columns of the table (e.g. ["ttft"]). Raises OutputError naming what is wrong."""
    report = load_report(run_dir)
    path = os.path.join(run_dir, TABLE)
    if not os.path.exists(path):
        raise OutputError(f"{run_dir}: no {TABLE} beside its {REPORT}")
    unknown = sorted(set(columns or ()) - set(REQUEST_COLUMNS))
    if unknown:
        raise OutputError(f"no column {', '.join(unknown)} in a request table (docs/report.md)")
    import pyarrow as pa
    try:
        return Run(report, read_table(path, columns))
    except (OSError, pa.ArrowException) as e:  # not Parquet, cut short, unreadable
        raise OutputError(f"{path} is damaged: {str(e).splitlines()[0][:200]}") from None


def comparison(named: list[tuple[str, Run]]) -> list[dict]:
    """What `plots.plot_compare` draws of each (name, run): JCT, per-request TTFT and the storage-NIC
    balance over time, in windows of a sixtieth of the run (at least the series' resolution)."""
    out = []
    for name, (report, requests) in named:
        series = list(report["storage_series"].values())
        step = report["sim"]["config"]["window_s"] if report["sim"] else 0.05  # a simulation's series' resolution
        t, ratio = balance_over_time(series, max(report["jct_s"] / 60, step)) if series else (np.zeros(0),) * 2
        balance = (t[t < report["jct_s"]], ratio[t < report["jct_s"]])
        out.append({"name": name, "kind": report["kind"], "jct_s": report["jct_s"], "ttft": requests["ttft"],
                    "balance": balance})
    return out
