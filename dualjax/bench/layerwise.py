"""Layerwise prefill of one long-prefix request under a storage NIC cap: does loading overlap compute?

    dualjax bench layerwise --json FILE [--plot FILE] [--quick] [--max-wall-s S]

One request on the `small` model: H hit tokens in the store, M miss tokens to compute. Measured in
one run, on one store on disk:
* load-only: the hit blocks read layer-major through a capped storage NIC into the PE buffer;
* compute-only: the layerwise prefill with every layer's KV already in the buffer;
* layerwise: both at once, layer l computed as soon as layer l of every block has arrived;
* basic (for reference): load everything, then compute.
Trials interleave the four (each trial runs them back to back, in an order that rotates from
trial to trial), so load from other jobs hits them alike; overlap_efficiency = the median over
trials of max(load, compute) / layerwise wall within a trial (overlap_efficiency_of_medians: the
same of the medians). The cap is set from the compute time measured first, so that load and
compute take about as long (the hardest case for overlap); it emulates one host's storage NIC.
peak_kv_layers = most prefix-KV bytes alive on the device at once (from `jax.live_arrays()`),
in layers of this request. `timeline` (and `--plot`): one more layerwise pass and one more basic
one, timed per layer: when each layer's KV was in the PE buffer (`read_s`) and when its compute
was done (`computed_s`, seen by a thread that waits on each layer's result, so the pass itself
waits on nothing new), from the start of the read. `--max-wall-s` bounds the wall time: each of
the two shapes gets an equal share of the time left when it starts, after which it starts no new
trial (after two).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import logging
import os
import statistics
import tempfile
import time

import jax
import numpy as np

import kvstore as kv
import models
from dualjax.bench.common import bench_args, emit, load_page_cache, show_progress, timed, trials_within
from dualjax.core.config import number
from dualjax.outputs import output_file
from dualjax.runtime.buffers import RequestKV
from dualjax.runtime.store import layout_for

log = logging.getLogger("dualjax.bench.layerwise")
MAX_WALL_S, QUICK_MAX_WALL_S = 300.0, 80.0  # --max-wall-s's defaults


def _prefix_bytes_live(shape) -> int:
    return sum(a.nbytes for a in jax.live_arrays() if a.shape == shape)


def _done_at(x) -> float:
    x.block_until_ready()
    return time.perf_counter()


def _prefill(params, cfg, layout, tokens, hit, source, track=None, timeline=None):
    """Layer loop as the prefill host runs it: source(l) -> hit KV of layer l (a view of the PE
    buffer); each layer's new KV starts its device->host copy as soon as it is computed.
    `timeline` (a dict): the `perf_counter` time each layer's hit KV was in (`read`) and its
    compute done (`computed`, from a watcher thread)."""
    T = layout.block_tokens
    lw = models.Layerwise(params, cfg, tokens[None, hit * T:], prefix_len=[hit * T])
    out, watcher, done = None, None, []
    if timeline is not None:
        watcher = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="layerwise-timeline")
        timeline["read"] = []
    for layer in range(cfg.n_layers):
        hit_kv = source(layer)
        if watcher is not None:
            timeline["read"].append(time.perf_counter())
        kv_l = lw.layer(layer, hit_kv[None])
        kv_l.copy_to_host_async()
        if watcher is not None:
            done.append(watcher.submit(_done_at, kv_l))
        if track is not None:
            track.append(_prefix_bytes_live((1, lw.Sb, 2, cfg.n_kv_heads, cfg.head_dim)))
        if out is not None:
            np.asarray(out)  # the previous layer's KV leaves for the DE (host copy) meanwhile
        out = kv_l
    np.asarray(out)
    if watcher is not None:
        timeline["computed"] = [f.result() for f in done]
        watcher.shutdown()
    return np.asarray(lw.logits())


def measure(cfg, hit_tokens: int, miss: int, trials: int, budget_s: float) -> dict:
    """Figures of one shape: `trials` interleaved trials, fewer (at least 2) once `budget_s` seconds
    have passed (a slow machine bounds its own wall time)."""
    t_end = time.perf_counter() + budget_s
    layout = layout_for(cfg)
    params = models.init_params(cfg, seed=0)
    hit, T = hit_tokens // layout.block_tokens, layout.block_tokens
    tokens = np.random.default_rng(0).integers(0, cfg.vocab, hit_tokens + miss).astype(np.int32)
    _, prefix_kv = models.prefill(params, cfg, tokens[None, :hit_tokens])
    full = np.asarray(prefix_kv)[:, 0]  # [L, S, 2, K, H]
    blocks = np.stack([full[:, b * T:(b + 1) * T] for b in range(hit)])  # Full Blocks [n, L, T, 2, K, H]
    ids = kv.block_chain(tokens[:hit_tokens], layout)
    with tempfile.TemporaryDirectory(dir=os.getcwd(), prefix=".bench-layerwise-") as d:
        store = kv.BlockStore(kv.local_spec(os.path.join(d, "store")), layout)
        store.put(ids, blocks)
        hashes = [b.hash for b in ids]
        rkv = RequestKV(layout, hit * T)  # the PE buffer, layer-major as the runtime's: a layer is a view
        buf = rkv.blocks
        layer_of = lambda layer: rkv.layer(layer, hit * T)  # noqa: E731
        load_page_cache([os.path.join(d, "store")])  # from the page cache: the emulated link sets the pace
        store.get_prefix(hashes)  # warm-up of the read path
        np.copyto(buf, blocks)

        def compute():
            return _prefill(params, cfg, layout, tokens, hit, layer_of)

        compute()  # compile
        cap_from = statistics.median(timed(compute).wall_s for _ in range(2))
        cap = layout.block_bytes * hit / cap_from  # load takes about as long as compute
        nic = kv.StorageNIC("pe", cap_bytes_per_s=cap)

        def load():
            nic.read(store, hashes, out=buf, layer_major=True).wait()

        def layerwise(track=None, timeline=None):
            ticket = nic.read(store, hashes, out=buf, layer_major=True)

            def source(layer):
                assert ticket.wait_layer(layer) == hit
                return layer_of(layer)
            return _prefill(params, cfg, layout, tokens, hit, source, track, timeline)

        def read_all():
            nic.read(store, hashes, out=buf, layer_major=False).wait()

        def basic():
            read_all()
            return compute()

        # interleaved: a trial runs each back to back, so a machine that slows down or speeds up
        # (other jobs) moves all four alike; ratios are taken within a trial. The order rotates
        # from trial to trial, so none always runs right after another
        steps, runs = [("compute", compute), ("load", load), ("layerwise", layerwise), ("basic", basic)], []
        for k in trials_within(trials, t_end - time.perf_counter()):
            k %= len(steps)
            runs.append({name: timed(fn).wall_s for name, fn in steps[k:] + steps[:k]})
            log.info("  trial %d: overlap %.3f", len(runs), _overlap(runs[-1]))
        track: list[int] = []
        layerwise(track)  # device memory tracked in a run of its own: scanning live arrays costs time
        t0, marks = time.perf_counter(), {}
        layerwise(timeline=marks)
        t1 = time.perf_counter()
        read_all()
        t2 = time.perf_counter()
        compute()
        timeline = {"read_s": [t - t0 for t in marks["read"]], "computed_s": [t - t0 for t in marks["computed"]],
                    "layerwise_s": t1 - t0, "basic_read_s": t2 - t1, "basic_s": time.perf_counter() - t1}
        nic.close()
        store.close()
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    padded_layer = models.Buckets().prefix(hit_tokens) * 2 * cfg.n_kv_heads * cfg.head_dim * 4
    return {"layers": cfg.n_layers, "hit_tokens": hit_tokens, "miss_tokens": miss, "cap_mbps": cap / 1e6,
            "load_s": med["load"], "compute_s": med["compute"], "layerwise_s": med["layerwise"],
            "basic_s": med["basic"], "trials": len(runs),
            "overlap_efficiency": statistics.median(_overlap(r) for r in runs),
            "overlap_efficiency_of_medians": _overlap(med),
            "layerwise_vs_basic": statistics.median(r["basic"] / r["layerwise"] for r in runs),
            "overlap_ideal": cfg.n_layers / (cfg.n_layers + 1),
            "peak_kv_layers": max(track) / padded_layer, "timeline": timeline}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--plot", metavar="FILE", type=output_file,
                   help="also draw each shape's timeline (per layer: read, compute; and the basic pass) to FILE (PNG)")
    p.add_argument("--max-wall-s", type=number(low_ok=True), default=None,
                   help="wall-time bound: no new trial starts past it, each of the two shapes taking half of the "
                   f"time left, at least two trials each (default {MAX_WALL_S:g}, {QUICK_MAX_WALL_S:g} with --quick)")


def main(argv=None, args=None) -> dict:
    args = bench_args("layerwise", __doc__, add_arguments, argv, args)
    show_progress()
    t_start = time.perf_counter()
    hit_tokens, miss, trials, max_wall_s = (2048, 256, 3, QUICK_MAX_WALL_S) if args.quick else \
        (8192, 512, 5, MAX_WALL_S)
    if args.max_wall_s is not None:
        max_wall_s = args.max_wall_s
    left = lambda: max(0.0, t_start + max_wall_s - time.perf_counter())  # noqa: E731
    small = models.get_config("small")
    log.info("small (%d layers)", small.n_layers)
    result = {"benchmark": "layerwise", "model": small.name, **measure(small, hit_tokens, miss, trials, left() / 2)}
    deep = small.replace(name="small-16l", n_layers=16)
    log.info("the same shape with 16 layers")
    result["small_16_layers"] = measure(deep, hit_tokens, miss, trials, left())
    result["notes"] = (
        "Trials interleaved; times are medians, ratios medians of per-trial ratios. Storage NIC cap emulated, "
        "set so load ~= compute (the hardest case); reads really come "
        "from the store on disk; compute on CPU in float32, sharing the machine's cores with the reads. Layer-by-layer "
        "pipelining has a fill cost: with load = compute the best wall is (L+1)/L of either, so the ideal "
        "efficiency is L/(L+1) (0.8 for the 4-layer `small`, 0.94 for 16 layers; real models have 16-64). "
        "peak_kv_layers counts live device arrays of the per-layer prefix KV (padded to the prefix bucket).")
    result["wall_s"] = time.perf_counter() - t_start
    if args.plot:
        from dualjax.plots import plot_layerwise
        plot_layerwise(args.plot, result)
    emit(result, args.json)
    return result


def _overlap(times: dict) -> float:
    """max(load, compute) / layerwise: how much of the shorter one the layerwise pass hid."""
    return max(times["load"], times["compute"]) / times["layerwise"]


if __name__ == "__main__":
    main()
