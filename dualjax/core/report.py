"""Run metrics (report maths): per-request columns, latency statistics, storage-NIC balance, and
the report.json dictionary built from them. Writing the files and plots is `dualjax.outputs`.

Times in records are seconds since the run started. Metrics (docs/architecture.md): JCT, tokens/s,
TTFT / TTST / TPOT (mean, p50, p99), SLO attainment, hit rate, path decisions, and per host the
storage bytes, busy fraction and relay bytes; storage-NIC balance is Max/Avg of per-host bytes
read in 1-s windows, averaged over the steady state (from the first to the last window in which
every NIC read; `snic_max_over_avg_all_windows` counts every window in which any NIC read).
Plots: `storage.png` (storage read bandwidth per host over time) and `ttft_cdf.png`. The simulator writes the same
report from its own columns (`write_report`), and `requests.npz` instead of `requests.jsonl`.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from dualjax.core.records import HostStats, StoreCounters

TIME_KEYS = ("arrival", "scheduled", "prefill_start", "prefill_end", "first_token", "done", "stored")


def _stats(values) -> dict:
    v = np.asarray(values, float)
    v = v[~np.isnan(v)]
    if v.size == 0:
        return {"mean": None, "p50": None, "p99": None}
    return {"mean": float(v.mean()), "p50": float(np.percentile(v, 50)), "p99": float(np.percentile(v, 99))}


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


def snic_balance(hosts: list[HostStats], window_s: float = 1.0, steady: bool = True) -> float | None:
    """Mean over time windows of max/avg bytes read across storage NICs (1.0 = perfectly even).

    `steady`: only the windows from the first to the last in which every NIC read (the ramp-up
    and the tail, when there is not enough work left to keep every NIC busy, are left out);
    otherwise every window in which any NIC read."""
    series = [h.snic.series for h in hosts if h.snic is not None]
    if not series or not any(series):
        return None
    end = max(s[-1][0] for s in series if s)
    edges = np.arange(0.0, end + window_s, window_s)
    per_host = []
    for s in series:
        t = np.array([p[0] for p in s] or [0.0])
        b = np.array([p[1] for p in s] or [0.0])
        cum = np.interp(edges, t, b, left=0.0)
        per_host.append(np.diff(cum))
    m = np.stack(per_host)  # [hosts, windows]
    busy = m.sum(axis=0) > 0
    if steady:
        every = np.flatnonzero((m > 0).all(axis=0))
        if every.size:
            busy[:every[0]] = busy[every[-1] + 1:] = False
    if not busy.any():
        return None
    return float(np.mean(m[:, busy].max(axis=0) / m[:, busy].mean(axis=0)))


COLUMNS = ("prompt_tokens", "gen_len", "hit_tokens", "arrival", "done", "ttft", "ttst", "tpot", "restarts")


def columns(records: list[dict]) -> dict[str, np.ndarray]:
    """Normalised records as the per-request columns a report is computed from (None -> nan)."""
    cols = {k: np.array([np.nan if r.get(k) is None else r.get(k, 0) for r in records], float) for k in COLUMNS}
    cols["path"] = np.array([r["path"] for r in records])
    return cols


def summarize(cols: dict[str, np.ndarray], hosts: list[HostStats], cfg, policy: str,
              slo: tuple[float, float]) -> dict:
    """report.json's metrics from per-request columns (`columns`) and per-host stats."""
    jct = float(cols["done"].max() - cols["arrival"].min())
    gen, prompt, hit = (float(cols[k].sum()) for k in ("gen_len", "prompt_tokens", "hit_tokens"))
    tpot = cols["tpot"]
    per_host = []
    for h in hosts:
        entry = h.to_json()
        entry["storage_busy_fraction"] = h.snic.busy_s / jct if h.snic is not None and jct else None
        per_host.append(entry)
    relay = sum(h.kv_sent_bytes for h in hosts if h.role == "decode")
    paths, counts = np.unique(cols["path"], return_counts=True)
    return {
        "config": {k: (dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v)
                   for k, v in dataclasses.asdict(cfg).items()},
        "policy": policy, "requests": len(cols["done"]), "jct_s": jct, "generated_tokens": int(gen),
        "tokens_per_s": gen / jct if jct else None, "prompt_tokens": int(prompt), "hit_tokens": int(hit),
        "hit_rate": hit / prompt if prompt else 0.0,
        "ttft_s": _stats(cols["ttft"]), "ttst_s": _stats(cols["ttst"]), "tpot_s": _stats(tpot),
        "slo": {"ttft_s": slo[0], "tpot_s": slo[1], "attained": float(np.mean(
            (cols["ttft"] <= slo[0]) & (np.isnan(tpot) | (tpot <= slo[1]))))},
        "paths": {str(p): int(n) for p, n in zip(paths, counts)},
        "restarts": int(cols["restarts"].sum()),
        "store": StoreCounters.total(h.store.counters for h in hosts if h.store is not None).to_json(),
        "relay_bytes": relay, "snic_max_over_avg": snic_balance(hosts),
        "snic_max_over_avg_all_windows": snic_balance(hosts, steady=False),
        "hosts": per_host,
    }
