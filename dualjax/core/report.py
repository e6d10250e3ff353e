"""Run metrics (report maths): per-request columns, latency statistics, storage-NIC balance, and
the report.json dictionary built from them. Writing the files and plots is `dualjax.outputs`.

Times in records are seconds since the run started. Metrics (docs/architecture.md): JCT, tokens/s,
TTFT / TTST / TPOT (mean, p50, p99), SLO attainment, hit rate, path decisions, and per host the
storage bytes, busy fraction and relay bytes; storage-NIC balance is Max/Avg of per-host bytes
read in 1-s windows, averaged over the steady state (from the first to the last window in which
every NIC read; `snic_max_over_avg_all_windows` counts every window in which any NIC read).
Real runs and simulations build the same report (`build_report`) from the same request table
(`REQUEST_COLUMNS`); their own keys go under `runtime` and `sim`. docs/report.md documents every key.
"""

from __future__ import annotations

import dataclasses
import statistics

import numpy as np

from dualjax.core.config import Settings
from dualjax.core.records import HostStats, StoreCounters

TIME_KEYS = ("arrival", "scheduled", "prefill_start", "prefill_end", "first_token", "done", "stored")


def _stats(values) -> dict:
    v = np.asarray(values, float)
    v = v[~np.isnan(v)]
    if v.size == 0:
        return {"mean": None, "p50": None, "p99": None}
    return {"mean": float(v.mean()), "p50": float(np.percentile(v, 50)), "p99": float(np.percentile(v, 99))}


def spread(values: list[float]) -> dict:
    """Repeats of one figure: their number, least, median and most, and (most - least) / median."""
    med = statistics.median(values)
    return {"n": len(values), "min": min(values), "median": med, "max": max(values),
            "spread": (max(values) - min(values)) / med if med else None}


def normalise(records: list[dict]) -> list[dict]:
    """Absolute wall times -> seconds since the first arrival; adds per-request latencies."""
    t0 = min(r["arrival"] for r in records)
    out = []
    for r in records:
        r = dict(r)
        for k in TIME_KEYS:
            if k in r:
                r[k] = r[k] - t0
        tt = [t - t0 for t in r.pop("token_times", [])]
        r["ttft"] = r["first_token"] - r["arrival"]
        r["ttst"] = tt[1] - tt[0] if len(tt) > 1 else None  # time to second token: from the first
        r["tpot"] = (tt[-1] - tt[0]) / (len(tt) - 1) if len(tt) > 1 else None
        out.append(r)
    return out


