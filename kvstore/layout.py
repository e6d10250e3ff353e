"""Block layout and store fingerprint.

A **Full Block** is `[L, T, 2, K, H]` (layer outermost): all layers' K and V of T tokens. A
**Layer Block** `[T, 2, K, H]` is `full[l]`, a contiguous slice, so L Layer Blocks concatenate
into a Full Block with no conversion. The fingerprint covers everything that changes a block's
bytes or name; a store refuses to open under another fingerprint.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json

import ml_dtypes
import numpy as np

_DTYPES = {"float32": np.dtype(np.float32), "float16": np.dtype(np.float16),
           "bfloat16": np.dtype(ml_dtypes.bfloat16)}


@dataclasses.dataclass(frozen=True)
class BlockLayout:
    model: str
    n_layers: int  # L
    n_kv_heads: int  # K
    head_dim: int  # H
    dtype: str = "float32"
    block_tokens: int = 64  # T
    hash_seed: int = 0

    def __post_init__(self):
        for f in ("n_layers", "n_kv_heads", "head_dim", "block_tokens"):
            if getattr(self, f) <= 0:
                raise ValueError(f"BlockLayout: {f} must be positive, got {getattr(self, f)}")
        if self.dtype not in _DTYPES:
            raise ValueError(f"BlockLayout: dtype {self.dtype!r} not in {sorted(_DTYPES)}")

    @property
    def np_dtype(self) -> np.dtype:
        return _DTYPES[self.dtype]

    @property
    def full_shape(self) -> tuple[int, int, int, int, int]:
        return (self.n_layers, self.block_tokens, 2, self.n_kv_heads, self.head_dim)

    @property
    def layer_shape(self) -> tuple[int, int, int, int]:
        return self.full_shape[1:]

    @property
    def block_bytes(self) -> int:
        return int(np.prod(self.full_shape)) * self.np_dtype.itemsize

    @property
    def layer_bytes(self) -> int:
        return self.block_bytes // self.n_layers

    def fingerprint(self) -> str:
        """32 hex digits over every field (stable across processes, runs and machines)."""
        return _fingerprint(self)

    def check_block(self, block: np.ndarray, what: str = "block") -> None:
        """Raise ValueError unless `block` is one Full Block of this layout."""
        if tuple(block.shape) != self.full_shape or block.dtype != self.np_dtype:
            raise ValueError(f"{what} has shape {tuple(block.shape)} dtype {block.dtype}; this store holds Full "
                             f"Blocks [L, T, 2, K, H] = {self.full_shape} of {self.dtype}")

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "BlockLayout":
        return cls(**d)


@functools.lru_cache(maxsize=None)
def _fingerprint(layout: BlockLayout) -> str:
    canon = json.dumps(dataclasses.asdict(layout), sort_keys=True).encode()
    return hashlib.sha256(canon).hexdigest()[:32]
