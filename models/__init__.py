"""Functional JAX decoder models, one family per subpackage: `models.dense` (Llama / Qwen2, GQA) and
`models.deepseek` (DeepSeek-V3.2: MLA, DSA, MoE). Knows nothing of storage or MPI.

Every function here takes a config of any family and reaches the family through `cfg.family`
(`models.family.Family`); the mechanisms themselves (parameters from declarations, prefill over a
cached prefix, the layerwise driver, the decode cache, generate, checkpoints) are written once.

Configs, presets, shape buckets and cost formulas import without JAX, so the simulator can use them;
everything else loads JAX on first use.
"""

from __future__ import annotations

import importlib

from models.buckets import DEFAULT_BUCKETS, Buckets
from models.config import ModelConfigError, UnknownPreset
from models.costs import decode_flops, kv_bytes_per_token, prefill_flops
from models.deepseek.config import DeepSeekConfig
from models.dense.config import ModelConfig, RopeScaling
from models.presets import PRESETS, families, get_config, preset_names

_LAZY = {  # public name -> the module that defines it (loaded on first use: these load JAX)
    "forward": "inference", "forward_layer": "inference", "prefill": "inference", "generate": "inference",
    "greedy": "inference", "reference_logits": "inference",
    "Layerwise": "layerwise", "compile_counts": "layerwise",
    "DecodeCache": "cache", "CacheLayout": "cache", "decode_step": "cache",
    "InputError": "checks",
    "init_params": "params", "abstract_params": "params", "check_params": "params", "param_count": "params",
    "param_bytes": "params", "param_shardings": "params", "shard_params": "params",
    "make_mesh": "sharding",
    "CheckpointError": "checkpoint", "save_checkpoint": "checkpoint", "restore_checkpoint": "checkpoint",
    "read_config": "checkpoint", "load_hf": "hf", "save_hf": "hf",
    "ModelSource": "source", "resolve_model": "source",
}

__all__ = ["DEFAULT_BUCKETS", "Buckets", "PRESETS", "ModelConfig", "DeepSeekConfig", "RopeScaling",
           "ModelConfigError", "UnknownPreset", "families", "get_config", "preset_names", "decode_flops",
           "kv_bytes_per_token", "prefill_flops", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(f"models.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'models' has no attribute {name!r}")