def window_bytes(series: list[list], window_s: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """(window start times, bytes read per host and window [hosts, windows]) from per-host series of
    (seconds, cumulative bytes) points."""
    end = max((s[-1][0] for s in series if len(s)), default=0.0)
    edges = np.arange(0.0, end + window_s, window_s)
    per_host = []
    for s in series:
        t = np.array([p[0] for p in s] or [0.0])
        b = np.array([p[1] for p in s] or [0.0])
        per_host.append(np.diff(np.interp(edges, t, b, left=0.0)))
    return edges[:-1], np.stack(per_host)


def balance_over_time(series: list[list], window_s: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """(window start times, max/avg of the bytes the storage NICs read in each window; NaN where none read)."""
    t, m = window_bytes(series, window_s)
    with np.errstate(invalid="ignore", divide="ignore"):
        return t, np.where(m.sum(axis=0) > 0, m.max(axis=0) / m.mean(axis=0), np.nan)


def snic_balance(hosts: list[HostStats], window_s: float = 1.0, steady: bool = True) -> float | None:
    """Mean over time windows of max/avg bytes read across storage NICs (1.0 = perfectly even).

    `steady`: only the windows from the first to the last in which every NIC read (the ramp-up
    and the tail, when there is not enough work left to keep every NIC busy, are left out);
    otherwise every window in which any NIC read."""
    series = [h.snic.series for h in hosts if h.snic is not None]
    if not series or not any(series):
        return None
    _, m = window_bytes(series, window_s)  # [hosts, windows]
    busy = m.sum(axis=0) > 0
    if steady:
        every = np.flatnonzero((m > 0).all(axis=0))
        if every.size:
            busy[:every[0]] = busy[every[-1] + 1:] = False
    if not busy.any():
        return None
    return float(np.mean(m[:, busy].max(axis=0) / m[:, busy].mean(axis=0)))


SCHEMA_VERSION = 2  # of report.json and the request table (docs/report.md); a change of either bumps it

# The request table (requests.parquet, docs/report.md): name -> (kind, unit, meaning). Real and simulated runs
# write every column; one a source does not measure is null there.
REQUEST_COLUMNS: dict[str, tuple[str, str, str]] = {
    "id": ("int", "", "request id, in the order requests reached the scheduler"),
    "agent": ("int", "", "agent (trajectory or session) index"),
    "turn": ("int", "", "turn of the agent, from 0"),
    "prompt_tokens": ("int", "tokens", "prompt length"),
    "hit_tokens": ("int", "tokens", "prompt tokens whose KV was read from storage (whole blocks)"),
    "de_tokens": ("int", "tokens", "of hit_tokens, those the decode host read and relayed (the rest the prefill "
                  "host read)"),
    "recomputed_tokens": ("int", "tokens", "prompt tokens whose KV was in the store but which the request's plan "
                          "recomputed instead of loading (whole blocks, the tail of the stored prefix)"),
    "gen_len": ("int", "tokens", "tokens the request generates"),
    "path": ("str", "", "read path of the hit KV: pe, de, split (both sides read a share), or none (a run without "
             "a store)"),
    "pe": ("int", "rank", "prefill engine"),
    "de": ("int", "rank", "decode engine"),
    "restarts": ("int", "", "times the prefill restarted with fewer hit blocks (bad blocks found mid-read)"),
    "arrival": ("float", "s", "the request reached the scheduler (the previous turn's end plus any pause)"),
    "scheduled": ("float", "s", "the scheduler placed it on engines"),
    "prefill_start": ("float", "s", "its (first) prefill pass started"),
    "prefill_end": ("float", "s", "its last prefill pass ended"),
    "first_token": ("float", "s", "the first generated token was out: the end of the PE's last prefill pass, "
                    "which samples it (= prefill_end)"),
    "done": ("float", "s", "the last generated token was out"),
    "ttft": ("float", "s", "time to first token: first_token - arrival"),
    "ttst": ("float", "s", "time to second token: second token (the DE's first step after the prompt's KV is in "
             "its device memory) - first token; null when gen_len is 1"),
    "tpot": ("float", "s", "time per output token after the first; null when gen_len is 1"),
    "stored": ("float", "s", "real runs: its KV was written back to the store; null when simulated"),
    "load_wait": ("float", "s", "simulated, Basic: from the row's admission by its PE until its KV load started "
                  "(its batch formed, with memory); null in real runs and layerwise prefill"),
    "generated": ("ids", "token ids", "real runs: the generated token ids; null when simulated"),
}
PATHS = ("pe", "de", "split", "none")


def columns(records: list[dict]) -> dict[str, np.ndarray]:
    """A real run's normalised records (`normalise`) as the request table's columns (None -> NaN)."""
    cols = {}
    for k, (kind, _, _) in REQUEST_COLUMNS.items():
        if kind == "float":
            cols[k] = np.array([np.nan if r.get(k) is None else r[k] for r in records], np.float64)
        elif kind == "int":
            cols[k] = np.array([r.get(k, 0) for r in records], np.int64)
    cols["path"] = np.array([r["path"] for r in records], dtype=object)
    cols["generated"] = np.empty(len(records), dtype=object)  # one array per request, whatever their lengths
    for i, r in enumerate(records):
        cols["generated"][i] = np.asarray(r.get("generated", []), np.int32)
    return cols


def complete(cols: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`cols` as the request table: every column of REQUEST_COLUMNS in its kind (missing ones null: NaN
    or None), `id` numbered when absent."""
    n = len(cols["arrival"])
    out = {}
    for k, (kind, _, _) in REQUEST_COLUMNS.items():
        v = cols.get(k)
        if kind == "float":
            out[k] = np.full(n, np.nan) if v is None else np.asarray(v, np.float64)
        elif kind == "int":
            out[k] = (np.arange(n) if k == "id" else np.zeros(n, np.int64)) if v is None else np.asarray(v, np.int64)
        else:
            out[k] = np.full(n, None, dtype=object) if v is None else np.asarray(v, dtype=object)
    return out


def summarize(cols: dict[str, np.ndarray], hosts: list[HostStats], cfg, policy: str,
              slo: tuple[float, float]) -> dict:
    """report.json's run metrics (docs/report.md) from the request table's columns and per-host stats;
    `build_report` adds the rest."""
    jct = float(cols["done"].max() - cols["arrival"].min())
    gen, prompt, hit, de, recomputed = (float(cols[k].sum()) for k in ("gen_len", "prompt_tokens", "hit_tokens",
                                                                       "de_tokens", "recomputed_tokens"))
    tpot = cols["tpot"]
    per_host = []
    for h in hosts:
        entry = h.to_json()
        entry["storage_busy_fraction"] = h.snic.busy_s / jct if h.snic is not None and jct else None
        per_host.append(entry)
    relay = sum(h.kv_sent_bytes for h in hosts if h.role == "decode")
    paths, counts = np.unique(cols["path"].astype(str), return_counts=True)
    return {
        "config": settings_json(cfg)[0],
        "policy": policy, "requests": len(cols["done"]), "jct_s": jct, "generated_tokens": int(gen),
        "tokens_per_s": gen / jct if jct else None, "prompt_tokens": int(prompt), "hit_tokens": int(hit),
        "hit_rate": hit / prompt if prompt else 0.0, "de_tokens": int(de), "recomputed_tokens": int(recomputed),
        "ttft_s": _stats(cols["ttft"]), "ttst_s": _stats(cols["ttst"]), "tpot_s": _stats(tpot),
        "slo": {"ttft_s": slo[0], "tpot_s": slo[1], "attained": float(np.mean(
            (cols["ttft"] <= slo[0]) & (np.isnan(tpot) | (tpot <= slo[1]))))},
        "paths": dict.fromkeys(PATHS, 0) | {str(p): int(n) for p, n in zip(paths, counts)},
        "restarts": int(cols["restarts"].sum()),
        "store": StoreCounters.total(h.store.counters for h in hosts if h.store is not None).to_json(),
        "relay_bytes": relay, "snic_max_over_avg": snic_balance(hosts),
        "snic_max_over_avg_all_windows": snic_balance(hosts, steady=False),
        "hosts": per_host,
    }


def settings_json(cfg) -> tuple[dict, dict]:
    """(the settings every run has, those only this kind of run has) of a RunConfig or SimConfig, as JSON."""
    shared = {f.name for f in dataclasses.fields(Settings)}
    values = {k: (dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v)
              for k, v in dataclasses.asdict(cfg).items()}
    return ({k: v for k, v in values.items() if k in shared}, {k: v for k, v in values.items() if k not in shared})


def build_report(kind: str, cols: dict[str, np.ndarray], hosts: list[HostStats], cfg, policy: str,
                 slo: tuple[float, float], workload: dict, own: dict) -> dict:
    """The whole report.json (docs/report.md) of a `kind` ("real" or "simulated") run: the metrics, the
    workload's odd records and trace hits (`workload.workload_report`), the storage series, and `own`
    (this kind's own keys, with its own settings added as `config`) under "runtime" or "sim"."""
    report = {"schema_version": SCHEMA_VERSION, "kind": kind, **summarize(cols, hosts, cfg, policy, slo),
              "workload": workload,
              "storage_series": {f"{h.role}{h.rank}": [list(p) for p in h.snic.series]
                                 for h in hosts if h.snic is not None}}
    mine = {"config": settings_json(cfg)[1], **own}
    report["runtime"], report["sim"] = (mine, None) if kind == "real" else (None, mine)
    return report
