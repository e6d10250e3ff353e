"""What the simulator needs to know about a machine and a model: hardware profiles and cost models.

Hardware (`Hardware`): g engines (GPUs) per node, each node's storage NIC, each GPU's compute NIC
(KV gets what model traffic leaves), host DRAM bandwidth, PE/DE buffer budgets, device memory
and decode limits. Profiles:

* `paper-h800`: the paper's testbed (docs/paper.md §2, §12): 8 GPUs per node, 400 Gbps CNIC per GPU,
  one 400 Gbps storage NIC and 80 GB PE/DE buffers per node; compute from model FLOPs at a fraction of
  H800 peak. Three inputs are fitted by `dualjax sim fit` (`PAPER_FIT`); docs/simulator.md lists all.
* `paper-h800-157`: the same machine with the three inputs fitted to the same figures on `paper-64k-157`
  (Table 2 read per trajectory, docs/workloads.md; `PAPER_FIT_157`), to run with that workload.
* `oracle`: the same GPUs with every storage read, host <-> device copy and P -> D transfer free and no
  host buffers (`free_io`; the paper's upper bound); model traffic keeps its compute NICs.
* `local`: written by `dualjax calibrate` (measured prefill/decode timings, store read rate,
  in-process relay rate) for one engine per host, as the embedded runtime runs here.

Model costs (`ModelCost`): KV bytes per token, FLOPs of prefill (linear + attention, with an
optional sparse window and indexer as in DeepSeek-V3.2) and the bytes a decode step reads. The
`local` profile replaces them by fits measured on this machine.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os

from dualjax.core.paths import local_profile

GB = 1e9


class ProfileError(FileNotFoundError):
    """A hardware profile that is not a preset and not a readable, well-formed profile file."""


@dataclasses.dataclass(frozen=True)
class ModelCost:
    """What a model costs per token. The terms every transfer and decode step multiply by token counts (cache
    bytes, linear FLOPs, expert-parallel bytes) are floats: as ints, their products above 2**30 would be
    multi-digit ints that each use converts anew (the values are the same: every product stays below 2**53)."""

    name: str
    n_layers: int
    kv_bytes_per_token: int  # all layers
    linear_flops: float  # per token
    attn_flops: float  # per (new token x visible position)
    window: int | None = None  # sparse attention: each token attends to at most this many positions
    indexer_flops: float = 0.0  # per (new token x position), over the whole context (DSA indexer)
    indexer_bytes_per_token: float = 0.0  # the indexer's keys: stored, moved and read with the KV
    weight_bytes_per_gpu: float = 0.0  # weights every GPU holds (and a decode step reads): all but routed experts
    expert_weight_bytes: float = 0.0  # routed experts, split over an expert-parallel group
    ep_bytes_per_token: float = 0.0  # expert-parallel dispatch + combine bytes one token moves per forward
    moe_layers: int = 0  # layers with routed experts (an expert-parallel all-to-all each)

    @property
    def cache_bytes_per_token(self) -> float:
        """Every part of a token's per-layer cache, all layers: what storage, buffers and links move."""
        return float(self.kv_bytes_per_token + self.indexer_bytes_per_token)

    def weights_per_gpu(self, ep_gpus: int) -> float:
        """Weight bytes one GPU of an expert-parallel group of `ep_gpus` GPUs holds."""
        return self.weight_bytes_per_gpu + self.expert_weight_bytes / max(1, ep_gpus)

    def prefill_flops(self, cached: int, new: int) -> float:
        return self.prefill_seconds(1.0)(cached, new)

    def prefill_seconds(self, flops_per_s: float):
        """A fast fn(cached, new) -> seconds of prefill at `flops_per_s` (the simulator calls it a lot)."""
        lin, att, idx, w = (self.linear_flops / flops_per_s, self.attn_flops / flops_per_s,
                            self.indexer_flops / flops_per_s, self.window)
        tri_w = w * (w + 1) / 2 if w else 0.0

        def seconds(cached: int, new: int) -> float:
            end = cached + new
            full = (end * (end + 1) - cached * (cached + 1)) / 2  # sum of positions cached+1 .. end
            if w is None or end <= w:
                visible = full
            else:  # sum of min(p, w)
                before = cached * (cached + 1) / 2 if cached <= w else tri_w + (cached - w) * w
                visible = tri_w + (end - w) * w - before
            return new * lin + att * visible + idx * full
        return seconds


