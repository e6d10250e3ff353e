"""Model throughput on this machine: prefill tokens/s over a (cached, new) grid, decode tokens/s
at several batch sizes, and the fraction of this machine's matmul FLOP/s that prefill reaches
(the matmul roofline, in the model's dtype, is measured in the same run). Decode also reports
the bytes per second a step reads (weights + KV), the measure of a memory-bound step. `attention`
says which attention implementation prefill and decode ran ("cudnn" fused or "xla").

    dualjax bench model --json FILE [--quick] [--model small]

On a GPU, any preset fits (random weights, initialised on the device): `--model qwen2.5-7b`; `--model DIR`
runs a checkpoint directory (Hugging Face or Orbax) with its own weights.
"""

from __future__ import annotations

import argparse
import logging

import jax
import jax.numpy as jnp
import numpy as np

import models
from dualjax.bench.common import bench_args, emit, machine, matmul_flops_per_s, show_progress, timeit
from models.costs import decode_bytes_per_step

log = logging.getLogger("dualjax.bench.model")


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
    cache = models.DecodeCache.filled(cfg, batch, context + steps + 1, context)  # KV values do not change the cost
    tokens = jnp.zeros((batch,), jnp.int32)

    def run():
        nonlocal cache
        cache = cache.truncate(context)
        for _ in range(steps):
            logits, cache = cache.step(params, tokens)
            out = np.asarray(models.greedy(logits))
        return out

    seconds = timeit(run, repeats=3, warmup=1)  # the warm-up compiles
    step_s = seconds / steps
    read = models.param_bytes(cfg) + batch * decode_bytes_per_step(cfg, context)
    return {"batch": batch, "context": context, "tokens_per_s": batch / step_s, "step_ms": 1e3 * step_s,
            "bytes_read_per_s": read / step_s}


def attention_report(cfg) -> dict:
    """The attention implementations prefill and decode run for `cfg` on this backend (decode over the
    cache layout `DecodeCache.create` picks)."""
    return cfg.family.attention(cfg)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="small", help="a model preset or checkpoint directory (default small)")


def main(argv=None, args=None) -> dict:
    args = bench_args("model", __doc__, add_arguments, argv, args)
    show_progress()
    source = models.resolve_model(args.model, seed=0)
    cfg, params = source.config, source.load_params()
    n = 1024 if jax.default_backend() == "cpu" else 8192  # big enough to saturate an accelerator
    peak = matmul_flops_per_s(n, cfg.jnp_dtype)
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
        "benchmark": "model", "model": cfg.name, "weights": source.describe, "machine": machine(),
        "param_bytes": models.param_bytes(cfg),
        "kv_bytes_per_token": models.kv_bytes_per_token(cfg),
        "attention": attention_report(cfg),
        "matmul_gflops": peak / 1e9,
        "prefill": prefill, "decode": decode,
        "prefill_fraction_of_matmul_peak": best / peak,
        "prefill_fraction_by_cell": {f"{p['cached']}+{p['new']}": p["flops_per_s"] / peak for p in prefill},
        "notes": f"{cfg.dtype} on {jax.default_backend()}; matmul peak = a jitted "
                 f"{n}^3 {cfg.dtype} matmul measured in this run; prefill FLOPs from "
                 "models.costs (linear + causal attention; MoE: activated experts only, while the JAX MoE "
                 f"computes every expert densely); weights {source.describe}.",
    }
    emit(result, args.json)
    return result


if __name__ == "__main__":
    main()
