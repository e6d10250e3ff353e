"""Chained content hashes that name KV blocks.

hash_i = BLAKE2b-128(parent hash_{i-1} || layout fingerprint || token ids of block i as int32
little-endian), with the root parent all zeros. The seed enters through the fingerprint, so
every process and every run computes the same names; Python's `hash()` is never used.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import re

import numpy as np

from kvstore.layout import BlockLayout

ROOT = "0" * 32
_HEX32 = re.compile(r"^[0-9a-f]{32}$")


@dataclasses.dataclass(frozen=True)
class BlockId:
    """A block's name, its parent's name and the token ids it covers ([T] int32)."""

    hash: str
    parent: str
    tokens: np.ndarray = dataclasses.field(compare=False, repr=False)


def check_hash(h) -> str:
    if not is_hash(h):
        raise ValueError(f"malformed block hash {h!r}: expected 32 lowercase hex digits")
    return h


def is_hash(key) -> bool:
    """Whether `key` is a block hash (an index key; not a temp file or a probe)."""
    return isinstance(key, str) and bool(_HEX32.match(key))


def hash_block(parent: str, tokens, layout: BlockLayout) -> str:
    ids = np.ascontiguousarray(tokens, dtype="<i4")
    if ids.shape != (layout.block_tokens,):
        raise ValueError(f"a block covers {layout.block_tokens} tokens, got {ids.shape}")
    h = hashlib.blake2b(bytes.fromhex(check_hash(parent)), digest_size=16)
    h.update(_fingerprint_bytes(layout))
    h.update(ids)
    return h.hexdigest()


@functools.lru_cache(maxsize=64)
def _fingerprint_bytes(layout: BlockLayout) -> bytes:
    return bytes.fromhex(layout.fingerprint())


def block_chain(tokens, layout: BlockLayout) -> list[BlockId]:
    """Ids of the full blocks of a token sequence (a partial trailing block gets none)."""
    tokens = np.asarray(tokens, dtype=np.int32).reshape(-1)
    T = layout.block_tokens
    out, parent = [], ROOT
    for i in range(len(tokens) // T):
        chunk = tokens[i * T:(i + 1) * T]
        h = hash_block(parent, chunk, layout)
        out.append(BlockId(h, parent, chunk))
        parent = h
    return out
