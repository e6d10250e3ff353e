"""The dense GQA family's configuration (Llama / Qwen2): one frozen dataclass of plain scalars and
named presets (imports without JAX). Shape legend: `models.config`.

The per-token cache record of one layer (`kv_record_shape`) is `[2, K, H]` in the model dtype: the
key after RoPE, then the value, of each kv head.
"""

from __future__ import annotations

import dataclasses

from models.config import DTYPES, FamilyConfig, ModelConfigError


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
class ModelConfig(FamilyConfig):
    FAMILY = "models.dense"

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

    @classmethod
    def from_fields(cls, fields: dict) -> "ModelConfig":
        return cls(**{**fields, "rope_scaling": _rope_scaling_field(fields.get("rope_scaling"))})


def _rope_scaling_field(value) -> RopeScaling | None:
    """`rope_scaling` as `model_config.json` holds it: an object of RopeScaling's fields or null (or, in
    checkpoints written before RopeScaling, a list [factor, low, high, original_max] with factor 0 for off)."""
    if isinstance(value, dict):
        return RopeScaling(**value)
    if isinstance(value, list) and value and value[0]:
        return RopeScaling(*value)
    return None


PRESETS: dict[str, ModelConfig] = {
    # Tests: two layers, tiny dims, float32 so paths can be compared bit for bit.
    "tiny": ModelConfig("tiny", vocab=256, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16,
                        ffw=128, max_seq_len=4096),
    # Demo and CPU benchmarks: MHA (K = N) so KV bytes are large relative to compute, as in an
    # agentic workload on a real model with FP16 KV (docs/paper.md §1).
    "small": ModelConfig("small", vocab=1024, d_model=256, n_layers=4, n_heads=8, n_kv_heads=8, head_dim=32,
                         ffw=512, max_seq_len=32768),
    # Real shapes: run on devices that hold them (`dualjax bench model --model qwen2.5-7b` on one GPU);
    # the tests check them by shape (jax.eval_shape) and the simulator by their cost model.
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

