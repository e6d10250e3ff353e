"""The store's on-disk format (version 4, docs/store.md), shared by both I/O back ends: how many
blocks a segment holds, the zarr3 metadata of the data array and a segment's shard index, where
its Layer Blocks lie, and its entry (its blocks' hashes, slots, parents, token ids and
per-Layer-Block checksums), encoded and decoded.

A segment file is its zarr3 shard index, its blocks' Layer Blocks layer-major (layer 0 of each
block in slot order, then layer 1, ...: `data_parts`), then its entry and the entry's length.
TensorStore's zarr3 driver finds chunks through the shard index (a shard may hold its chunks in
any order) and ignores the bytes after the last one, so the entry rides in the same file and
`index/<hash>` can be a hard link to that file. Layer-major, one layer of a segment's consecutive
blocks is one run of the file: a layerwise prefill's layer-major read takes it in a few large
reads, not one per block.
"""

from __future__ import annotations

import functools
import struct
from typing import NamedTuple

import numpy as np
import xxhash

from kvstore.hashing import hash_block
from kvstore.layout import BlockLayout

SLOT_BITS = 54  # slots index the data array's first axis, [0, 2**SLOT_BITS) ...
COUNTER_BITS = 24  # ... as `writer id << COUNTER_BITS | counter`: slots one writer id names
MAX_SEGMENT_SLOTS = 64  # blocks per segment file at most ...
SEGMENT_BYTES = 64 << 20  # ... and at most this many bytes of blocks
ENTRY_MAGIC = b"DJIX6"
_ENTRY_HEAD = struct.Struct("<5sH")  # magic, n blocks; then n hashes, n records, then _ENTRY_TAIL
_RECORD_HEAD = struct.Struct("<q16s")  # slot, parent hash; then L XXH3-64 (<u8), T token ids (<i4)
_ENTRY_TAIL = struct.Struct("<QI")  # XXH3-64 of the entry before it, the entry's length (checksum included)


class Entry(NamedTuple):
    """A block's index entry, verified: its slot (row of the data array; its segment is
    `slot // S`), the XXH3-64 of each of its Layer Blocks [L] <u8, the hashes of its segment's
    blocks in slot order, and its place `k` among them (its Layer Block l lies at
    `shard_index_bytes + (l * len(members) + k) * layer_bytes` in the segment file)."""

    slot: int
    sums: np.ndarray
    members: tuple[str, ...]
    k: int


def segment_slots(layout: BlockLayout) -> int:
    """S for a new store: the largest power of two up to MAX_SEGMENT_SLOTS whose blocks fit in
    SEGMENT_BYTES (at least 1). A power of two divides 2**COUNTER_BITS, so no segment spans two
    writer ids."""
    s = MAX_SEGMENT_SLOTS
    while s > 1 and s * layout.block_bytes > SEGMENT_BYTES:
        s //= 2
    return s


def zarr_metadata(layout: BlockLayout, slots: int) -> dict:
    raw = {"name": "bytes", "configuration": {"endian": "little"}}
    shard = {"name": "sharding_indexed", "configuration": {
        "chunk_shape": [1, 1, *layout.layer_shape], "codecs": [raw], "index_location": "start",
        "index_codecs": [raw]}}
    return {"shape": [1 << SLOT_BITS, *layout.full_shape], "data_type": layout.dtype,
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [slots, *layout.full_shape]}},
            "chunk_key_encoding": {"name": "v2", "configuration": {"separator": "."}}, "codecs": [shard]}


@functools.lru_cache(maxsize=256)
def shard_index(layout: BlockLayout, slots: int, first: int, n: int) -> bytes:
    """The zarr3 shard index [slots, L, 2] (<u8) of a segment file holding n blocks from position
    `first`: (offset, length) per Layer Block, both all-ones for absent ones; the Layer Blocks
    follow the index in layer, slot order (`data_parts`). Cached: a writer uses few (first, n)."""
    index = np.full((slots, layout.n_layers, 2), np.iinfo(np.uint64).max, "<u8")
    offsets = shard_index_bytes(layout, slots) + np.arange(n * layout.n_layers, dtype="<u8") * layout.layer_bytes
    index[first:first + n, :, 0] = offsets.reshape(layout.n_layers, n).T
    index[first:first + n, :, 1] = layout.layer_bytes
    return index.tobytes()


