"""What the store tests share: a tiny layout, blocks and their ids, and stores opened on either back
end (`BACKENDS`: the POSIX back end on a local directory, TensorStore on the same kind of
directory, TensorStore on `memory://`)."""

import os

import numpy as np

import kvstore as kv


def layout(**kw) -> kv.BlockLayout:
    return kv.BlockLayout(**{"n_layers": 2, "record_shape": (2, 2, 16), "format": "gqa:2x2x16:float32", **kw})


LAYOUT = layout()
BACKENDS = ["posix", "tensorstore", "memory"]
ON_DISK = ["posix", "tensorstore"]  # back ends whose files a test can damage


def blocks(n, layout=LAYOUT, seed=0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, *layout.full_shape)).astype(layout.np_dtype)


def chain(n, layout=LAYOUT, offset=0) -> list[kv.BlockId]:
    return kv.block_chain(np.arange(offset, offset + n * layout.block_tokens) % 251, layout)


def hashes(ids) -> list[str]:
    return [b.hash for b in ids]


def spec(backend: str, directory):
    """The kvstore spec and `io` of a store on `backend` (on "memory", stores share their bytes
    only when opened with one ts.Context)."""
    return ("memory://", "tensorstore") if backend == "memory" else (kv.local_spec(directory), backend)


def open_store(backend: str, directory, layout=LAYOUT, **kw) -> kv.BlockStore:
    where, io = spec(backend, directory)
    return kv.BlockStore(where, layout, io=io, **kw)


def segment_files(directory) -> list[str]:
    """A local store's segment files (not its metadata, not temp files)."""
    data = os.path.join(directory, "data")
    return [f for f in os.listdir(data) if f != "zarr.json" and not f.endswith(".tmp")]


def layer_in_file(directory, store: kv.BlockStore, h: str, layer: int = 0) -> tuple[str, int]:
    """(segment file, offset of block `h`'s Layer Block `layer` in it): the shard index (S·L
    (offset, length) pairs of <u8) comes first, then the segment's n blocks layer-major (layer 0
    of each in slot order, then layer 1, ...), then its entry."""
    entry = store.entries([h])[0]
    S, layout = store.slots_per_segment, store.layout
    path = os.path.join(directory, "data", kv.segments.segment_key(layout, entry.slot // S))
    return path, S * layout.n_layers * 16 + (layer * len(entry.members) + entry.k) * layout.layer_bytes
