"""What MPI ranks of the transport exchange, and the requests each side has in flight.

Four tags: control messages and KV headers (pickled), KV data pieces (raw bytes), and the empty
"bell" that follows every control message and header so that a rank waiting inside MPI wakes up
(`dualjax.runtime.transport.mpi`). A `LayerKV` crosses as a header, whose `kv` is a `KVShape`,
then its bytes in pieces of at most `chunk` bytes.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

TAG_CTRL, TAG_KV_HEAD, TAG_KV_DATA, TAG_BELL = 11, 12, 13, 14


@dataclasses.dataclass(frozen=True)
class KVShape:
    """Shape and dtype of a KV array in flight: stands in for the array in the pickled header."""

    shape: tuple
    dtype: np.dtype
    chunk: int  # bytes per data message (the last may be shorter)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize


@dataclasses.dataclass(frozen=True)
class WaitInsideMpi:
    """From a rank that found its KV moving only inside MPI calls to the ranks sending it KV."""


def byte_rows(kv: np.ndarray) -> tuple[int, int, int, int] | None:
    """(rows, row bytes, stride, address) when `kv` is rows of contiguous bytes a fixed stride
    apart but not contiguous as a whole (e.g. one layer of several Full Blocks); else None."""
    if kv.flags.c_contiguous or kv.ndim < 2 or kv.size == 0:
        return None
    try:
        rows = np.reshape(kv, (kv.shape[0], -1), copy=False)
    except ValueError:
        return None
    width = rows.shape[1] * rows.itemsize
    if rows.strides[1] != rows.itemsize or rows.strides[0] < width:
        return None
    return rows.shape[0], width, rows.strides[0], rows.__array_interface__["data"][0]


class InFlight:
    """MPI requests not complete yet, each with the record it stands for (which keeps its buffer
    alive until it completes). `requests` is the list `Testsome`/`Waitsome` take; `pop` removes
    completed ones by their indices in it, so a request and its record never part."""

    __slots__ = ("requests", "records")

    def __init__(self):
        self.requests: list = []
        self.records: list = []

    def add(self, request, record) -> None:
        self.requests.append(request)
        self.records.append(record)

    def pop(self, indices: list[int]) -> list:
        """The records of the requests at `indices` (in that order), removed."""
        out = [self.records[i] for i in indices]
        for i in sorted(indices, reverse=True):
            del self.requests[i], self.records[i]
        return out
