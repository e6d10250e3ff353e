"""The DeepSeek-V3.2 family's configuration (MLA latent KV, DSA indexer, MoE): a frozen dataclass and
presets (imports without JAX). Shape legend (beyond `models.config`'s): R latent rank
(`kv_lora_rank`), Rq query latent rank (`q_lora_rank`, 0: no Q-LoRA), Dn / Dr per-head no-RoPE /
RoPE query-key dims, Dv value head dim, E routed experts, Fe expert FFN width, Ni / Hi indexer
heads / head dim.

The per-token cache record of one layer (`kv_record_shape`) is `[R + Dr + Hi]` in the model dtype:
the normalised latent, the shared RoPE key and the indexer key. With `kv_cache_dtype="fp8"` it
is the production byte layout instead (`uint8`): the latent in FP8 with one FP32 scale per 128
values plus the RoPE key in BF16 (656 B for the real shape), then the indexer key in FP8 with one
FP32 scale (132 B).
"""

from __future__ import annotations

import dataclasses
import math

from models.config import DTYPES, FamilyConfig, ModelConfigError

FP8_GROUP = 128  # values per FP32 scale in the FP8 latent layout
KV_CACHE_DTYPES = ("model", "fp8")


@dataclasses.dataclass(frozen=True)
class DeepSeekConfig(FamilyConfig):
    FAMILY = "models.deepseek"

    name: str = dataclasses.field(compare=False)  # a label: same architecture, same programs
    vocab: int  # V
    d_model: int  # D
    n_layers: int  # L
    n_heads: int  # N
    q_lora_rank: int  # Rq (0: q = h @ wq directly)
    kv_lora_rank: int  # R
    qk_nope_head_dim: int  # Dn
    qk_rope_head_dim: int  # Dr
    v_head_dim: int  # Dv
    ffw: int  # F of the dense layers
    moe_ffw: int  # Fe of each routed / shared expert
    n_routed_experts: int  # E
    n_shared_experts: int
    n_experts_per_tok: int
    n_group: int
    topk_group: int
    first_k_dense_replace: int
    index_n_heads: int  # Ni
    index_head_dim: int  # Hi
    index_topk: int
    max_seq_len: int
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 1.0
    rope_theta: float = 10000.0
    # YaRN (DeepSeek's form): factor <= 1 disables it.
    rope_factor: float = 1.0
    rope_original_max: int = 4096
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 1.0
    mscale_all_dim: float = 0.0
    norm_eps: float = 1e-6
    tie_embeddings: bool = False
    dtype: str = "bfloat16"
    kv_cache_dtype: str = "model"  # "model" (the record in `dtype`) or "fp8" (production byte layout)

    def __post_init__(self):
        positive = ("vocab", "d_model", "n_layers", "n_heads", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                    "v_head_dim", "ffw", "moe_ffw", "n_routed_experts", "n_experts_per_tok", "n_group", "topk_group",
                    "index_n_heads", "index_head_dim", "index_topk", "max_seq_len")
        for field in positive:
            if getattr(self, field) <= 0:
                raise ModelConfigError(f"DeepSeekConfig {self.name!r}: {field} must be positive, "
                                       f"got {getattr(self, field)}")
        checks = [
            (self.qk_rope_head_dim % 2 == 0, "qk_rope_head_dim must be even for RoPE"),
            (self.index_head_dim >= self.qk_rope_head_dim, "index_head_dim must hold the RoPE part"),
            (self.n_routed_experts % self.n_group == 0, "n_routed_experts must be a multiple of n_group"),
            (self.topk_group <= self.n_group, "topk_group must not exceed n_group"),
            (self.n_experts_per_tok <= self.topk_group * (self.n_routed_experts // self.n_group),
             "n_experts_per_tok exceeds the experts of topk_group groups"),
            (self.n_routed_experts // self.n_group >= 2 or self.n_group == 1, "groups need >= 2 experts"),
            (0 <= self.first_k_dense_replace <= self.n_layers, "first_k_dense_replace must be in [0, n_layers]"),
            (self.q_lora_rank >= 0 and self.n_shared_experts >= 0, "q_lora_rank, n_shared_experts must be >= 0"),
            (self.dtype in DTYPES, f"dtype must be one of {sorted(DTYPES)}"),
            (self.kv_cache_dtype in KV_CACHE_DTYPES, f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}"),
            (self.kv_cache_dtype != "fp8" or self.kv_lora_rank % self.fp8_group == 0,
             f"kv_lora_rank must be a multiple of {FP8_GROUP} (or smaller) for the fp8 cache"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ModelConfigError(f"DeepSeekConfig {self.name!r}: {msg}")

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def fp8_group(self) -> int:
        return min(FP8_GROUP, self.kv_lora_rank)

    def is_moe_layer(self, layer: int) -> bool:
        return layer >= self.first_k_dense_replace

    @property
    def softmax_mscale(self) -> float:
        """Softmax-scale correction of YaRN: (0.1 mscale_all_dim ln(factor) + 1)^2 (1 when YaRN is off)."""
        return yarn_mscale(self.rope_factor, self.mscale_all_dim) ** 2 if self.mscale_all_dim else 1.0

    @property
    def softmax_scale(self) -> float:
        return self.qk_head_dim ** -0.5 * self.softmax_mscale

    # The per-token cache record (agreed with kvstore.BlockLayout: a layer's KV is [.., T, *kv_record_shape]).
    @property
    def record_parts(self) -> tuple[int, int, int]:
        """Values per part of the record: (latent R, RoPE key Dr, indexer key Hi)."""
        return self.kv_lora_rank, self.qk_rope_head_dim, self.index_head_dim

    @property
    def kv_record_shape(self) -> tuple[int, ...]:
        if self.kv_cache_dtype == "fp8":
            R, Dr, Hi = self.record_parts
            return (R + 4 * (R // self.fp8_group) + 2 * Dr + Hi + 4,)
        return (sum(self.record_parts),)

    @property
    def kv_dtype(self) -> str:
        return "uint8" if self.kv_cache_dtype == "fp8" else self.dtype

    @property
    def kv_format(self) -> str:
        R, Dr, Hi = self.record_parts
        if self.kv_cache_dtype == "fp8":
            return f"mla-fp8:{R}/{self.fp8_group}+{Dr}bf16+{Hi}:uint8"
        return f"mla:{R}+{Dr}+{Hi}:{self.dtype}"


def yarn_mscale(factor: float, mscale: float) -> float:
    return 0.1 * mscale * math.log(factor) + 1.0 if factor > 1 else 1.0


_V32 = dict(vocab=129280, d_model=7168, n_layers=61, n_heads=128, q_lora_rank=1536, kv_lora_rank=512,
            qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, ffw=18432, moe_ffw=2048,
            n_routed_experts=256, n_shared_experts=1, n_experts_per_tok=8, n_group=8, topk_group=4,
            first_k_dense_replace=3, index_n_heads=64, index_head_dim=128, index_topk=2048, max_seq_len=163840,
            routed_scaling_factor=2.5, rope_factor=40.0, rope_original_max=4096, beta_fast=32.0, beta_slow=1.0,
            mscale=1.0, mscale_all_dim=1.0, dtype="bfloat16")

PRESETS: dict[str, DeepSeekConfig] = {
    # The public DeepSeek-V3.2 shape (671B parameters without the MTP layer): checked by shape
    # (jax.eval_shape) and by its cost model; no single host here holds it.
    "deepseek-v3.2": DeepSeekConfig("deepseek-v3.2", **_V32),
    # The paper's down-scaled V3.2 (docs/paper.md §8): no Q-LoRA in attention or indexer.
    "ds-27b": DeepSeekConfig("ds-27b", **{**_V32, **dict(
        d_model=2560, ffw=12288, n_layers=30, n_heads=32, n_routed_experts=72, moe_ffw=1536, n_experts_per_tok=6,
        n_shared_experts=2, first_k_dense_replace=1, index_n_heads=32, index_head_dim=64, index_topk=1024,
        q_lora_rank=0)}),
    # Tests: float32 so paths compare bit for bit; 8 experts in 4 groups (2 chosen), top-k 24 < test lengths.
    "deepseek-tiny": DeepSeekConfig(
        "deepseek-tiny", vocab=256, d_model=64, n_layers=3, n_heads=4, q_lora_rank=32, kv_lora_rank=32,
        qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, ffw=128, moe_ffw=32, n_routed_experts=8,
        n_shared_experts=1, n_experts_per_tok=3, n_group=4, topk_group=2, first_k_dense_replace=1,
        index_n_heads=4, index_head_dim=16, index_topk=24, max_seq_len=4096, routed_scaling_factor=2.5,
        rope_factor=4.0, rope_original_max=256, mscale=1.0, mscale_all_dim=1.0, dtype="float32"),
    # Demo and CPU benchmarks: every mechanism at a size a CPU runs in seconds.
    "deepseek-small": DeepSeekConfig(
        "deepseek-small", vocab=1024, d_model=256, n_layers=4, n_heads=8, q_lora_rank=0, kv_lora_rank=128,
        qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32, ffw=512, moe_ffw=128, n_routed_experts=16,
        n_shared_experts=1, n_experts_per_tok=4, n_group=4, topk_group=2, first_k_dense_replace=1,
        index_n_heads=4, index_head_dim=32, index_topk=256, max_seq_len=32768, routed_scaling_factor=2.5,
        rope_factor=8.0, rope_original_max=4096, mscale=1.0, mscale_all_dim=1.0, dtype="float32"),
}
