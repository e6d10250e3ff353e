"""`dualjax calibrate`: measure this machine into the simulator's `local` hardware profile.

What the embedded runtime's hosts spend, measured here with the runtime's own code:
* prefill: seconds of the model's padded layerwise passes by shape (rows, padded new, padded
  prefix) for every bucket the workload reaches (the table the simulator's passes take), and the
  fit `AttentionFit` a PE packs its passes with (`dualjax.runtime.startup.attention_fit`);
* decode: seconds of one fixed-shape decode step (`DecodeCache.step` over `decode_slots` slots)
  at several slot capacities, fitted as d0 + d1 * capacity;
* storage: Full Block read rate of a scratch store beside the run's (`profile.store_read_bytes_per_s`);
* relay: bytes/s of `LayerKV` messages through the in-process transport (one copy each);
* contention: how much a prefill pass and a decode step slow down while 1, 2 or 3 other engines
  compute (all embedded hosts share this machine's cores);
* host overheads: a one-agent embedded run times the hosts' own passes and steps, which do more
  than the bare model (prefix assembly, sends, bookkeeping); the table and the decode fit are
  scaled to match.
One engine per host, as `dualjax run --embedded` runs: every host is its own node.
"""

from __future__ import annotations

import math
import os
import shutil
import time

import numpy as np
import scipy.optimize

import models
from dualjax.core.config import ClusterSpec, RunConfig
from dualjax.core.records import PassTally
from dualjax.core.workload import get_workload, turn_lengths
from dualjax.runtime.messages import LayerKV
from dualjax.runtime.startup import (
    attention_fit,
    params_for,
    prefill_seconds,
    prefill_tokens_per_s,
    store_read_bytes_per_s,
)
from dualjax.runtime.store import run_layout
from dualjax.runtime.transport import InProcFabric
from dualjax.sim.profiles import DEFAULT_LOCAL, Hardware, save_hardware
from models.buckets import DEFAULT_BUCKETS

CAPACITIES = (256, 512, 1024, 2048)


def pass_table(model: str, max_new: int, max_prefix: int, repeats: int = 2) -> list[tuple[int, int, int, float]]:
    """[(rows, padded new, padded prefix, seconds)] of layerwise passes (`dualjax.runtime.startup`'s
    timing), for the buckets up to `max_new` new and `max_prefix` cached tokens; 1, 2 and 4 rows
    while rows * new <= 1024. More rows scale in proportion (`PassTable`), as measured here from 4
    to 8 rows past the smallest shapes."""
    b = DEFAULT_BUCKETS
    news = [t for t in (b.min_new << k for k in range(16)) if t <= b.new(max_new)]
    prefixes = [0] + [s for s in (b.min_prefix << k for k in range(16)) if s <= b.prefix(max_prefix)]
    return [(rows, t, s, prefill_seconds(model, s, t, repeats=repeats, rows=rows))
            for t in news for s in prefixes for rows in (1, 2, 4) if rows == 1 or rows * t <= 1024]


def workload_extent(workload: str, prefill_chunk: int = 2048) -> tuple[int, int]:
    """(longest chunk of new tokens, longest prefix) a PE meets on `workload`'s preset."""
    spec = get_workload(workload)
    lengths = [turn_lengths(spec, a) for a in range(spec.agents)]
    new = max(int(a.max()) for a, _ in lengths)
    context = max(int(a.sum() + g.sum()) for a, g in lengths)
    return min(new, prefill_chunk), context


