"""Typed records that cross module boundaries: what a host reports at the end of a run, a prefill
pass's padded shape, and their JSON forms in `report.json`.

Hosts (real or simulated) build a `HostStats`; the report (`dualjax.core.report`), calibration and
the benchmarks read its fields by name. `to_json` gives the plain-dict form written to report.json,
and `from_json` reads it back (e.g. `dualjax calibrate` reading a run's PE passes).
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True, order=True)
class PassShape:
    """The padded shape a prefill pass computes: rows, padded new tokens, padded prefix tokens."""

    rows: int
    new: int
    prefix: int


@dataclasses.dataclass
class PassTally:
    """Passes of one padded shape on one PE, and the seconds they took."""

    shape: PassShape
    passes: int = 0
    seconds: float = 0.0

    def to_json(self) -> dict:
        return {**dataclasses.asdict(self.shape), "passes": self.passes, "seconds": self.seconds}

    @classmethod
    def from_json(cls, d: dict) -> PassTally:
        return cls(PassShape(d["rows"], d["new"], d["prefix"]), d["passes"], d["seconds"])


@dataclasses.dataclass
class SnicStats:
    """A host's storage NIC: bytes it read, seconds it was busy, when its clock started (wall time)."""

    bytes_read: int = 0
    busy_s: float = 0.0
    wall0: float = 0.0
    cap_bytes_per_s: float | None = None
    series: list[tuple[float, float]] = dataclasses.field(default_factory=list)  # (s, cumulative bytes)


@dataclasses.dataclass(frozen=True)
class StoreCounters:
    """What the KV store saw, per host and summed under report.json's `store`: blocks read and
    verified, bad blocks (corrupt, truncated, missing data: read as misses and recomputed), misses
    (no index entry at read time), index entries invalidated, write-backs that failed (disk full,
    I/O error, permission: blocks left uncached), blocks evicted by the byte budget, and times the
    store's own metadata was found damaged and rebuilt or set aside (each reported by one host)."""

    blocks_read: int = 0
    bad_blocks: int = 0
    misses: int = 0
    invalidated: int = 0
    write_failures: int = 0
    evicted: int = 0
    recovered: int = 0

    @classmethod
    def from_counts(cls, counts: dict) -> StoreCounters:
        return cls(**{f.name: int(counts.get(f.name, 0)) for f in dataclasses.fields(cls)})

    @classmethod
    def total(cls, counts) -> StoreCounters:
        """The sum of several hosts' counters (dicts as StoreStats.counters holds them)."""
        rows = [dataclasses.astuple(cls.from_counts(c)) for c in counts]
        return cls(*(sum(col) for col in zip(*rows))) if rows else cls()

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class StoreStats:
    """What a host's view of the KV store saw."""

    bytes_written: int = 0
    blocks_written: int = 0
    counters: dict[str, int] = dataclasses.field(default_factory=dict)  # misses, bad blocks, evictions, ...


@dataclasses.dataclass
class HostStats:
    """One host's (or simulated node's) end-of-run statistics."""

    rank: int
    role: str  # "prefill" | "decode"
    kv_sent_bytes: int = 0  # KV this host sent (relays from a DE; layer KV from a PE)
    control_sent_bytes: int = 0
    busy_s: float | None = None
    buffer_peak_bytes: int | None = None
    buffer_budget_bytes: int | None = None
    snic: SnicStats | None = None
    store: StoreStats | None = None
    passes: int | None = None  # PE only
    pass_s: float | None = None
    pass_predicted_s: float | None = None
    pass_shapes: list[PassTally] | None = None
    pack_fit: tuple[float, ...] | None = None
    decode_steps: int | None = None  # DE only

    def to_json(self) -> dict:
        """The host's entry in report.json: every key, null where this host (real or simulated) does not
        measure it (the storage series is reported apart)."""
        out = {"rank": self.rank, "role": self.role, "kv_sent_bytes": self.kv_sent_bytes,
               "control_sent_bytes": self.control_sent_bytes,
               "storage_bytes": self.snic.bytes_read if self.snic else 0,
               "bytes_written": self.store.bytes_written if self.store else 0,
               "store": dict(self.store.counters) if self.store is not None and self.store.counters else None}
        for f in ("busy_s", "buffer_peak_bytes", "buffer_budget_bytes", "passes", "pass_s", "pass_predicted_s",
                  "pack_fit", "decode_steps"):
            out[f] = getattr(self, f)
        out["pass_shapes"] = (None if self.pass_shapes is None else
                              [t.to_json() for t in sorted(self.pass_shapes, key=lambda t: t.shape)])
        return out
