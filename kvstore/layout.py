"""Block layout and store fingerprint, for any per-token cache record.

A cache **record** is what one token leaves in one layer's cache, `record_shape` values of one
dtype (K and V per head for grouped-query attention; a latent, a RoPE key and indexer keys for
MLA; bytes for a packed FP8-plus-scales record). The store does not know which: the caller
names the format in `format`, and that string enters the fingerprint.

A **Full Block** is `[L, T, *record_shape]` (layer outermost): all layers' records of T tokens.
A **Layer Block** `[T, *record_shape]` is `full[l]`, a contiguous slice, so L Layer Blocks
concatenate into a Full Block with no conversion. The fingerprint covers everything that
changes a block's bytes or name; a store refuses to open under another fingerprint.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math

import ml_dtypes
import numpy as np

ALIGN = 4096  # bytes: a page. NumPy's large arrays start 16 bytes past one, where a kernel copy
# (`preadv`) runs at a fraction of its speed on some CPUs (1.5 against 11 GB/s on an AMD EPYC)


def aligned_empty(nbytes: int, zero: bool = False) -> np.ndarray:
    """A uint8 array of `nbytes` starting on an `ALIGN` boundary (a view of an over-allocated owner,
    which every view of it keeps alive). `zero`: zero-filled (calloc: free until touched)."""
    return aligned_view((np.zeros if zero else np.empty)(nbytes + ALIGN, np.uint8), nbytes)


def aligned_view(owner: np.ndarray, nbytes: int) -> np.ndarray:
    """The first `nbytes` of uint8 array `owner` from its first `ALIGN` boundary on."""
    start = -owner.ctypes.data % ALIGN
    return owner[start:start + nbytes]


@functools.cache
def np_dtype(name: str) -> np.dtype:
    """The NumPy dtype called `name` ("float32", "bfloat16", "float8_e4m3fn", "uint8", ...)."""
    try:
        dt = np.dtype(getattr(ml_dtypes, name)) if hasattr(ml_dtypes, name) else np.dtype(name)
    except TypeError:
        dt = None
    if dt is None or dt.kind not in "biufV" or dt.name != name:
        raise ValueError(f"BlockLayout: dtype {name!r} is not a numeric NumPy or ml_dtypes type name")
    return dt


@dataclasses.dataclass(frozen=True, kw_only=True)
class BlockLayout:
    n_layers: int  # L
    record_shape: tuple[int, ...]  # one token's cache record in one layer
    dtype: str = "float32"
    format: str = ""  # the caller's name for the record format (e.g. "gqa:2x2x16:float32 model=tiny")
    block_tokens: int = 64  # T
    hash_seed: int = 0

    def __post_init__(self):
        object.__setattr__(self, "record_shape", tuple(int(d) for d in self.record_shape))
        for f in ("n_layers", "block_tokens"):
            if getattr(self, f) <= 0:
                raise ValueError(f"BlockLayout: {f} must be positive, got {getattr(self, f)}")
        if not self.record_shape or min(self.record_shape) <= 0:
            raise ValueError(f"BlockLayout: record_shape must be non-empty and positive, got {self.record_shape}")
        np_dtype(self.dtype)

    @property
    def np_dtype(self) -> np.dtype:
        return np_dtype(self.dtype)

    @property
    def full_shape(self) -> tuple[int, ...]:
        return (self.n_layers, self.block_tokens, *self.record_shape)

    @property
    def layer_shape(self) -> tuple[int, ...]:
        return (self.block_tokens, *self.record_shape)

    @property
    def record_bytes(self) -> int:
        return math.prod(self.record_shape) * self.np_dtype.itemsize

    @property
    def layer_bytes(self) -> int:
        return self.block_tokens * self.record_bytes

    @property
    def block_bytes(self) -> int:
        return self.n_layers * self.layer_bytes

    def fingerprint(self) -> str:
        """32 hex digits over every field (stable across processes, runs and machines)."""
        return _fingerprint(self)

    def describe(self) -> str:
        """One line naming the format and shape, for messages."""
        return f"{self.format or 'unnamed format'} [L, T, *record] = {list(self.full_shape)} {self.dtype}"

    def empty(self, n: int) -> np.ndarray:
        """A page-aligned buffer [n, L, T, *record] for n Full Blocks (what reads land in)."""
        return aligned_empty(n * self.block_bytes).view(self.np_dtype).reshape(n, *self.full_shape)

    def check_block(self, block: np.ndarray, what: str = "block") -> None:
        """Raise ValueError unless `block` is one Full Block of this layout."""
        if tuple(block.shape) != self.full_shape or block.dtype != self.np_dtype:
            raise ValueError(f"{what} has shape {tuple(block.shape)} dtype {block.dtype}; this store holds Full "
                             f"Blocks [L, T, *record] = {self.full_shape} of {self.dtype}")

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["record_shape"] = list(self.record_shape)
        return d

    @classmethod
    def from_json(cls, d: dict) -> BlockLayout:
        return cls(**{**d, "record_shape": tuple(d["record_shape"])})


@functools.lru_cache(maxsize=None)
def _fingerprint(layout: BlockLayout) -> str:
    canon = json.dumps(layout.to_json(), sort_keys=True).encode()
    return hashlib.sha256(canon).hexdigest()[:32]