def model_cost(name: str, gpus_per_weight_copy: int = 1) -> ModelCost:
    """The cost model of a preset as its family serves it (`models.costs.serving_costs`, from the family's
    own `costs.py`: the served cache layout, FLOPs, weight and routed-expert bytes, expert-parallel traffic)."""
    from models.costs import serving_costs
    from models.presets import get_config
    s = serving_costs(get_config(name))
    t = s.terms
    return ModelCost(name, s.config.n_layers, t.kv_bytes_per_token, float(t.linear_flops), t.attn_flops, t.window,
                     t.indexer_flops, t.indexer_bytes_per_token,
                     weight_bytes_per_gpu=s.weight_bytes / gpus_per_weight_copy,
                     expert_weight_bytes=s.expert_weight_bytes, ep_bytes_per_token=s.ep_bytes_per_token,
                     moe_layers=s.moe_layers)


@dataclasses.dataclass(frozen=True)
class Hardware:
    name: str
    gpus_per_node: int
    snic_bytes_per_s: float  # per node (all its storage NICs)
    cnic_bytes_per_s: float  # per GPU
    kv_share: float  # of a CNIC that KV traffic gets while model traffic runs (docs/paper.md §6: low priority)
    dram_bytes_per_s: float  # per node
    pe_buffer_bytes: float  # per node
    de_buffer_bytes: float
    hbm_bytes: float  # per GPU
    hbm_bytes_per_s: float
    flops_per_s: float  # per GPU, peak
    efficiency: float  # fraction of peak a prefill pass or decode step reaches
    decode_batch: int | None = None  # most sequences one DE decodes at once (None: memory decides)
    padded: bool = False  # prefill passes run rows padded to the batch's longest (CPU) or ragged (GPU)
    hbm_reserve_bytes: float = 0.0  # per GPU, kept for activations and workspace (neither weights nor KV)
    # Storage reads deliver this fraction of the storage NIC's line rate (3FS, PAPER: Basic saturates at
    # ~21-26 GB/s per 50 GB/s node) once enough reads are outstanding.
    snic_efficiency: float = 1.0
    # Queue depth (an assumption, not calibrated): a read that finds k - 1 others outstanding on its node's
    # storage NIC (k with it) runs at k / (k + snic_depth_half) of that rate; 0: every read at the full rate.
    snic_depth_half: float = 0.0
    # A prefill pass of T new tokens runs at efficiency * T / (T + prefill_half_tokens) of peak (0: flat).
    prefill_half_tokens: float = 0.0
    ep_gpus: int = 0  # most GPUs of one expert-parallel group (0: none; engines step alone)
    decode_step_overhead_s: float = 0.0  # per decode step: launch, sync, sampling, scheduling
    # (EP GPUs, dispatch us, combine us) of the low-latency all-to-all kernels a decode step uses: the
    # latency floor of its expert-parallel communication (`Costs.ep_latency_s`); empty: none
    ep_latency_us: tuple[tuple[int, float, float], ...] = ()
    kv_priority: bool = True  # compute NICs give model (EP) traffic priority over KV (docs/paper.md §6)
    # Buffer -> GPU copies go through the compute NIC (a loopback, docs/paper.md §8); False: the embedded runtime,
    # where a host's model reads its buffer in place (`local`).
    loopbacks: bool = False
    # The paper's Oracle (docs/paper.md §10): every storage read, host <-> device copy and P -> D transfer is free,
    # so no KV waits for a host buffer, a storage NIC, host DRAM or a compute NIC; model (EP) traffic still
    # takes its compute NIC's line (`Simulation`).
    free_io: bool = False
    # `local`: every engine shares one machine's cores; a prefill pass runs contention[k - 1] times
    # slower while k other engines compute, a decode step decode_contention[k - 1] (past the last:
    # linear from the last two). Empty: engines have their own compute, as GPUs do.
    contention: tuple[float, ...] = ()
    decode_contention: tuple[float, ...] = ()
    # `local` only: measurements instead of FLOPs.
    # prefill_tokens_per_s: the PE rate the runtime profiles at start-up (its scheduler's beta);
    # prefill_fit: (a, b, c) of the AttentionFit a PE packs its passes with (the runtime's own);
    # pass_table: [rows, padded new, padded prefix, seconds] of the model's padded passes;
    # prefill_scale: what the hosts' passes take over the table's (prefix assembly, sends);
    # decode_fit: seconds per step = d0 + d1 * capacity (fixed-shape steps over the slot capacity).
    prefill_tokens_per_s: float | None = None
    prefill_fit: tuple[float, float, float] | None = None
    pass_table: tuple[tuple[int, int, int, float], ...] | None = None
    prefill_scale: float = 1.0
    decode_fit: tuple[float, float] | None = None
    model: str | None = None  # the model a calibrated profile was measured with
    notes: str = ""

    @property
    def free_storage(self) -> bool:
        return math.isinf(self.snic_bytes_per_s)

    def with_snic(self, bytes_per_s: float | None) -> "Hardware":
        """Storage reads delivered at `bytes_per_s` per node (`--snic-mbps`: the rate itself, as a real host's
        cap is, so the profile's storage efficiency no longer applies); None: the profile's."""
        if bytes_per_s is None:
            return self
        return dataclasses.replace(self, snic_bytes_per_s=bytes_per_s, snic_efficiency=1.0)


