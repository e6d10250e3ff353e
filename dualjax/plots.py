"""Plots of runs and benchmarks (matplotlib, written as PNG): storage bandwidth per host, TTFT CDF, JCT per
run, the data plane per stage, layerwise timelines."""

from __future__ import annotations

import os

import numpy as np


def _pyplot():
    """matplotlib's pyplot on the file-only Agg backend, imported on the first plot: a rank that
    never draws (every host of an mpiexec job) does not pay its ~0.7 s of import."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _bandwidth(series, window_s: float):
    """(window centres, MB/s) from (time, cumulative bytes) points."""
    if not series:
        return np.zeros(0), np.zeros(0)
    t, b = np.array([p[0] for p in series]), np.array([p[1] for p in series], float)
    edges = np.arange(0.0, t[-1] + window_s, window_s)
    cum = np.interp(edges, t, b, left=0.0)
    return edges[1:] - window_s / 2, np.diff(cum) / window_s / 1e6


def plot_run(out_dir: str, report: dict, ttft) -> None:
    """storage.png and ttft_cdf.png for one run."""
    plt = _pyplot()
    series = report.get("storage_series", {})
    fig, ax = plt.subplots(figsize=(7, 3.5))
    window = max(0.05, report["jct_s"] / 60)
    if len(series) <= 8:
        for host, s in sorted(series.items()):
            x, y = _bandwidth(s, window)
            ax.plot(x, y, label=host)
    else:  # many hosts (simulated clusters): each role's mean, and its min-max band
        for role in ("prefill", "decode"):
            curves = [_bandwidth(s, window) for h, s in series.items() if h.startswith(role)]
            if not curves:
                continue
            n = min(len(y) for _, y in curves)
            x, ys = curves[0][0][:n], np.stack([y[:n] for _, y in curves])
            line, = ax.plot(x, ys.mean(axis=0), label=f"{role} nodes (mean of {len(curves)})")
            ax.fill_between(x, ys.min(axis=0), ys.max(axis=0), color=line.get_color(), alpha=0.25)
    ax.set(xlabel="time since the run started (s)", ylabel="storage read (MB/s)",
           title=f"{report['policy']}: storage read bandwidth per host ({window:.2f} s windows)")
    if series:
        ax.legend()
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "storage.png"), dpi=100)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(5, 3.5))
    _cdf(ax, ttft, report["policy"])
    ax.set(xlabel="TTFT (s)", ylabel="fraction of requests", title="time to first token")
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "ttft_cdf.png"), dpi=100)
    plt.close(fig)


def _cdf(ax, values, label) -> None:
    v = np.sort(np.asarray(values, float))
    v = v[~np.isnan(v)]
    ax.step(v, np.arange(1, len(v) + 1) / len(v), where="post", label=label)


def plot_compare(path: str, runs: list[dict]) -> None:
    """One figure comparing runs, real and simulated alike: JCT per run, TTFT CDFs, and the storage
    NICs' max/avg over time (1.0: every NIC read as much). Each run: name, kind, jct_s, ttft (per
    request) and balance ((window times, max/avg), `dualjax.core.report.balance_over_time`)."""
    plt = _pyplot()
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(15, 4))
    names = [f"{r['name']} ({'sim' if r['kind'] == 'simulated' else 'real'})" for r in runs]
    a.bar(range(len(runs)), [r["jct_s"] for r in runs],
          color=["tab:orange" if r["kind"] == "simulated" else "tab:blue" for r in runs])
    a.set_xticks(range(len(runs)), names, rotation=30, ha="right", fontsize=8)
    a.set(ylabel="job completion time (s)", title="JCT per run (blue: real, orange: simulated)")
    for name, r in zip(names, runs):
        _cdf(b, r["ttft"], name)
        t, ratio = r["balance"]
        c.plot(t / max(r["jct_s"], 1e-9), ratio, label=name)
    b.set(xlabel="TTFT (s)", ylabel="fraction of requests", title="TTFT CDF")
    b.legend(fontsize=7, loc="lower right")
    c.axhline(1.0, color="gray", lw=0.8)
    c.set(xlabel="time / JCT", ylabel="max / avg of the storage NICs' bytes", title="storage-NIC balance over time")
    c.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_dataplane(path: str, result: dict) -> None:
    """`bench dataplane`'s breakdown: per run (embedded, mpiexec) and path (PE, DE), the path's time
    as the raw read, the store's shortfall and what the data plane adds, with the path's bound and
    its first layer's arrival marked."""
    plt = _pyplot()
    rows = [(f"{name} {p.upper()} path", result[run]["stages"][p])
            for run, name in (("embedded", "embedded"), ("mpi", "mpiexec")) if run in result for p in ("pe", "de")]
    parts = (("raw_read_s", "raw read (same bytes)", "tab:gray"),
             ("store_over_raw_s", "store read beyond raw", "tab:blue"),
             ("dataplane_over_store_s", "data plane beyond the store read", "tab:orange"))
    fig, ax = plt.subplots(figsize=(8, 0.6 * len(rows) + 2.2))
    y = np.arange(len(rows))[::-1]
    left = np.zeros(len(rows))
    for key, label, color in parts:
        w = np.array([max(s[key], 0.0) for _, s in rows]) * 1e3
        ax.barh(y, w, left=left, color=color, label=label)
        left += w
    ax.scatter([s["bound_s"] * 1e3 for _, s in rows], y, marker="|", s=400, color="black",
               label="bound (stages overlapped)")
    ax.scatter([s["first_layer_s"] * 1e3 for _, s in rows], y, marker="v", color="tab:green", label="first layer in")
    ax.set_yticks(y, [name for name, _ in rows])
    ax.set(xlabel="ms for the same bytes", title=f"where the data plane's time goes: {result['requests']} requests x "
           f"{result['hit_tokens_per_request']} hit tokens, {result['layout'].split(' [')[0]}")
    ax.title.set_fontsize(9)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_layerwise(path: str, result: dict) -> None:
    """`bench layerwise`'s timelines, one panel per shape: when each layer's hit KV was read into the
    PE buffer and when its compute ran, in the layerwise pass, above the basic pass (read all, then
    compute) of the same request."""
    plt = _pyplot()
    shapes = [result, result["small_16_layers"]]
    fig, axes = plt.subplots(len(shapes), 1, figsize=(9, 2.3 * len(shapes) + 0.6))
    for ax, r in zip(axes, shapes):
        tl = r["timeline"]
        read, done = tl["read_s"], tl["computed_s"]
        starts = [0.0, *read[:-1]]
        for layer, (a, b) in enumerate(zip(starts, read)):
            ax.barh(2, b - a, left=a, color=("tab:blue", "lightsteelblue")[layer % 2], edgecolor="white")
            c0 = max(b, done[layer - 1] if layer else 0.0)
            ax.barh(1, done[layer] - c0, left=c0, color=("tab:orange", "navajowhite")[layer % 2], edgecolor="white")
        ax.barh(0, tl["basic_read_s"], color="tab:blue", edgecolor="white", label="storage read")
        ax.barh(0, tl["basic_s"] - tl["basic_read_s"], left=tl["basic_read_s"], color="tab:orange",
                edgecolor="white", label="compute")
        ax.axvline(tl["layerwise_s"], color="black", lw=1, ls="--", label="layerwise pass done")
        ax.set_yticks([2, 1, 0], ["layerwise: read", "layerwise: compute", "basic: read, then compute"])
        ax.set(xlabel="s from the start of the read",
               title=f"{result['model']}, {r['layers']} layers, {r['hit_tokens']} hit + {r['miss_tokens']} new "
                     f"tokens: overlap {r['overlap_efficiency']:.2f} (ideal {r['overlap_ideal']:.2f}), capped read "
                     f"{r['cap_mbps']:.0f} MB/s")
        ax.title.set_fontsize(9)
        ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_sweep(path: str, groups: list[dict]) -> None:
    """A sweep's regimes (`dualjax.sim.sweep.regimes_table`): each policy's mean JCT relative to the best
    policy's in each regime (a cell per policy and regime, the best framed), and the best policy's JCT."""
    plt = _pyplot()
    policies = sorted({p for g in groups for p in g["relative"]})
    names = [g["group"].replace(" / ", "\n") for g in groups]
    rel = np.array([[g["relative"].get(p, np.nan) for g in groups] for p in policies])
    fig, (a, b) = plt.subplots(2, 1, figsize=(min(24.0, 1.3 * len(groups) + 3), 0.45 * len(policies) + 5.5),
                               gridspec_kw={"height_ratios": [max(2.0, 0.45 * len(policies)), 2.2]})
    top = float(np.nanmax(rel)) if np.isfinite(rel).any() else 1.0
    im = a.imshow(rel, cmap="RdYlGn_r", vmin=1.0, vmax=max(1.1, min(top, 3.0)), aspect="auto")
    for i, p in enumerate(policies):
        for j, g in enumerate(groups):
            if np.isfinite(rel[i, j]):
                a.text(j, i, f"{rel[i, j]:.2f}", ha="center", va="center", fontsize=7,
                       fontweight="bold" if p in g["tied"] else "normal")
                if p in g["tied"]:
                    a.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, lw=1.5, color="black"))
    a.set_xticks(range(len(groups)), names, fontsize=7)
    a.set_yticks(range(len(policies)), policies, fontsize=8)
    a.set_title("JCT / the best policy's JCT, per regime (mean over seeds; framed: the best)", fontsize=10)
    fig.colorbar(im, ax=a, fraction=0.02, pad=0.01)
    best = [g["jct_s"][g["best"]] for g in groups]
    b.bar(range(len(groups)), best, color="tab:green")
    for j, g in enumerate(groups):
        more = f" +{len(g['tied']) - 1}" if len(g["tied"]) > 1 else ""
        b.annotate(g["best"] + more, (j, best[j]), ha="center", va="bottom", fontsize=7)
    b.set_xticks(range(len(groups)), names, fontsize=7)
    b.set_xlim(-0.5, len(groups) - 0.5)
    b.set(ylabel="JCT (s)", yscale="log", title="the best policy's JCT, per regime (+N: tied with N others)")
    b.title.set_fontsize(10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
