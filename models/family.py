"""`Family`: the one small object a model family exports, and all that the shared code of `models` asks
of it. A config reaches its family as `cfg.family` (`models.config.FamilyConfig`).

Everything else is shared: parameters are derived from `declare` (`models.params`), the fused forward,
`prefill`, the layerwise driver and the decode step loop over `forward_layer` / `decode_layer`
(`models.inference`, `models.layerwise`, `models.cache`), and the cache holds the config's per-token
records (`kv_record_shape`, `kv_dtype`) in the family's `CacheLayout`.

A new family is a new package `models/<name>/`: a config (a frozen dataclass mixing in `FamilyConfig`,
with `FAMILY = "models.<name>"`) and its presets, a `costs` module (`cost_terms`, JAX-free) and a
`family` module (`FAMILY = Family(...)`, naming its tiny preset for the tests); its config type and
presets are then registered in `models.presets`, and the tests parametrized over `models.families()`
run it.
"""

from __future__ import annotations

import dataclasses
from typing import Callable


@dataclasses.dataclass(frozen=True, repr=False)
class Family:
    name: str  # the config type's `family_name()` (its package's name)
    # the family's smallest preset, for tests: every test parametrized over `models.families()` runs it
    tiny_preset: str
    # cfg -> the params' declaration tree (`models.params.Decl` leaves)
    declare: Callable
    # (x [B, T, D], layer params, positions [B, T], cfg, prefix records [B, S, *record], prefix_len [B])
    #   -> (x, the new tokens' records [B, T, *record])
    forward_layer: Callable
    # (x [B, 1, D], layer params, layer, cache, lengths [B], cfg, layout) -> (x, cache with the new records)
    decode_layer: Callable
    # cfg -> the `models.cache.CacheLayout` of a new decode cache
    cache_layout: Callable
    # logical axes of one layer's records [B, S, *record] (`models.sharding`)
    kv_axes: tuple
    # (params, cfg, tokens [B, T]) -> logits [B, T, V]: a plain forward written apart from the model code
    reference_logits: Callable
    # cfg -> {"prefill": ..., "decode": ...}: the attention implementations that run on this backend
    attention: Callable
    # Hugging Face: the config.json `model_type` or `architectures` values this family reads;
    # (config.json dict, name) -> config (no tensors); (directory, config.json dict, dtype or None) -> (config, params);
    # (params, cfg) -> (config.json dict, {name: float32 array}) in the family's published layout, what load_hf reads
    hf_names: tuple[str, ...]
    hf_config: Callable
    load_hf: Callable
    export_hf: Callable

    def __repr__(self) -> str:
        return f"Family({self.name!r})"
