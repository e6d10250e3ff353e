"""Model throughput on this machine: prefill tokens/s over a (cached, new) grid, decode tokens/s
at several batch sizes, and the fraction of this machine's matmul FLOP/s that prefill reaches
(the matmul roofline is measured in the same run).

    python -m benchmarks.model --json FILE [--quick] [--model small]
"""

from __future__ import annotations

import logging

import jax.numpy as jnp
import numpy as np

import models
from benchmarks.common import emit, machine, matmul_flops_per_s, parser, timeit

log = logging.getLogger("benchmarks.model")


def bench_prefill(params, cfg, cached: int, new: int) -> dict:
    rng = np.random.default_rng(0)
    prefix = None
    for start in range(0, cached, 1024):  # in chunks: one long prefill holds an S x S score matrix
        _, kv = models.prefill(params, cfg, rng.integers(0, cfg.vocab, (1, min(1024, cached - start))), prefix)
        prefix = kv if prefix is None else jnp.concatenate([prefix, kv], axis=2)
    tokens = rng.integers(0, cfg.vocab, (1, new))
    seconds = timeit(lambda: models.prefill(params, cfg, tokens, prefix), repeats=3)
    flops = models.prefill_flops(cfg, new, cached)
    return {"cached": cached, "new": new, "seconds": seconds, "tokens_per_s": new / seconds,
            "flops_per_s": flops / seconds}


def bench_decode(params, cfg, batch: int, context: int, steps: int) -> dict:
    cache = models.DecodeCache(cfg, slots=batch, capacity=context + steps + 1)
    cache.lengths[:] = context  # KV content does not change the cost; positions do
    tokens = jnp.zeros((batch,), jnp.int32)
    cache.step(params, tokens)  # compile
    cache.lengths[:] = context

    def run():
        cache.lengths[:] = context
        for _ in range(steps):
            out = cache.step(params, tokens)
        return out

    seconds = timeit(run, repeats=3, warmup=0)
    return {"batch": batch, "context": context, "tokens_per_s": batch * steps / seconds,
            "step_ms": 1e3 * seconds / steps}


def main(argv=None) -> dict:
    args = parser(__doc__).parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", force=True)
    cfg = models.get_config("small")
    params = models.init_params(cfg, seed=0)
    peak = matmul_flops_per_s()
    grid = [(0, 256), (1024, 256), (4096, 256)] if args.quick else \
        [(0, 256), (0, 1024), (1024, 256), (4096, 256), (4096, 1024), (16384, 256)]
    prefill = []
    for cached, new in grid:
        prefill.append(bench_prefill(params, cfg, cached, new))
        log.info("prefill cached=%d new=%d: %.0f tok/s", cached, new, prefill[-1]["tokens_per_s"])
    decode = []
    for batch in (1, 8, 32):
        decode.append(bench_decode(params, cfg, batch, context=1024, steps=4 if args.quick else 16))
        log.info("decode batch=%d: %.0f tok/s", batch, decode[-1]["tokens_per_s"])
    best = max(p["flops_per_s"] for p in prefill)
    result = {
        "benchmark": "model", "model": cfg.name, "machine": machine(), "param_bytes": models.param_bytes(cfg),
        "kv_bytes_per_token": models.kv_bytes_per_token(cfg),
        "matmul_gflops": peak / 1e9,
        "prefill": prefill, "decode": decode,
        "prefill_fraction_of_matmul_peak": best / peak,
        "prefill_fraction_by_cell": {f"{p['cached']}+{p['new']}": p["flops_per_s"] / peak for p in prefill},
        "notes": "float32 on CPU; matmul peak = jitted 1024^3 float32 matmul measured in this run; "
                 "prefill FLOPs from models.costs (linear + causal attention).",
    }
    emit(result, args.json)
    return result


if __name__ == "__main__":
    main()