H800_PEAK = 989e12  # dense BF16 FLOP/s

# DeepEP's low-latency kernels on H800 with CX7 400 Gb/s InfiniBand, 128 tokens per batch, 7,168 hidden,
# top-8 experts, FP8 dispatch and BF16 combine: (EP GPUs, dispatch us, combine us), as published in
# github.com/deepseek-ai/DeepEP docs/legacy.md ("Low-latency kernels with pure RDMA").
DEEPEP_LOW_LATENCY_US = ((8, 77.0, 114.0), (16, 118.0, 195.0), (32, 155.0, 273.0), (64, 173.0, 314.0),
                         (128, 192.0, 369.0), (256, 194.0, 360.0))

# The physical and stated inputs of `paper-h800`; the three inputs `FITTED` names come from
# `dualjax sim fit` (`PAPER_FIT`); the values here are where a first fit starts.
PAPER_H800_BASE = Hardware(
    "paper-h800", gpus_per_node=8, snic_bytes_per_s=400e9 / 8, cnic_bytes_per_s=400e9 / 8, kv_share=0.99,
    dram_bytes_per_s=500 * GB, pe_buffer_bytes=80 * GB, de_buffer_bytes=80 * GB, hbm_bytes=80 * GB,
    hbm_bytes_per_s=3.35e12, hbm_reserve_bytes=10 * GB, flops_per_s=H800_PEAK, efficiency=0.45,
    snic_efficiency=0.5, prefill_half_tokens=256, ep_gpus=32, decode_step_overhead_s=0.005, loopbacks=True,
    ep_latency_us=DEEPEP_LOW_LATENCY_US,
    notes="docs/simulator.md lists every input with its status and source. Stated: 8 GPUs and one 400 Gbps "
          "storage NIC per node, a 400 Gbps compute NIC per GPU, 80 GB PE/DE buffers per node, 99 % of a "
          "compute NIC to model traffic. Physical: H800 (80 GB HBM at 3.35 TB/s, 989 TF dense BF16), "
          "DeepEP's low-latency all-to-all latencies. Fitted (`dualjax sim fit`): storage efficiency, prefill "
          "efficiency, prefill_half_tokens. Assumed: 500 GB/s host DRAM, 10 GB of HBM per GPU for "
          "activations, expert-parallel groups of up to 32 GPUs, 5 ms of overhead per decode step.")

