"""Functional JAX decoder models: the Llama / Qwen2 family and the DeepSeek-V3.2 family (MLA, DSA, MoE).
Knows nothing of storage or MPI. The generic entry points (`prefill`, `Layerwise`, `DecodeCache`,
`init_params`, `load_hf`, ...) dispatch on the config's type (`models.families`).

Configs, shape buckets and cost formulas (`models.config`, `models.buckets`, `models.costs`) import
without JAX, so the simulator can use them; everything else loads JAX on first use.
"""

from __future__ import annotations

import importlib
import sys
import types

from models.buckets import DEFAULT_BUCKETS, Buckets
from models.config import PRESETS, ModelConfig, RopeScaling, UnknownPreset
from models.config import get_config as dense_config
from models.costs import decode_flops, kv_bytes_per_token, prefill_flops
from models.deepseek_config import DEEPSEEK_PRESETS, DeepSeekConfig

_LAZY = {
    "CheckpointError": "checkpoint", "load_hf": "families", "restore_checkpoint": "source",
    "save_checkpoint": "source", "DecodeCache": "families", "generate": "families",
    "decode_step": "model", "forward": "model", "forward_layer": "model", "greedy": "model",
    "reference_logits": "model", "abstract_params": "families", "check_params": "families",
    "init_params": "families", "param_bytes": "families", "param_count": "families",
    "InputError": "prefill", "Layerwise": "families", "compile_counts": "prefill", "prefill": "families",
    "make_mesh": "sharding", "param_shardings": "families", "shard_params": "families",
    "ModelSource": "source", "resolve_model": "source", "preset_names": "source", "read_config": "checkpoint",
}

__all__ = ["DEFAULT_BUCKETS", "Buckets", "PRESETS", "DEEPSEEK_PRESETS", "ModelConfig", "DeepSeekConfig",
           "RopeScaling", "get_config", "decode_flops", "kv_bytes_per_token", "prefill_flops", *_LAZY]


def get_config(name: str, **overrides):
    """The preset called `name` of either family, with optional field overrides. Raises UnknownPreset
    (a KeyError) naming every preset for an unknown name."""
    if name in DEEPSEEK_PRESETS:
        return DEEPSEEK_PRESETS[name].replace(**overrides) if overrides else DEEPSEEK_PRESETS[name]
    if name not in PRESETS:
        raise UnknownPreset(f"unknown model preset {name!r}; presets: {', '.join([*PRESETS, *DEEPSEEK_PRESETS])}")
    return dense_config(name, **overrides)


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f"models.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'models' has no attribute {name!r}")


class _Package(types.ModuleType):
    """`models.prefill` names both a submodule and its function: importing the submodule sets the
    package's attribute to the module, which would hide the function; keep the function."""

    def __setattr__(self, name, value):
        if not (name in _LAZY and isinstance(value, types.ModuleType)):
            super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
