"""Functional JAX decoder models (Llama / Qwen2 family). Knows nothing of storage or MPI.

Configs, shape buckets and cost formulas (`models.config`, `models.buckets`, `models.costs`) import
without JAX, so the simulator can use them; everything else loads JAX on first use.
"""

from __future__ import annotations

import importlib
import sys
import types

from models.buckets import DEFAULT_BUCKETS, Buckets
from models.config import PRESETS, ModelConfig, RopeScaling, get_config
from models.costs import decode_flops, kv_bytes_per_token, prefill_flops

_LAZY = {
    "CheckpointError": "checkpoint", "load_hf": "checkpoint", "restore_checkpoint": "source",
    "save_checkpoint": "source", "DecodeCache": "decode", "generate": "decode",
    "decode_step": "model", "forward": "model", "forward_layer": "model", "greedy": "model",
    "reference_logits": "model", "abstract_params": "params", "check_params": "params",
    "init_params": "params", "param_bytes": "params", "param_count": "params",
    "InputError": "prefill", "Layerwise": "prefill", "compile_counts": "prefill", "prefill": "prefill",
    "make_mesh": "sharding", "param_shardings": "sharding", "shard_params": "sharding",
    "ModelSource": "source", "resolve_model": "source", "preset_names": "source", "read_config": "checkpoint",
}

__all__ = ["DEFAULT_BUCKETS", "Buckets", "PRESETS", "ModelConfig", "RopeScaling", "get_config", "decode_flops",
           "kv_bytes_per_token", "prefill_flops", *_LAZY]


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