def decode_fit(model: str, slots: int, repeats: int = 5) -> tuple[float, float]:
    """(d0, d1): a decode step over `slots` slots of capacity C takes d0 + d1 * C seconds."""
    cfg = models.get_config(model)
    params = params_for(model)
    xs, ys = [], []
    for cap in CAPACITIES:
        if cap > cfg.max_seq_len:
            continue
        cache = models.DecodeCache.filled(cfg, slots, cap, cap // 2)
        tokens = np.zeros(slots, np.int32)
        times = []
        for attempt in range(repeats + 1):  # the first compiles
            cache = cache.truncate(cap // 2)
            t0 = time.perf_counter()
            logits, cache = cache.step(params, tokens)
            np.asarray(models.greedy(logits))
            if attempt:
                times.append(time.perf_counter() - t0)
        xs.append(cap)
        ys.append(float(np.median(times)))
    (d0, d1), _ = scipy.optimize.nnls(np.stack([np.ones(len(xs)), xs], axis=1), np.array(ys))
    return float(d0), float(d1)


def contention(model: str, slots: int, others: int = 3, repeats: int = 15) -> tuple[tuple[float, ...], ...]:
    """How much slower (a prefill pass, a decode step) runs while 1, 2, ... `others` other engines
    compute in other threads (what embedded hosts do to each other on this machine's cores). The
    others alternate kinds, the other kind first: beside a pass, a decode step, then a pass too..."""
    import threading

    cfg = models.get_config(model)
    params = params_for(model)

    def decoder():
        cache, tokens = models.DecodeCache.filled(cfg, slots, 2048, 1024), np.zeros(slots, np.int32)

        def step():
            nonlocal cache
            logits, cache = cache.truncate(1024).step(params, tokens)
            np.asarray(models.greedy(logits))
        step()
        return step

    def timed(fn, n):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t0) / n

    def while_running(background, fn, n):
        stop = threading.Event()
        workers = [threading.Thread(target=lambda b=b: [b() for _ in iter(stop.is_set, True)]) for b in background]
        for w in workers:
            w.start()
        try:
            return timed(fn, n)
        finally:
            stop.set()
            for w in workers:
                w.join()

    steps = [decoder() for _ in range(1 + (others + 1) // 2)]  # each thread its own cache
    prefill = lambda: prefill_seconds(model, 1024, 64, repeats=1)  # noqa: E731
    prefill()
    beside_pass = [steps[1 + k // 2] if k % 2 == 0 else prefill for k in range(others)]
    beside_step = [prefill if k % 2 == 0 else steps[1 + k // 2] for k in range(others)]
    alone = timed(prefill, repeats), timed(steps[0], 4 * repeats)
    return (tuple(while_running(beside_pass[:k], prefill, repeats) / alone[0] for k in range(1, others + 1)),
            tuple(while_running(beside_step[:k], steps[0], 4 * repeats) / alone[1] for k in range(1, others + 1)))


def relay_bytes_per_s(layer_bytes: int, messages: int = 64) -> float:
    """`LayerKV` messages of one layer's KV through the in-process transport, sent and received."""
    fabric = InProcFabric(2)
    a, b = fabric.transport(0), fabric.transport(1)
    kv = np.ones(layer_bytes // 4, np.float32)
    t0 = time.perf_counter()
    for i in range(messages):
        a.send(1, LayerKV(0, i, 0, kv, 0))
        b.recv()
    return messages * kv.nbytes / (time.perf_counter() - t0)


def host_overheads(model: str, workload: str, decode_slots: int, scratch: str,
                   runs: int = 3) -> tuple[float, float, int]:
    """(the hosts' pass seconds over the bare model's for the same shapes, seconds per decode step,
    decode capacity), medians over `runs` one-agent embedded runs of `workload` (so PE and DE never
    compute at once) after one that compiles. The bare passes are timed right after each run: this
    machine's speed drifts by ~10% over minutes, and the ratio must not. The hosts do more than the
    bare model: prefix assembly per layer, sends, per-slot bookkeeping."""
    from dualjax.runtime.decode_host import decode_capacity
    from dualjax.runtime.launch import run_embedded
    ratios, steps = [], []
    for attempt in range(runs + 1):
        cfg = RunConfig(ClusterSpec(1, 1), model=model, workload=workload, agents=1, turns=6,
                        policy="pe-only", decode_slots=decode_slots, out=os.path.join(scratch, f"run{attempt}"))
        shutil.rmtree(cfg.out, ignore_errors=True)
        hosts = {h["role"]: h for h in run_embedded(cfg, progress=False)["hosts"]}
        if attempt:
            pe, de = hosts["prefill"], hosts["decode"]
            tallies = [PassTally.from_json(t) for t in pe["pass_shapes"]]
            bare = sum(t.passes * prefill_seconds(model, t.shape.prefix, t.shape.new, repeats=2, rows=t.shape.rows)
                       for t in tallies)
            ratios.append(pe["pass_s"] / bare)
            steps.append(de["busy_s"] / de["decode_steps"])
    return float(np.median(ratios)), float(np.median(steps)), decode_capacity(cfg, models.get_config(model))


def calibrate(model: str = "small", workload: str = "agentic-e2e", store_dir: str = "runs/calibrate/store",
              decode_slots: int = 8, block_tokens: int = 64, path: str = DEFAULT_LOCAL) -> Hardware:
    """Measure, write the `local` profile to `path` and return it. `workload` bounds the pass
    shapes measured; longer ones are extrapolated (`PassTable`)."""
    cfg = RunConfig(ClusterSpec(1, 1), model=model, store=store_dir, block_tokens=block_tokens,
                    decode_slots=decode_slots)
    layout = run_layout(cfg)
    fit = attention_fit(model)
    table = pass_table(model, *workload_extent(workload, cfg.prefill_chunk))
    d0, d1 = decode_fit(model, decode_slots)
    snic = store_read_bytes_per_s(cfg.store_dir, layout)
    relay = relay_bytes_per_s(layout.block_bytes // layout.n_layers * 16)
    pass_slowdown, step_slowdown = contention(model, decode_slots)
    prefill_scale, step_s, capacity = host_overheads(model, workload, decode_slots,
                                                     os.path.join(os.path.dirname(store_dir), "hosts"))
    decode_scale = step_s / (d0 + d1 * capacity)
    hw = Hardware(
        "local", gpus_per_node=1, snic_bytes_per_s=snic, cnic_bytes_per_s=relay, kv_share=1.0,
        dram_bytes_per_s=math.inf, pe_buffer_bytes=cfg.pe_buffer_mb * 2**20, de_buffer_bytes=cfg.de_buffer_mb * 2**20,
        hbm_bytes=math.inf, hbm_bytes_per_s=math.inf, flops_per_s=math.inf, efficiency=1.0,
        decode_batch=decode_slots, padded=True, prefill_tokens_per_s=prefill_tokens_per_s(model),
        prefill_fit=(fit.a, fit.b, fit.c), pass_table=tuple(table),
        prefill_scale=prefill_scale, decode_fit=(d0 * decode_scale, d1 * decode_scale),
        model=model, contention=pass_slowdown, decode_contention=step_slowdown,
        notes=f"measured by `dualjax calibrate` on {time.strftime('%Y-%m-%d %H:%M')}: one engine per host; "
              f"storage = the store's read rate (a run's --snic-mbps caps it); relay = in-process LayerKV copies; "
              f"model timings scaled to the hosts' own (a one-agent {workload} run): passes x{prefill_scale:.2f}, "
              f"decode x{decode_scale:.2f}")
    save_hardware(hw, path)
    return hw


def main(args) -> int:
    """`dualjax calibrate`: measure, write the profile, print what it holds."""
    path = args.out or DEFAULT_LOCAL
    hw = calibrate(args.model, args.workload, decode_slots=args.decode_slots, path=path)
    a, b, c = hw.prefill_fit
    print(f"local profile ({args.model}) -> {path}\n"
          f"  prefill passes: {len(hw.pass_table)} padded shapes (rows x new x prefix), from "
          f"{min(r[3] for r in hw.pass_table) * 1e3:.0f} to {max(r[3] for r in hw.pass_table) * 1e3:.0f} ms; "
          f"the hosts take x{hw.prefill_scale:.2f}\n"
          f"  packing fit: {a:.3g} s x new x (cached + new/2) + {b:.3g} s x new + {c:.3g} s per row\n"
          f"  decode step: {hw.decode_fit[0] * 1e3:.2f} ms + {hw.decode_fit[1] * 1e6:.3f} us x capacity\n"
          f"  with 1, 2, 3 other engines computing: a pass x{', '.join(f'{c:.2f}' for c in hw.contention)}, "
          f"a decode step x{', '.join(f'{c:.2f}' for c in hw.decode_contention)}\n"
          f"  storage read {hw.snic_bytes_per_s / 1e9:.2f} GB/s   relay {hw.cnic_bytes_per_s / 1e9:.2f} GB/s")
    return 0
