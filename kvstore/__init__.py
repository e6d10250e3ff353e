"""The KV block store (names, entries, pins, budget, counters) over two I/O back ends (POSIX on a
local directory; TensorStore on any kvstore), with per-host storage NIC models. Knows nothing of
JAX or MPI."""

from kvstore.errors import FingerprintMismatch, StoreError
from kvstore.hashing import ROOT, BlockId, block_chain, check_hash, hash_block
from kvstore.layout import BlockLayout
from kvstore.metadata import FORMAT_VERSION, MANIFEST
from kvstore.reads import BlockRead
from kvstore.segments import SLOT_BITS, Entry
from kvstore.snic import ReadTicket, StorageNIC
from kvstore.store import COUNTERS, IO, BlockStore, local_spec

__all__ = ["ROOT", "BlockId", "block_chain", "check_hash", "hash_block", "BlockLayout", "ReadTicket", "StorageNIC",
           "MANIFEST", "BlockStore", "BlockRead", "Entry", "FingerprintMismatch", "StoreError", "local_spec",
           "COUNTERS", "IO", "SLOT_BITS", "FORMAT_VERSION"]
