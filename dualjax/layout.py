"""The one place where a model config becomes a KV block layout."""

from __future__ import annotations

from kvstore import BlockLayout
from models import ModelConfig


def layout_for(cfg: ModelConfig, block_tokens: int = 64, hash_seed: int = 0) -> BlockLayout:
    """Full Block layout [L, T, 2, K, H] of `cfg`'s KV, fingerprinted with the model name and dtype."""
    return BlockLayout(model=cfg.name, n_layers=cfg.n_layers, n_kv_heads=cfg.n_kv_heads, head_dim=cfg.head_dim,
                       dtype=cfg.dtype, block_tokens=block_tokens, hash_seed=hash_seed)
