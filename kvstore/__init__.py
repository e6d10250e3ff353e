"""The KV block store (names, entries, pins, budget, counters) over two I/O back ends (POSIX on a
local directory; TensorStore on any kvstore), where a store is (a directory, a kvstore URL or JSON
spec), with per-host storage NIC models. Knows nothing of JAX or MPI."""

from kvstore.errors import FingerprintMismatch, StoreError
from kvstore.hashing import ROOT, BlockId, block_chain, check_hash, hash_block
from kvstore.layout import BlockLayout
from kvstore.location import StoreLocation, locate, store_exists
from kvstore.metadata import FORMAT_VERSION, MANIFEST
from kvstore.reads import BlockRead
from kvstore.segments import SLOT_BITS, Entry
from kvstore.snic import ReadTicket, StorageNIC
from kvstore.store import COUNTERS, IO, BlockStore, local_spec

__all__ = ["ROOT", "BlockId", "block_chain", "check_hash", "hash_block", "BlockLayout", "ReadTicket", "StorageNIC",
           "MANIFEST", "BlockStore", "BlockRead", "Entry", "FingerprintMismatch", "StoreError", "local_spec",
           "COUNTERS", "IO", "SLOT_BITS", "FORMAT_VERSION", "StoreLocation", "locate", "store_exists"]
