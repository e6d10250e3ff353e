"""TensorStore-backed KV block store with per-host storage NIC models. Knows nothing of JAX or MPI."""

from kvstore.errors import FingerprintMismatch, StoreError
from kvstore.hashing import ROOT, BlockId, block_chain, check_hash, hash_block
from kvstore.layout import BlockLayout
from kvstore.reads import BlockRead
from kvstore.snic import ReadTicket, StorageNIC
from kvstore.store import COUNTERS, FORMAT_VERSION, MANIFEST, SLOT_BITS, BlockStore, local_spec

__all__ = ["ROOT", "BlockId", "block_chain", "check_hash", "hash_block", "BlockLayout", "ReadTicket", "StorageNIC",
           "MANIFEST", "BlockStore", "BlockRead", "FingerprintMismatch", "StoreError", "local_spec", "COUNTERS",
           "SLOT_BITS", "FORMAT_VERSION"]