def data_parts(blocks: list) -> list[memoryview]:
    """A segment's Full Blocks (in slot order) as the Layer Blocks its file holds, in file order:
    layer 0 of every block, then layer 1, ... (the bytes of each, not copied; a block that is not
    C-contiguous is copied once)."""
    rows = [np.ascontiguousarray(block).reshape(len(block), -1).view(np.uint8) for block in blocks]
    return [memoryview(row[layer]) for layer in range(len(rows[0])) for row in rows]


def segment_key(layout: BlockLayout, segment: int) -> str:
    """A segment's key under `data/` (zarr3's "v2" chunk key: the chunk's grid position)."""
    return ".".join([str(segment)] + ["0"] * len(layout.full_shape))


def shard_index_bytes(layout: BlockLayout, slots: int) -> int:
    """Bytes of a segment file's shard index: where its first Layer Block starts."""
    return slots * layout.n_layers * 16


def _record_bytes(layout: BlockLayout) -> int:
    return _RECORD_HEAD.size + 8 * layout.n_layers + 4 * layout.block_tokens


def entry_bytes(layout: BlockLayout, n: int) -> int:
    """Bytes of the entry of a segment of n blocks, length included (the most a lookup reads from
    a file's end: n = S)."""
    return _ENTRY_HEAD.size + n * (16 + _record_bytes(layout)) + _ENTRY_TAIL.size


def encode_entry(ids: list, slots: list[int], sums: np.ndarray) -> bytes:
    """A segment's entry: magic, n, the n block hashes, n records (slot, parent hash, one XXH3-64
    per Layer Block from `sums` [n, L], token ids), an XXH3-64 of all of it and its length."""
    body = b"".join([_ENTRY_HEAD.pack(ENTRY_MAGIC, len(ids)), *(bytes.fromhex(b.hash) for b in ids),
                     *(_RECORD_HEAD.pack(slot, bytes.fromhex(b.parent)) + s.tobytes() +
                       np.asarray(b.tokens, "<i4").tobytes() for b, slot, s in zip(ids, slots, sums))])
    return body + _ENTRY_TAIL.pack(xxhash.xxh3_64_intdigest(body), len(body) + 8)


def decode_entry(raw: bytes, h: str, layout: BlockLayout) -> Entry | None:
    """Block `h`'s `Entry` from `raw`, bytes that end with a segment's entry (the segment file's
    tail, or the entry alone); None when the entry is malformed or fails its checksum, or `h`'s
    record is absent or does not hash back to `h`."""
    end = len(raw) - 4
    length = int.from_bytes(raw[end:], "little") if end >= 0 else 0
    start, size = end - length, _record_bytes(layout)
    magic, n = _ENTRY_HEAD.unpack_from(raw, start) if start >= 0 and length >= _ENTRY_HEAD.size + 8 else (b"", 0)
    if magic != ENTRY_MAGIC or not n or length != _ENTRY_HEAD.size + n * (16 + size) + 8 or \
            xxhash.xxh3_64_intdigest(memoryview(raw)[start:end - 8]) != int.from_bytes(raw[end - 8:end], "little"):
        return None
    first = start + _ENTRY_HEAD.size
    members = tuple(raw[first + 16 * i:first + 16 * (i + 1)].hex() for i in range(n))
    if h not in members:
        return None
    k = members.index(h)
    at = first + 16 * n + size * k
    slot, parent = _RECORD_HEAD.unpack_from(raw, at)
    L, T = layout.n_layers, layout.block_tokens
    tokens = np.frombuffer(raw, "<i4", T, at + _RECORD_HEAD.size + 8 * L)
    if not 0 <= slot < 1 << SLOT_BITS or hash_block(parent.hex(), tokens, layout) != h:
        return None
    return Entry(slot, np.frombuffer(raw, "<u8", L, at + _RECORD_HEAD.size), members, k)


def bytes_of(a) -> memoryview:
    """The bytes of a C-contiguous array (any dtype, bfloat16 included), bytes or a memoryview, not copied."""
    if isinstance(a, (bytes, memoryview)):
        return memoryview(a)
    return memoryview(np.ascontiguousarray(a).reshape(-1).view(np.uint8))


def joined(parts: list) -> bytes:
    """Arrays and bytes concatenated into one value (a segment for a TensorStore kvstore)."""
    return b"".join(bytes_of(p) for p in parts)


def layer_sums(block: np.ndarray) -> list[int]:
    """XXH3-64 of each Layer Block of a Full Block."""
    return [xxhash.xxh3_64_intdigest(layer) for layer in block]


