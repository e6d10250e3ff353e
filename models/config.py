"""Model configuration: one frozen dataclass of plain scalars and named presets.

Shape legend used across `models/`: B batch, T new tokens, S cached tokens, D model,
N query heads, K kv heads, H head dim, F ffw, V vocab, L layers.
"""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np


class ModelConfigError(ValueError):
    """A bad model config or an unknown preset name; the message names the field or the presets."""


class UnknownPreset(ModelConfigError, KeyError):
    def __str__(self) -> str:
        return self.args[0]


# The one table of model dtypes, as NumPy dtypes (JAX takes these directly; ml_dtypes is what
# jnp.bfloat16 is). Every dtype name in `models/` (configs, checkpoints, caches) is a key here.
DTYPES = {"float32": np.dtype(np.float32), "bfloat16": np.dtype(ml_dtypes.bfloat16), "float16": np.dtype(np.float16)}


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """Llama 3 frequency scaling of RoPE (Hugging Face `rope_type: "llama3"`): wavelengths longer than
    `original_max_position / low_freq_factor` are stretched by `factor`, those shorter than
    `original_max_position / high_freq_factor` are kept, and the band between is interpolated."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position: int

    def __post_init__(self):
        bands = 0 < self.low_freq_factor < self.high_freq_factor
        if not (self.factor > 0 and bands and self.original_max_position > 0):
            raise ModelConfigError(f"RopeScaling needs factor > 0, 0 < low_freq_factor < high_freq_factor and "
                                   f"original_max_position > 0, got {self}")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    name: str = dataclasses.field(compare=False)  # a label: same architecture, same programs
    vocab: int  # V
    d_model: int  # D
    n_layers: int  # L
    n_heads: int  # N
    n_kv_heads: int  # K
    head_dim: int  # H
    ffw: int  # F
    max_seq_len: int
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None  # Llama 3 frequency scaling; None: plain RoPE
    norm_eps: float = 1e-6
    qkv_bias: bool = False
    tie_embeddings: bool = False
    dtype: str = "float32"

    def __post_init__(self):
        for field in ("vocab", "d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "ffw", "max_seq_len"):
            if getattr(self, field) <= 0:
                raise ModelConfigError(f"ModelConfig {self.name!r}: {field} must be positive, "
                                       f"got {getattr(self, field)}")
        if self.n_heads % self.n_kv_heads:
            raise ModelConfigError(
                f"ModelConfig {self.name!r}: n_heads={self.n_heads} must be a multiple of n_kv_heads={self.n_kv_heads}"
            )
        if self.head_dim % 2:
            raise ModelConfigError(f"ModelConfig {self.name!r}: head_dim must be even for RoPE, got {self.head_dim}")
        if self.rope_scaling is not None and not isinstance(self.rope_scaling, RopeScaling):
            raise ModelConfigError(f"ModelConfig {self.name!r}: rope_scaling must be a RopeScaling or None, "
                                   f"got {self.rope_scaling!r}")
        if self.dtype not in DTYPES:
            raise ModelConfigError(f"ModelConfig {self.name!r}: dtype {self.dtype!r} not in {sorted(DTYPES)}")

    @property
    def jnp_dtype(self):
        return DTYPES[self.dtype]

    @property
    def q_per_kv(self) -> int:
        return self.n_heads // self.n_kv_heads

    @property
    def kv_record_shape(self) -> tuple[int, ...]:
        """One token's cache record in one layer: K and V of each kv head, [2, K, H]."""
        return (2, self.n_kv_heads, self.head_dim)

    @property
    def kv_dtype(self) -> str:
        return self.dtype

    @property
    def kv_format(self) -> str:
        """Names the cache record format for the KV store's fingerprint."""
        return f"gqa:2x{self.n_kv_heads}x{self.head_dim}:{self.kv_dtype}"

    def replace(self, **changes) -> "ModelConfig":
        return dataclasses.replace(self, **changes)


PRESETS: dict[str, ModelConfig] = {
    # Tests: two layers, tiny dims, float32 so paths can be compared bit for bit.
    "tiny": ModelConfig("tiny", vocab=256, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16,
                        ffw=128, max_seq_len=4096),
    # Demo and CPU benchmarks: MHA (K = N) so KV bytes are large relative to compute, as in an
    # agentic workload on a real model with FP16 KV (docs/paper.md §1).
    "small": ModelConfig("small", vocab=1024, d_model=256, n_layers=4, n_heads=8, n_kv_heads=8, head_dim=32,
                         ffw=512, max_seq_len=32768),
    # Real shapes: used at full size only through jax.eval_shape and by cost models.
    "llama3.2-1b": ModelConfig("llama3.2-1b", vocab=128256, d_model=2048, n_layers=16, n_heads=32, n_kv_heads=8,
                               head_dim=64, ffw=8192, max_seq_len=131072, rope_theta=500000.0,
                               rope_scaling=RopeScaling(32.0, 1.0, 4.0, 8192), norm_eps=1e-5, tie_embeddings=True,
                               dtype="bfloat16"),
    "qwen2.5-0.5b": ModelConfig("qwen2.5-0.5b", vocab=151936, d_model=896, n_layers=24, n_heads=14, n_kv_heads=2,
                                head_dim=64, ffw=4864, max_seq_len=32768, rope_theta=1000000.0, qkv_bias=True,
                                tie_embeddings=True, dtype="bfloat16"),
    "qwen2.5-7b": ModelConfig("qwen2.5-7b", vocab=152064, d_model=3584, n_layers=28, n_heads=28, n_kv_heads=4,
                              head_dim=128, ffw=18944, max_seq_len=131072, rope_theta=1000000.0, qkv_bias=True,
                              dtype="bfloat16"),
    "qwen2.5-32b": ModelConfig("qwen2.5-32b", vocab=152064, d_model=5120, n_layers=64, n_heads=40, n_kv_heads=8,
                               head_dim=128, ffw=27648, max_seq_len=131072, rope_theta=1000000.0, qkv_bias=True,
                               dtype="bfloat16"),
}


def get_config(name: str, **overrides) -> ModelConfig:
    """The preset called `name`, with optional field overrides. Raises UnknownPreset (a KeyError) for unknown names."""
    if name not in PRESETS:
        raise UnknownPreset(f"unknown model preset {name!r}; presets: {', '.join(PRESETS)}")
    cfg = PRESETS[name]
    return cfg.replace(**overrides) if overrides else cfg
