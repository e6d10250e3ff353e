"""The P/D ratio window of docs/paper.md §8: which prefill:decode node ratios keep every link within
its bandwidth when hit KV is read on both sides, and (not in the paper) whether the decode nodes'
device memory holds the KV of the requests in flight.

g GPUs per node, each with a compute NIC of B bytes/s; storage NICs of s*B per node; host DRAM
M bytes/s. With r = P/D (nodes), the per-pair traffic gives four constraints:

    PE CNIC writes   s/g * (1 + 1/r) <= 1   ->  r >= s/(g-s)
    DE CNIC reads    s/g * (r + 2)   <= 1   ->  r <= (g-2s)/s
    DE CNIC writes   s/g * (2r + 1)  <= 1   ->  r <= (g-s)/(2s)
    DE DRAM          (3 + 2r) B s    <= M   ->  r <= (M/(Bs) - 3)/2

(the PE CNIC read check 2Bs/g <= B needs s <= g/2). Only hit-KV traffic is counted, and every
storage NIC is taken to read at s*B all the time: use the rate storage delivers, not its line rate.

DE memory (`DeMemory`): a request holds prompt + generation tokens of KV on its DE from placement
to its last token, so N nodes split P + D run only if the D decode nodes hold the requests in flight:

    DE memory        A * L * c <= sum over the D nodes' GPUs of (HBM - weights(ep) - reserve)

c the KV bytes per token (KV and indexer keys, all layers), weights(ep) one GPU's share of the weights
under its expert-parallel group, A the requests in flight (offline: the agents, one request each at
zero tool latency) and L their mean prompt + generation tokens. Not a ratio alone: it bounds D for a
node count, and expert-parallel groups make the capacity uneven in D (so a split inside the ratio
range can still fail it: `Window.violated`).
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction


class HardwareError(ValueError):
    pass


@dataclasses.dataclass(frozen=True)
class DeMemory:
    """The DE-memory constraint for `nodes` nodes: `capacity_tokens[D - 1]` is the KV tokens D decode nodes
    hold (all their GPUs), `demand_tokens` = A * L, the KV of the requests in flight."""
    nodes: int
    demand_tokens: float
    capacity_tokens: tuple[float, ...]  # D = 1 .. nodes - 1

    def __post_init__(self):
        if self.nodes < 2:
            raise HardwareError(f"a prefill/decode split needs at least 2 nodes, got {self.nodes}")
        if len(self.capacity_tokens) != self.nodes - 1:
            raise HardwareError(f"DE memory needs the capacity of 1 .. {self.nodes - 1} decode nodes, "
                                f"got {len(self.capacity_tokens)}")

    def holds(self, decode_nodes: int) -> bool:
        return self.capacity_tokens[decode_nodes - 1] >= self.demand_tokens

    def max_p_over_d(self) -> Fraction:
        """The largest P/D = (nodes - D)/D whose D decode nodes hold the demand."""
        fits = [Fraction(self.nodes - d, d) for d in range(1, self.nodes) if self.holds(d)]
        if not fits:
            raise HardwareError(f"no split of {self.nodes} nodes holds the KV in flight: "
                                f"{self.demand_tokens / 1e6:.2f} M tokens, the decode side of the split holds "
                                f"at most {max(self.capacity_tokens) / 1e6:.2f} M; add nodes or run fewer agents")
        return max(fits)

    def to_json(self) -> dict:
        return {"nodes": self.nodes, "demand_tokens": self.demand_tokens,
                "capacity_tokens": {f"{d}d": c for d, c in enumerate(self.capacity_tokens, 1)}}


@dataclasses.dataclass(frozen=True)
class Window:
    min_p_over_d: Fraction
    max_p_over_d: Fraction
    binding_min: str
    binding: list[str]  # the constraints that set the maximum (ties included)
    upper: dict[str, Fraction]  # every upper bound on P/D, by constraint
    de_memory: DeMemory | None = None

    def violated(self, prefill_nodes: int, decode_nodes: int) -> list[str]:
        """The constraints a split of P prefill and D decode nodes breaks, the tightest first."""
        r = Fraction(prefill_nodes, decode_nodes)
        out = [self.binding_min] if r < self.min_p_over_d else []
        for name, bound in sorted(self.upper.items(), key=lambda kv: kv[1]):
            broken = (not self.de_memory.holds(decode_nodes)) if name == "DE memory" else r > bound
            out += [name] if broken else []
        return out

    def to_json(self) -> dict:
        return {"min_p_over_d": float(self.min_p_over_d), "max_p_over_d": float(self.max_p_over_d),
                "min_p_over_d_fraction": str(self.min_p_over_d), "max_p_over_d_fraction": str(self.max_p_over_d),
                "binding_min": self.binding_min, "binding": self.binding,
                "upper": {k: float(v) for k, v in self.upper.items()},
                "de_memory": self.de_memory.to_json() if self.de_memory else None}


def _decimal(x: float) -> Fraction:
    """A rate as the decimal it stands for, to 12 significant digits (400 * 0.47 is 188, not its
    binary float's 2^-k neighbour; a small rate stays positive)."""
    return Fraction(f"{x:.12g}")


def pd_window(gpus_per_node: int, snic_per_node: float, cnic_gbps: float, dram_gbs: float,
              snic_gbps: float | None = None, de_memory: DeMemory | None = None) -> Window:
    """The P/D window for g GPUs per node, `snic_per_node` storage NICs of `snic_gbps` (default:
    one CNIC's rate) each, compute NICs of `cnic_gbps` per GPU and `dram_gbs` GB/s of host DRAM;
    with `de_memory`, also the splits whose decode nodes hold the KV in flight."""
    values = {"--gpus-per-node": gpus_per_node, "--snic-per-node": snic_per_node, "--cnic-gbps": cnic_gbps,
              "--dram-gbs": dram_gbs, "--snic-gbps": cnic_gbps if snic_gbps is None else snic_gbps}
    for name, v in values.items():
        if not v > 0:
            raise HardwareError(f"{name} must be positive, got {v}")
    g = Fraction(gpus_per_node)
    s = _decimal(snic_per_node) * _decimal(values["--snic-gbps"]) / _decimal(cnic_gbps)  # storage BW in units of B
    if s > g / 2:
        raise HardwareError(f"storage bandwidth s = {s} x B per node exceeds g/2 = {g / 2}: the PE compute NICs "
                            f"could not even read it (2Bs/g <= B fails); add GPUs or use fewer storage NICs")
    bs = _decimal(cnic_gbps) / 8 * s  # GB/s of storage per node
    upper = {"DE CNIC reads": (g - 2 * s) / s, "DE CNIC writes": (g - s) / (2 * s),
             "DE DRAM": (_decimal(dram_gbs) / bs - 3) / 2}
    if de_memory is not None:
        upper["DE memory"] = de_memory.max_p_over_d()
    top = min(upper.values())
    low = s / (g - s)
    if top < low:
        raise HardwareError(f"no feasible P/D ratio: needs >= {low} but the DE side allows at most {top} "
                            f"({min(upper, key=upper.get)}); add DRAM bandwidth or GPUs per node")
    return Window(low, top, "PE CNIC writes", [k for k, v in upper.items() if v == top], upper, de_memory)
