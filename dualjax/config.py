"""Run configuration: one frozen dataclass for a cluster and one for a run, validated at start.

Every host builds the same `RunConfig` from the same flags; the store's fingerprint check then
catches a model or layout that does not match an existing store at start-up.
"""

from __future__ import annotations

import dataclasses
import re

class ConfigError(ValueError):
    """A bad flag or config value; the message says which and what is allowed."""


@dataclasses.dataclass(frozen=True)
class ClusterSpec:
    """P prefill hosts and D decode hosts. Rank 0 is the scheduler, then P prefill, then D decode."""

    prefill: int
    decode: int

    def __post_init__(self):
        if self.prefill < 1 or self.decode < 1:
            raise ConfigError(f"a cluster needs at least one prefill and one decode host, got "
                              f"{self.prefill}p{self.decode}d")

    @classmethod
    def parse(cls, text: str) -> "ClusterSpec":
        m = re.fullmatch(r"(\d+)p(\d+)d", text.strip().lower())
        if not m:
            raise ConfigError(f"unknown cluster {text!r}: expected PpDd, e.g. 1p1d, 2p1d, 1p2d")
        return cls(int(m.group(1)), int(m.group(2)))

    @property
    def name(self) -> str:
        return f"{self.prefill}p{self.decode}d"

    @property
    def size(self) -> int:
        return 1 + self.prefill + self.decode

    @property
    def prefill_ranks(self) -> list[int]:
        return list(range(1, 1 + self.prefill))

    @property
    def decode_ranks(self) -> list[int]:
        return list(range(1 + self.prefill, self.size))

    def role(self, rank: int) -> str:
        if rank == 0:
            return "scheduler"
        if rank in self.prefill_ranks:
            return "prefill"
        if rank in self.decode_ranks:
            return "decode"
        raise ConfigError(f"rank {rank} is outside cluster {self.name} ({self.size} ranks)")


@dataclasses.dataclass(frozen=True)
class RunConfig:
    cluster: ClusterSpec
    model: str = "tiny"
    workload: str = "agentic-tiny"
    agents: int | None = None  # None: the workload preset's count
    turns: int | None = None
    policy: str = "dualpath"  # a name from dualjax.policies.POLICIES
    aps: float | None = None  # online mode: agents arrive as a Poisson process at this rate
    layerwise: bool = True  # False: no layerwise prefill for any policy
    use_store: bool = True  # False: the reference run (no store, every prompt recomputed)
    snic_mbps: float | None = None  # per-host storage NIC cap, MB/s
    block_tokens: int = 64
    hash_seed: int = 0
    param_seed: int = 0
    workload_seed: int = 0
    pe_buffer_mb: float = 512.0
    de_buffer_mb: float = 512.0
    decode_slots: int = 8
    prefill_chunk: int = 2048  # most new tokens of one request in one prefill pass (bounds attention memory)
    compute_quota_ms: float = 300.0  # predicted prefill time a PE packs into one pass (PAPER.md §7)
    store: str | None = None  # directory; default <out>/store
    out: str = "runs/latest"
    inject_failure: int | None = None  # test hook: this rank raises on its first request

    def __post_init__(self):
        if self.aps is not None and self.aps <= 0:
            raise ConfigError(f"--aps must be positive, got {self.aps}")
        if self.snic_mbps is not None and self.snic_mbps <= 0:
            raise ConfigError(f"--snic-mbps must be positive, got {self.snic_mbps}")
        if min(self.block_tokens, self.decode_slots, self.prefill_chunk, self.compute_quota_ms) <= 0:
            raise ConfigError("block_tokens, decode_slots, prefill_chunk and compute_quota_ms must be positive")
        for name in ("pe_buffer_mb", "de_buffer_mb"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")

    @property
    def store_dir(self) -> str:
        return self.store or f"{self.out.rstrip('/')}/store"

    def replace(self, **changes) -> "RunConfig":
        return dataclasses.replace(self, **changes)
