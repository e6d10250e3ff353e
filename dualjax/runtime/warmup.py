"""Warm start: a host compiles the programs its workload will need before the run's clock starts.

A prefill pass compiles one program per (rows, padded new tokens, padded prefix) shape
(`models.buckets`). `prefill_shapes` lists the (new, prefix) shapes a workload's turns produce when
each turn hits every full block of the context before it (the common case) and is cut into
`prefill_chunk` pieces, as the prefill host computes them; `warm_shapes` adds the passes that batch
2 to `MAX_WARM_ROWS` rows (a pass's shape is its longest new and its longest prefix, which may come
from different rows, so every pairing); `warm_prefill` compiles the layerwise pass of each
(`Layerwise.compile_rest`), so the first real request finds them compiled. A pass of more rows
compiles when it first occurs. Rank 0 starts the clock once every host said it is warm (`Warm`),
and `report.json` states the start-up time apart (`startup`), under mpiexec as embedded.
"""

from __future__ import annotations

import time

import jax
import numpy as np

import models
from dualjax.core.workload import load_workload
from dualjax.runtime.messages import EngineState, Warm
from dualjax.runtime.transport import HostFailure
from models.buckets import DEFAULT_BUCKETS


def _agents(cfg, model_cfg) -> list:
    return load_workload(cfg.workload, model_cfg.vocab, cfg.workload_seed, cfg.agents, cfg.turns, cfg.aps)


def prefill_shapes(cfg, model_cfg, block_tokens: int, agents: list | None = None) -> list[tuple[int, int]]:
    """Padded (new, prefix) shapes, one row per pass, that `cfg`'s workload (`agents`, loaded when
    None) produces (sorted)."""
    agents = _agents(cfg, model_cfg) if agents is None else agents
    shapes, B = set(), DEFAULT_BUCKETS
    for agent in agents:
        ctx = 0
        for turn in agent.turns:
            prompt = len(turn.prompt) if turn.prompt is not None else ctx + len(turn.append)
            hit = min(ctx, prompt - 1) // block_tokens * block_tokens if cfg.use_store else 0
            for start in range(hit, prompt, cfg.prefill_chunk):
                new = min(cfg.prefill_chunk, prompt - start)
                if B.prefix(start) + B.new(new) <= model_cfg.max_seq_len:
                    shapes.add((B.new(new), B.prefix(start)))
            ctx = prompt + turn.gen_len
    return sorted(shapes)


MAX_WARM_ROWS = 4  # rows of the largest pass compiled before the clock (each row count is another program)


def warm_shapes(cfg, model_cfg, block_tokens: int) -> list[tuple[int, int, int]]:
    """(rows, padded new, padded prefix) of the passes `cfg`'s workload can compute, up to
    `MAX_WARM_ROWS` rows and no more rows than it has agents (sorted)."""
    agents = _agents(cfg, model_cfg)
    single = prefill_shapes(cfg, model_cfg, block_tokens, agents)
    news, prefixes = {n for n, _ in single}, {c for _, c in single}
    multi = {(n, c) for n in news for c in prefixes if n + c <= model_cfg.max_seq_len}
    return sorted([(1, n, c) for n, c in single] +
                  [(rows, n, c) for rows in range(2, min(MAX_WARM_ROWS, len(agents)) + 1) for n, c in multi])


def prompt_lengths(cfg, model_cfg) -> list[int]:
    """Distinct prompt lengths of `cfg`'s workload (what a decode host inserts into its cache)."""
    agents = _agents(cfg, model_cfg)
    lengths = set()
    for agent in agents:
        ctx = 0
        for turn in agent.turns:
            prompt = len(turn.prompt) if turn.prompt is not None else ctx + len(turn.append)
            lengths.add(prompt)
            ctx = prompt + turn.gen_len
    return sorted(lengths)


def warm_decode(cache, params, lengths: list[int], block_tokens: int):
    """Compile what a decode host runs: a cache's inserts (one per padded prompt length), its step
    with greedy sampling, and the read of one block's KV for write-back; returns the cache, every
    slot free again (the warm-up's entries lie past length 0, never attended)."""
    cfg = cache.cfg
    padded = sorted({min(cache.capacity - 1, DEFAULT_BUCKETS.prefix(n)) for n in lengths if 0 < n < cache.capacity})
    for n in padded:
        cache = cache.insert(0, np.zeros((cfg.n_layers, n, *cfg.kv_record_shape), cfg.kv_dtype)).evict(0)
    logits, cache = cache.step(params, np.zeros(cache.slots, np.int32))
    np.asarray(models.greedy(logits))
    np.asarray(cache.row(0, 0, min(block_tokens, cache.capacity)))
    return cache


_WARMED: set = set()  # (model config, weights' placement, rows, new, prefix) compiled in this process


def warm_prefill(params, model_cfg, shapes: list[tuple[int, int, int]]) -> float:
    """Compile the layerwise pass of each (rows, new, prefix) shape not yet warmed in this process
    (programs are cached per process): its embedding runs, the rest compiles without running
    (`Layerwise.compile_rest`: a 4-row pass over 2,048 tokens costs seconds to run). Returns the
    seconds spent."""
    t0 = time.perf_counter()
    placement = getattr(jax.tree.leaves(params)[0], "sharding", None)  # another mesh compiles anew
    for rows, new, prefix in shapes:
        if (model_cfg, placement, rows, new, prefix) in _WARMED:
            continue
        models.Layerwise(params, model_cfg, np.zeros((rows, new), np.int32), prefix_len=[prefix] * rows).compile_rest()
        _WARMED.add((model_cfg, placement, rows, new, prefix))
    return time.perf_counter() - t0


def wait_warm(transport, hosts: int, timeout_s: float = 900.0) -> dict[int, Warm]:
    """Rank 0: wait until every host sent `Warm` (read-queue reports meanwhile are dropped: each
    host reports again when its queue changes). Raises HostFailure after `timeout_s`."""
    warm: dict[int, Warm] = {}
    deadline = time.monotonic() + timeout_s
    while len(warm) < hosts:
        got = transport.recv(timeout=max(0.0, deadline - time.monotonic()))
        if got is None:
            raise HostFailure(f"hosts {sorted(set(range(1, hosts + 1)) - set(warm))} not warm after {timeout_s:.0f} s")
        if isinstance(got[1], Warm):
            warm[got[1].rank] = got[1]
        elif not isinstance(got[1], EngineState):
            raise HostFailure(f"rank 0 got {type(got[1]).__name__} from rank {got[0]} before every host was warm")
    return warm


def startup_report(warm: dict[int, Warm], rank0_s: float) -> dict:
    """report.json's `startup`: seconds before the run's clock started, per host and in all."""
    return {"rank0_s": rank0_s, "hosts_s": {str(r): w.startup_s for r, w in sorted(warm.items())},
            "compile_s": {str(r): w.compile_s for r, w in sorted(warm.items())},
            "max_s": max([rank0_s, *(w.startup_s for w in warm.values())]),
            "note": "before the clock: every host compiled its workload's prefill shapes and finished its profile"}
