"""Segment files of the KV block store (format version 2, docs/store.md): how many blocks one
holds, its zarr3 metadata and shard index, and how a file's new value is staged and published
atomically (a temp file renamed or hard-linked into place on a local directory; one TensorStore
write elsewhere)."""

from __future__ import annotations

import contextlib
import os
import threading

import numpy as np
import tensorstore as ts

from kvstore.layout import BlockLayout

SLOT_BITS = 54  # slots index the data array's first axis, [0, 2**SLOT_BITS)
MAX_SEGMENT_SLOTS = 64  # blocks per segment file at most ...
SEGMENT_BYTES = 64 << 20  # ... and at most this many bytes of blocks


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


def shard_index(layout: BlockLayout, slots: int, first: int, n: int) -> np.ndarray:
    """The zarr3 shard index [slots, L, 2] of a segment file holding n blocks from position
    `first`: (offset, length) per Layer Block, both all-ones for absent ones; the blocks follow
    the index in slot, layer order."""
    index = np.full((slots, layout.n_layers, 2), np.iinfo(np.uint64).max, "<u8")
    offsets = shard_index_bytes(layout, slots) + np.arange(n * layout.n_layers, dtype="<u8") * layout.layer_bytes
    index[first:first + n, :, 0] = offsets.reshape(n, layout.n_layers)
    index[first:first + n, :, 1] = layout.layer_bytes
    return index


def shard_index_bytes(layout: BlockLayout, slots: int) -> int:
    """Bytes of a segment file's shard index: where its first Layer Block starts."""
    return slots * layout.n_layers * 16


def _bytes_of(a) -> memoryview:
    """The bytes of a C-contiguous array (any dtype, bfloat16 included) or bytes, not copied."""
    return memoryview(a if isinstance(a, bytes) else np.ascontiguousarray(a).reshape(-1).view(np.uint8))


class Staged:
    """A local file's new value, written to a temp file beside it (unique to this process and
    thread, fsynced when `sync`); `publish()` renames it into place (atomic), `discard()` removes
    it."""

    def __init__(self, path: str, parts: list, sync: bool):
        self.path, self.tmp = path, f"{path}.{os.getpid()}-{threading.get_ident()}.tmp"
        views = [_bytes_of(p) for p in parts]
        try:
            fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                while views:
                    done = os.writev(fd, views[:1024])
                    while views and done >= len(views[0]):
                        done -= len(views.pop(0))
                    if views and done:
                        views[0] = views[0][done:]
                if sync:
                    os.fsync(fd)
            finally:
                os.close(fd)
        except OSError:
            self.discard()
            raise

    def publish(self) -> None:
        try:
            os.replace(self.tmp, self.path)
        except OSError:
            self.discard()
            raise

    def publish_as(self, paths: list[str]) -> None:
        """Hard-link the file at each of `paths` (each link appears atomically; one already there
        is another writer's equal entry and stays), then drop the temp name."""
        try:
            for path in paths:
                with contextlib.suppress(FileExistsError):
                    os.link(self.tmp, path)
        finally:
            self.discard()

    def discard(self) -> None:
        with contextlib.suppress(OSError):
            os.unlink(self.tmp)


class Pending:
    """A value for a TensorStore kvstore (not a local directory): one write at `publish()`."""

    def __init__(self, kv: ts.KvStore, key: str, parts: list):
        self.kv, self.key, self.value = kv, key, b"".join(_bytes_of(p) for p in parts)

    def publish(self) -> None:
        self.kv.write(self.key, self.value).result()

    def publish_as(self, keys: list[str]) -> None:
        for f in [self.kv.write(key, self.value) for key in keys]:
            f.result()

    def discard(self) -> None:
        self.value = b""