FITTED = ("snic_efficiency", "efficiency", "prefill_half_tokens")
PAPER_FIT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "paper_h800_fit.json")
# The same three inputs fitted to the same figures with Table 2 read per trajectory (`paper-64k-157`)
PAPER_FIT_157 = os.path.join(os.path.dirname(os.path.abspath(__file__)), "paper_h800_157_fit.json")


def read_fit(path: str) -> dict:
    """A fit file (`dualjax sim fit`): {"profile", "fitted": {input: value}, how it was fitted...}."""
    with open(path) as f:
        d = json.load(f)
    if not isinstance(d, dict) or set(d.get("fitted", ())) != set(FITTED):
        raise ProfileError(f"{path} is not a fit `dualjax sim fit` writes (its 'fitted' must hold {', '.join(FITTED)})")
    return d


def fitted(base: Hardware, fit: dict) -> Hardware:
    """`base` with a fit's values (and where they came from in its notes)."""
    values = fit["fitted"]
    how = ", ".join(f"{k} = {values[k]:.4g}" for k in FITTED)
    return dataclasses.replace(base, **values, notes=f"{base.notes} Fit: {how} ({fit.get('command', '')}).")


def oracle_of(hw: Hardware) -> Hardware:
    """`hw` as the paper's Oracle (docs/paper.md §10): DualPath with every storage read, host <-> device copy
    and P -> D transfer free (`free_io`: no host buffers to take or wait for, no time on a storage NIC, host
    DRAM or a compute NIC for KV). Model traffic keeps the compute NICs' line rate: it is not I/O."""
    return dataclasses.replace(
        hw, name="oracle", snic_bytes_per_s=math.inf, dram_bytes_per_s=math.inf, free_io=True,
        notes=f"{hw.name} with free storage reads, host <-> device copies and P -> D transfers (no host buffers): "
              f"the upper bound of docs/paper.md §10")


PAPER_H800 = fitted(PAPER_H800_BASE, read_fit(PAPER_FIT)) if os.path.exists(PAPER_FIT) else PAPER_H800_BASE
ORACLE = oracle_of(PAPER_H800)
PAPER_H800_157 = dataclasses.replace(fitted(PAPER_H800_BASE, read_fit(PAPER_FIT_157)), name="paper-h800-157")

def get_hardware(name: str) -> Hardware:
    """`paper-h800`, `oracle`, `local` (the profile `dualjax calibrate` wrote), a profile JSON path, or a fit
    file of `dualjax sim fit` (paper-h800 with its values)."""
    if name == "paper-h800":
        return PAPER_H800
    if name == "oracle":
        return ORACLE
    if name == "paper-h800-157":
        return PAPER_H800_157
    path = local_profile() if name == "local" else name
    if not os.path.exists(path):
        hint = ("run `dualjax calibrate` first" if name == "local"
                else "profiles: paper-h800, paper-h800-157, oracle, local, or a JSON file")
        raise ProfileError(f"no hardware profile {name!r} ({path} missing): {hint}")
    try:
        with open(path) as f:
            d = json.load(f)
        if isinstance(d, dict) and "fitted" in d:
            return fitted(PAPER_H800_BASE, read_fit(path))
        for k in ("prefill_fit", "decode_fit"):
            if d.get(k) is not None:
                d[k] = tuple(d[k])
        for k in ("contention", "decode_contention"):  # one number: per other engine (older profiles)
            if isinstance(d.get(k), (int, float)):
                d[k] = (d[k],)
            d[k] = tuple(d.get(k) or ())
        for k in ("pass_table", "ep_latency_us"):
            if d.get(k) is not None:
                d[k] = tuple(tuple(row) for row in d[k])
        return Hardware(**d)
    except OSError as e:
        raise ProfileError(f"hardware profile {path}: {e.strerror}") from None
    except (ValueError, TypeError, AttributeError) as e:  # not JSON, not an object, fields missing or unknown
        raise ProfileError(f"hardware profile {path} is not a profile `dualjax calibrate` writes: {e}") from None


def save_hardware(hw: Hardware, path: str) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(dataclasses.asdict(hw), f, indent=1)
