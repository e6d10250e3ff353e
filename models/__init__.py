"""Functional JAX decoder models (Llama / Qwen2 family). Knows nothing of storage or MPI."""

from models.checkpoint import CheckpointError, load_hf, restore_checkpoint, save_checkpoint
from models.config import PRESETS, ModelConfig, get_config
from models.costs import decode_flops, kv_bytes_per_token, prefill_flops
from models.decode import DecodeCache, generate
from models.model import decode_step, forward, forward_layer, greedy, reference_logits
from models.params import abstract_params, check_params, init_params, param_bytes, param_count
from models.prefill import Buckets, InputError, Layerwise, compile_counts, prefill
from models.sharding import make_mesh, param_shardings, shard_params

__all__ = [
    "CheckpointError", "load_hf", "restore_checkpoint", "save_checkpoint", "PRESETS", "ModelConfig", "get_config",
    "decode_flops", "kv_bytes_per_token", "prefill_flops", "DecodeCache", "generate", "decode_step", "forward",
    "forward_layer", "greedy", "reference_logits", "abstract_params", "check_params", "init_params", "param_bytes", "param_count",
    "Buckets", "InputError", "Layerwise", "compile_counts", "prefill", "make_mesh", "param_shardings",
    "shard_params",
]
