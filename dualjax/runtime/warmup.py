"""Warm start: a host compiles the programs its workload will need before the run's clock starts.

A prefill pass compiles one program per (rows, padded new tokens, padded prefix) shape
(`models.buckets`). `warm_shapes` lists every shape a run can compute: 1 row up to one per agent
(an agent has one request in flight), each pairing of a new bucket with a prefix bucket (a pass's
shape is its longest new and its longest prefix, which may come from different rows), the buckets
of the pieces each turn is cut into when it hits every full block before it and `prefill_chunk`
cuts it (`prefill_shapes`), or every bucket up to the longest where a pass can cut a request at
any length (the compute quota can bind, or the policy may recompute part of a hit). It is bounded
(`MAX_WARM_ROWS`, `MAX_WARM_PROGRAMS`): a pass past the bounds compiles when it first occurs.
`warm_prefill` compiles the layerwise pass of each (`Layerwise.compile_rest`), so the first real
request finds them compiled. Rank 0 starts the clock once every host said it is warm (`Warm`), and
`report.json` states the start-up time apart (`startup`), under mpiexec as embedded.
"""

from __future__ import annotations

import time

import jax
import numpy as np

import models
from dualjax.core.lengths import hit_tokens
from dualjax.core.workload import load_workload
from dualjax.runtime.messages import EngineState, Warm
from dualjax.runtime.transport import HostFailure
from models.buckets import DEFAULT_BUCKETS


def _agents(cfg, model_cfg) -> list:
    """The run's agents, loaded as rank 0 loads them (`runner.drive`): the same turns, the same cuts."""
    return load_workload(cfg.workload, model_cfg.vocab, cfg.workload_seed, cfg.agents, cfg.turns, cfg.aps,
                         cfg.think_time, model_cfg.max_seq_len)


def _pieces(cfg, block_tokens: int, agents: list) -> tuple[set[tuple[int, int]], int]:
    """((start, new) of every piece a turn is cut into when it hits every full block of the context
    before it and is cut into `prefill_chunk` pieces, as the prefill host computes them; the longest
    prompt)."""
    pieces, longest = set(), 0
    for agent in agents:
        ctx = 0
        for turn in agent.turns:
            prompt = len(turn.prompt) if turn.prompt is not None else ctx + len(turn.append)
            hit = hit_tokens(ctx, prompt, block_tokens, cfg.use_store)
            cuts = range(hit, prompt, cfg.prefill_chunk)
            pieces.update((start, min(cfg.prefill_chunk, prompt - start)) for start in cuts)
            ctx, longest = prompt + turn.gen_len, max(longest, prompt)
    return pieces, longest


def prefill_shapes(cfg, model_cfg, block_tokens: int, agents: list | None = None) -> list[tuple[int, int]]:
    """Padded (new, prefix) shapes, one row per pass, that `cfg`'s workload (`agents`, loaded when
    None) produces when every turn hits every full block before it and only `prefill_chunk` cuts it
    (sorted)."""
    agents = _agents(cfg, model_cfg) if agents is None else agents
    B = DEFAULT_BUCKETS
    return sorted({(B.new(n), B.prefix(s)) for s, n in _pieces(cfg, block_tokens, agents)[0]
                   if B.prefix(s) + B.new(n) <= model_cfg.max_seq_len})


MAX_WARM_ROWS = 64  # rows of the largest pass compiled before the clock (each row count is another program)
MAX_WARM_PROGRAMS = 512  # pass programs compiled before the clock at most, fewest rows first
LOADS_EVERY_HIT = ("basic", "pe-only", "de-only", "round-robin", "random", "dualpath", "dualpath-split")


def _cut_anywhere(cfg, model_cfg, agents: list, pieces: set, fit) -> int:
    """The most new tokens of a piece when a pass can cut a request at any length, not only every
    `prefill_chunk` tokens, else 0: when the policy may load fewer than every hit block (a plan's
    recomputed tail: a piece then starts at any block and runs up to the chunk cap) or the compute
    quota can bind (`fit`'s attention over the most rows, the longest prefix and the longest piece
    exceeds it: `batching.pack` then chunks the request that overflows at any length, up to the
    longest piece)."""
    longest_new = max(n for _, n in pieces)
    if cfg.policy not in LOADS_EVERY_HIT:  # a policy of the user's (a reference or an object's name) may recompute
        return cfg.prefill_chunk
    if cfg.scheduler == "naive":  # no quota: every ready request, each up to the chunk cap
        return 0
    longest_prefix = max(s for s, _ in pieces)
    quota = cfg.compute_quota_ms / 1e3 * model_cfg.n_layers  # `pack`'s, over every layer
    return longest_new if len(agents) * fit.attention(longest_prefix, longest_new) > quota else 0


def _powers(lo: int, hi: int) -> list[int]:
    """The buckets from `lo` up to `hi` (both buckets, powers of two)."""
    return [1 << k for k in range(lo.bit_length() - 1, hi.bit_length())]


def warm_shapes(cfg, model_cfg, block_tokens: int, fit=None) -> list[tuple[int, int, int]]:
    """(rows, padded new, padded prefix) of every pass `cfg`'s workload can compute, fewest rows
    first, at most `MAX_WARM_PROGRAMS`. A pass holds at most one request per agent (an agent's next
    turn waits for its last token): 1 to `agents` rows (at most `MAX_WARM_ROWS`). Its shape is its
    longest new and its longest prefix, which may come from different rows: every pairing of a new
    bucket with a prefix bucket. The buckets: those of the `prefill_chunk` pieces
    (`prefill_shapes`), or, where a pass can cut a request anywhere (`_cut_anywhere`; `fit`: the
    PE's packing fit, measured when None), every bucket up to the longest piece and the longest
    prompt."""
    agents, B = _agents(cfg, model_cfg), DEFAULT_BUCKETS
    pieces, longest = _pieces(cfg, block_tokens, agents)
    if not pieces:
        return []
    if cfg.scheduler == "full" and fit is None:
        from dualjax.runtime.startup import attention_fit  # the fit the PE packs with (cached per process)
        fit = attention_fit(cfg.model)
    if most := _cut_anywhere(cfg, model_cfg, agents, pieces, fit):
        news = _powers(B.min_new, B.new(min(most, longest)))
        prefixes = [0] + (_powers(B.min_prefix, B.prefix(longest - 1)) if longest > 1 else [])
        single = [(n, c) for n in news for c in prefixes]
    else:
        single = [(B.new(n), B.prefix(s)) for s, n in pieces]
        news, prefixes = {n for n, _ in single}, {c for _, c in single}
    fits = lambda n, c: n + c <= model_cfg.max_seq_len  # noqa: E731
    single = sorted({(n, c) for n, c in single if fits(n, c)})
    pairs = sorted((n, c) for n in news for c in prefixes if fits(n, c))
    shapes = [(1, n, c) for n, c in single] + [(rows, n, c) for rows in range(2, min(len(agents), MAX_WARM_ROWS) + 1)
                                                 for n, c in pairs]
    return shapes[:MAX_WARM_PROGRAMS]


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
