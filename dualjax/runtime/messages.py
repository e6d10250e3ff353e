"""Typed messages between ranks. Control messages are small frozen dataclasses (pickled, high
priority); `LayerKV` carries one layer's KV for a token range as a NumPy array (low priority,
sent in bounded chunks by the MPI transport). A message class with `bulk = True` travels on the
low-priority lane, in order with the KV before it: `PrefillDone` ends a request's KV stream and
must never overtake it."""

from __future__ import annotations

import dataclasses

import numpy as np

from dualjax.core.policies import Plan


@dataclasses.dataclass(frozen=True)
class Request:
    """One turn of one agent: its whole prompt and how many tokens to generate."""

    id: int
    agent: int
    turn: int
    tokens: np.ndarray = dataclasses.field(repr=False)  # [S] int32
    gen_len: int
    arrival: float

    @property
    def prompt_len(self) -> int:
        return int(self.tokens.shape[0])


@dataclasses.dataclass(frozen=True)
class Assign:
    """Rank 0 -> PE and DE: who serves `request` and its plan: of its `stored_blocks` leading blocks in
    the store, the first `hit_blocks` are loaded (the DE reads the first `de_blocks` of them and relays
    them, the PE reads the rest) and the others are recomputed with the miss tokens."""

    request: Request
    pe: int
    de: int
    path: str  # "pe" | "de" | "split" | "none" (no store): the request table's label
    hit_blocks: int
    layerwise: bool
    scheduled: float
    de_blocks: int = 0
    stored_blocks: int = 0
    deadline_s: float | None = None  # the plan's read deadline, seconds after placement (layerwise only)
    read_by: float | None = None  # that deadline on the reading host's storage NIC clock, set on receipt

    def reads(self, role: str) -> int:
        """Hit blocks the host of `role` ("prefill" or "decode") reads from storage."""
        return self.de_blocks if role == "decode" else self.hit_blocks - self.de_blocks

    @classmethod
    def placed(cls, d, request: Request, path: str, layerwise: bool, scheduled: float) -> Assign:
        """The runtime's one translation of a scheduler decision `d` (`dualjax.core.scheduler.Decision`)
        and its plan (`dualjax.core.policies.Plan`, in tokens) into blocks of T = the request view's
        `block_tokens` (every count is whole blocks): `stored_blocks` = hit_tokens / T (what the store
        holds), `hit_blocks` = `Plan.loaded` / T = (hit_tokens - recompute_tokens) / T, `de_blocks` =
        de_tokens / T; the plan's `deadline_s` only layerwise (Basic loads its batches whole). `plan`
        translates back. The simulator's translation is `dualjax.sim.prefill.Row.placed`."""
        r, plan, T = d.request, d.plan, d.request.block_tokens
        return cls(request, d.pe, d.de, path, plan.loaded(r) // T, layerwise, scheduled, plan.de_tokens // T,
                   r.hit_tokens // T, plan.deadline_s if layerwise else None)

    def plan(self, block_tokens: int) -> Plan:
        """The plan this assignment carries, back in tokens (`placed`'s inverse)."""
        T = block_tokens
        return Plan(self.de_blocks * T, (self.stored_blocks - self.hit_blocks) * T, self.deadline_s)


@dataclasses.dataclass(frozen=True)
class Ready:
    """The receiving side of the bulk KV has reserved its buffer for `request_id`."""

    request_id: int


@dataclasses.dataclass(frozen=True)
class LayerKV:
    """Layer `layer` of a request's KV for tokens [start, start + kv.shape[0]).

    `valid` (DE -> PE relays) is how many leading hit blocks are still good after this layer.
    """

    request_id: int
    layer: int
    start: int
    kv: np.ndarray = dataclasses.field(repr=False)  # [n, 2, K, H]
    valid: int = -1
    bulk = True


@dataclasses.dataclass(frozen=True)
class PrefillDone:
    request_id: int
    hit_blocks: int  # blocks actually used (fewer than assigned when a read failed)
    first_token: int
    times: dict
    bulk = True  # after the request's last LayerKV, on the same lane


@dataclasses.dataclass(frozen=True)
class Complete:
    """DE -> rank 0: a request finished; its blocks are in the store."""

    request_id: int
    tokens: list[int]
    hit_blocks: int
    times: dict


@dataclasses.dataclass(frozen=True)
class StatsRequest:
    pass


@dataclasses.dataclass(frozen=True)
class Shutdown:
    pass


@dataclasses.dataclass(frozen=True)
class EngineState:
    """Host -> rank 0: its node's storage read queue (queued at the NIC or waiting for buffer room)."""

    rank: int
    read_q_tokens: int


@dataclasses.dataclass(frozen=True)
class PrefillFinished:
    """PE -> rank 0: the request's prefill is done (its tokens leave the PE's load)."""

    request_id: int


@dataclasses.dataclass(frozen=True)
class KvIn:
    """DE -> rank 0: the request's prompt KV moved from the DE buffer into a decode slot (device memory):
    with resident DE memory (`de_memory`) its prompt + generation tokens leave the DE's free memory now."""

    request_id: int


@dataclasses.dataclass(frozen=True)
class Warm:
    """Host -> rank 0: start-up done (model, store, profile, programs compiled); the run's clock may start."""

    rank: int
    startup_s: float  # from the host's creation to now
    compile_s: float  # of which compiling the workload's programs
    prefill_tokens_per_s: float | None = None  # a PE's profile (`startup.prefill_tokens_per_s`), for the thresholds
    pack_fit: tuple[float, float, float] | None = None  # a PE's packing fit (`AttentionFit`), for the policies
