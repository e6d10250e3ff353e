"""Profiles measured on this machine at start-up: a PE's prefill tokens/s and a storage NIC's
bytes/s (its cap, or the store's measured read rate when uncapped) behind the scheduler's
thresholds, and the prefill-time fit behind the PE's intra-engine batching (its attention term
under the compute quota)."""

from __future__ import annotations

import functools
import time

import numpy as np

import kvstore
import models
from dualjax.core.batching import AttentionFit
from dualjax.core.config import RunConfig
from dualjax.core.scheduler import Thresholds
from dualjax.runtime.store import run_layout, run_model, scratch


def prefill_seconds(model: str, cached: int, new: int, repeats: int = 3, rows: int = 1) -> float:
    """Median seconds of a layerwise prefill of `rows` rows of `new` tokens over `cached` ones
    (compiled first)."""
    cfg = models.resolve_model(model).config
    params = params_for(model)
    tokens = np.random.default_rng(0).integers(0, cfg.vocab, (rows, new))
    prefix = np.zeros((cfg.n_layers, rows, cached, *cfg.kv_record_shape), cfg.kv_dtype)

    def run():
        lw = models.Layerwise(params, cfg, tokens, prefix_len=[cached] * rows)
        for layer in range(cfg.n_layers):
            lw.layer(layer, prefix[layer])
        return np.asarray(lw.logits())

    run()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def per_architecture(fn):
    """Cache `fn(model, *args)` by `model`'s config (whose equality leaves out its name): a profile
    times random weights of the config, so a checkpoint of a preset's architecture, or a second
    checkpoint of one architecture, reuses what this process measured for the first, as a
    `functools.cache` on the name did not."""
    cache = {}

    @functools.wraps(fn)
    def cached(model: str, *args):
        key = (models.resolve_model(model).config, args)
        if key not in cache:
            cache[key] = fn(model, *args)
        return cache[key]
    return cached


@per_architecture
def params_for(model: str):
    """Random weights of `model`'s shape (a preset or a checkpoint's config): the timings do not depend
    on the values, so a profile never loads a checkpoint's tensors."""
    return models.init_params(models.resolve_model(model).config, 0)


@per_architecture
def prefill_tokens_per_s(model: str, new: int = 256, cached: int = 1024) -> float:
    """New tokens per second of a layerwise prefill of `new` tokens over `cached` ones."""
    return new / prefill_seconds(model, cached, new)


@per_architecture
def attention_fit(model: str) -> AttentionFit:
    """Prefill time as a function of (cached, new), fitted on a small grid measured here: the whole
    pass predicts the PE's pass time, its attention term is what the compute quota bounds."""
    grid = [(0, 256), (0, 1024), (1024, 256), (2048, 512), (2048, 1024)]
    return AttentionFit.fit([(c, n, prefill_seconds(model, c, n)) for c, n in grid])


@functools.cache
def store_read_bytes_per_s(store: str, layout: kvstore.BlockLayout, blocks: int = 32) -> float:
    """Read rate of Full Blocks on the storage of the run's store `store` (`--store`): from a scratch
    store beside a store directory, or the store itself for a kvstore (`dualjax.runtime.store.scratch`)."""
    with scratch(store, layout, blocks) as (s, ids):
        s.put(ids, np.ones((blocks, *layout.full_shape), layout.np_dtype))
        s.get_prefix([b.hash for b in ids])
        t0 = time.perf_counter()
        s.get_prefix([b.hash for b in ids])
        return blocks * layout.block_bytes / (time.perf_counter() - t0)


def thresholds(cfg: RunConfig, prefill_rate: float) -> Thresholds:
    """The scheduler's thresholds from the PEs' prefill rate (`prefill_tokens_per_s`, measured on a PE:
    rank 0 may run on another kind of node) and a storage NIC's rate."""
    snic = cfg.snic_mbps * 1e6 if cfg.snic_mbps else store_read_bytes_per_s(cfg.store_dir, run_layout(cfg))
    return Thresholds.from_rates(snic, models.kv_bytes_per_token(run_model(cfg).config), prefill_rate)
