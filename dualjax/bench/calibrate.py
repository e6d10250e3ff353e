"""Measuring this machine for the simulator's `local` hardware profile (`dualjax calibrate`).

`measure` returns the profile's fields (the keyword arguments of `dualjax.sim.profiles.Hardware`, the
keys of the profile's JSON); `dualjax calibrate` writes them where `--hardware local` finds them.

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

import logging
import math
import os
import shutil
import tempfile
import time

import numpy as np
import scipy.optimize

import models
from dualjax.bench import common
from dualjax.core.config import ClusterSpec, RunConfig
from dualjax.core.lengths import longest_context
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
from dualjax.runtime.warmup import prefill_shapes
from models.buckets import DEFAULT_BUCKETS

log = logging.getLogger("dualjax.bench.calibrate")
CAPACITIES = (256, 512, 1024, 2048)
QUICK_ROWS = (1, 2)  # --quick runs (3 agents) pack at most 3 rows; past 2 the table scales in proportion


def pass_table(model: str, shapes: list[tuple[int, int]], repeats: int = 2,
               rows: tuple[int, ...] = (1, 2, 4)) -> list[tuple[int, int, int, float]]:
    """[(rows, padded new, padded prefix, seconds)] of layerwise passes (`dualjax.runtime.startup`'s
    timing) for every padded (new, prefix) in `shapes`, at each of `rows` while rows * new <= 1024
    (one row always). More rows scale in proportion (`PassTable`), as measured here from 4 to 8 rows
    past the smallest shapes."""
    return [(r, t, s, prefill_seconds(model, s, t, repeats=repeats, rows=r))
            for t, s in shapes for r in rows if r == 1 or r * t <= 1024]


def table_shapes(model: str, workload: str, prefill_chunk: int, block_tokens: int, agents: int | None = None,
                 turns: int | None = None, quick: bool = False) -> list[tuple[int, int]]:
    """Padded (new, prefix) shapes the pass table measures: every bucket up to the longest chunk and
    prefix `workload` (or `agents` x `turns` of it) reaches, or with `quick` only the shapes its
    turns produce (`runtime.warmup.prefill_shapes`: what its runs compiled, so in the process that
    ran them they cost no compilation; a pass packing rows of different shapes is extrapolated)."""
    if quick:
        cfg = RunConfig(ClusterSpec(1, 1), model=model, workload=workload, agents=agents, turns=turns,
                        prefill_chunk=prefill_chunk)
        return prefill_shapes(cfg, models.resolve_model(model).config, block_tokens)
    max_new, max_prefix = workload_extent(workload, prefill_chunk, agents, turns)
    b = DEFAULT_BUCKETS
    news = [t for t in (b.min_new << k for k in range(16)) if t <= b.new(max_new)]
    prefixes = [0] + [s for s in (b.min_prefix << k for k in range(16)) if s <= b.prefix(max_prefix)]
    return [(t, s) for t in news for s in prefixes]


def workload_extent(workload: str, prefill_chunk: int = 2048, agents: int | None = None,
                    turns: int | None = None) -> tuple[int, int]:
    """(longest chunk of new tokens, longest prefix) a PE meets on `workload`'s preset (or on `agents`
    x `turns` of it)."""
    spec = get_workload(workload, agents=agents, turns=turns)
    lengths = [turn_lengths(spec, a) for a in range(spec.agents)]
    new = max(int(a.max()) for a, _ in lengths)
    return min(new, prefill_chunk), longest_context(lengths)


def decode_fit(model: str, slots: int, repeats: int = 5) -> tuple[float, float]:
    """(d0, d1): a decode step over `slots` slots of capacity C takes d0 + d1 * C seconds."""
    cfg = models.resolve_model(model).config
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


def contention(model: str, slots: int, others: int = 3, rounds: int = 5) -> tuple[tuple[float, ...], ...]:
    """How much slower (a prefill pass, a decode step) runs while 1, 2, ... `others` other engines
    compute in other threads (what embedded hosts do to each other on this machine's cores). The
    others alternate kinds, the other kind first: beside a pass, a decode step, then a pass too...
    Each factor is the median over `rounds` of a contended timing over the mean of the alone ones
    right before and after it: this shared machine's speed drifts several-fold within minutes, and
    timing every alone run first gave a decode step 0.76x *faster* beside a pass (2026-12-01 05:12)."""
    import threading

    cfg = models.resolve_model(model).config
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

    def factor(background, fn, n):
        alone, beside = [timed(fn, n)], []
        for _ in range(rounds):  # each contended timing between two alone ones
            beside.append(while_running(background, fn, n))
            alone.append(timed(fn, n))
        return float(np.median([2 * c / (a + b) for c, a, b in zip(beside, alone, alone[1:])]))

    return (tuple(factor(beside_pass[:k], prefill, 2) for k in range(1, others + 1)),
            tuple(factor(beside_step[:k], steps[0], 8) for k in range(1, others + 1)))


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
    from dualjax.runtime.cluster.runner import run_embedded
    from dualjax.runtime.decode_host import decode_capacity
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
    return float(np.median(ratios)), float(np.median(steps)), decode_capacity(cfg, models.resolve_model(model).config)


def _timed(what: str, fn, *args, **kwargs):
    """`fn(*args, **kwargs)`, logging its wall seconds (what calibration spends where, for the wall bounds)."""
    t = common.timed(fn, *args, **kwargs)
    log.info("calibrate: %s %.1f s", what, t.wall_s)
    return t.result


def measure(model: str = "small", workload: str = "agentic-e2e", store_dir: str | None = None,
            decode_slots: int = 8, block_tokens: int = 64, agents: int | None = None, turns: int | None = None,
            quick: bool = False, scratch: str | None = None) -> dict:
    """Measure, and return the `local` profile's fields. `model`: a preset or a checkpoint directory (its
    config is measured, on random weights where only timings matter). `workload` (or `agents` x `turns`
    of it) bounds the pass shapes measured; longer ones are extrapolated (`PassTable`). `quick`
    (CI: `sim validate` on `bench e2e --quick`) measures the passes of the workload's own shapes at 1
    and 2 rows (`table_shapes`), times each measurement fewer times (one timing per pass shape, 2 rounds
    of contention instead of 5, with at most 2 other engines, as its 1p2d has; one host-overhead run):
    noisier and narrower, the same quantities (the simulator extrapolates contention to more engines).
    The scratch store (`store_dir`) and the host-overhead runs go to a temporary directory under
    `scratch` (default: the working directory), removed at the end; a given `store_dir` is kept, and the
    runs go beside it."""
    if store_dir is not None:
        return _measure(model, workload, store_dir, decode_slots, block_tokens, agents, turns, quick)
    with tempfile.TemporaryDirectory(dir=scratch or os.getcwd(), prefix=".calibrate-") as tmp:
        return _measure(model, workload, os.path.join(tmp, "store"), decode_slots, block_tokens, agents, turns,
                        quick)


def _measure(model: str, workload: str, store_dir: str, decode_slots: int, block_tokens: int,
             agents: int | None, turns: int | None, quick: bool) -> dict:
    cfg = RunConfig(ClusterSpec(1, 1), model=model, store=store_dir, block_tokens=block_tokens,
                    decode_slots=decode_slots)
    layout = run_layout(cfg)
    shapes = table_shapes(model, workload, cfg.prefill_chunk, block_tokens, agents, turns, quick)  # checks workload
    fit = _timed("packing fit", attention_fit, model)
    table = _timed("pass table", pass_table, model, shapes, repeats=1 if quick else 2,
                   rows=QUICK_ROWS if quick else (1, 2, 4))
    d0, d1 = _timed("decode fit", decode_fit, model, decode_slots, repeats=3 if quick else 5)
    snic = store_read_bytes_per_s(cfg.store_dir, layout)
    relay = relay_bytes_per_s(layout.block_bytes // layout.n_layers * 16)
    pass_slowdown, step_slowdown = _timed("contention", contention, model, decode_slots, others=2 if quick else 3,
                                          rounds=2 if quick else 5)  # --quick's clusters: at most 3 engines
    prefill_scale, step_s, capacity = _timed("host overheads", host_overheads, model, workload, decode_slots,
                                             os.path.join(os.path.dirname(store_dir), "hosts"), runs=1 if quick else 3)
    decode_scale = step_s / (d0 + d1 * capacity)
    return dict(
        name="local", gpus_per_node=1, snic_bytes_per_s=snic, cnic_bytes_per_s=relay, kv_share=1.0,
        dram_bytes_per_s=math.inf, pe_buffer_bytes=cfg.pe_buffer_mb * 2**20, de_buffer_bytes=cfg.de_buffer_mb * 2**20,
        hbm_bytes=math.inf, hbm_bytes_per_s=math.inf, flops_per_s=math.inf, efficiency=1.0,
        decode_batch=decode_slots, padded=True, prefill_tokens_per_s=prefill_tokens_per_s(model),
        prefill_fit=(fit.a, fit.b, fit.c), pass_table=tuple(table),
        prefill_scale=prefill_scale, decode_fit=(d0 * decode_scale, d1 * decode_scale),
        model=model, contention=pass_slowdown, decode_contention=step_slowdown,
        notes=f"measured by `dualjax calibrate`{' (quick)' if quick else ''} on {time.strftime('%Y-%m-%d %H:%M')}: "
              f"one engine per host; "
              f"storage = the store's read rate (a run's --snic-mbps caps it); relay = in-process LayerKV copies; "
              f"model timings scaled to the hosts' own (a one-agent {workload} run): passes x{prefill_scale:.2f}, "
              f"decode x{decode_scale:.2f}")
