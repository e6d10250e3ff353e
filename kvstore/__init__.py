"""TensorStore-backed KV block store with per-host storage NIC models. Knows nothing of JAX or MPI."""

from kvstore.hashing import ROOT, BlockId, block_chain, check_hash, hash_block
from kvstore.layout import BlockLayout
from kvstore.snic import ReadTicket, StorageNIC
from kvstore.store import MANIFEST, BlockStore, FingerprintMismatch, StoreError, local_spec

__all__ = ["ROOT", "BlockId", "block_chain", "check_hash", "hash_block", "BlockLayout", "ReadTicket", "StorageNIC",
           "MANIFEST", "BlockStore", "FingerprintMismatch", "StoreError", "local_spec"]
