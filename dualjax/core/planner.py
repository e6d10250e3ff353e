"""The P/D ratio window of docs/paper.md §8: which prefill:decode node ratios keep every link within
its bandwidth when hit KV is read on both sides.

g GPUs per node, each with a compute NIC of B bytes/s; storage NICs of s*B per node; host DRAM
M bytes/s. With r = P/D (nodes), the per-pair traffic gives four constraints:

    PE CNIC writes   s/g * (1 + 1/r) <= 1   ->  r >= s/(g-s)
    DE CNIC reads    s/g * (r + 2)   <= 1   ->  r <= (g-2s)/s
    DE CNIC writes   s/g * (2r + 1)  <= 1   ->  r <= (g-s)/(2s)
    DE DRAM          (3 + 2r) B s    <= M   ->  r <= (M/(Bs) - 3)/2

(the PE CNIC read check 2Bs/g <= B needs s <= g/2). Only hit-KV traffic is counted.
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction


class HardwareError(ValueError):
    pass


@dataclasses.dataclass(frozen=True)
class Window:
    min_p_over_d: Fraction
    max_p_over_d: Fraction
    binding_min: str
    binding: list[str]  # the constraints that set the maximum (ties included)

    def to_json(self) -> dict:
        return {"min_p_over_d": float(self.min_p_over_d), "max_p_over_d": float(self.max_p_over_d),
                "min_p_over_d_fraction": str(self.min_p_over_d), "max_p_over_d_fraction": str(self.max_p_over_d),
                "binding_min": self.binding_min, "binding": self.binding}


def pd_window(gpus_per_node: int, snic_per_node: float, cnic_gbps: float, dram_gbs: float,
              snic_gbps: float | None = None) -> Window:
    """The P/D window for g GPUs per node, `snic_per_node` storage NICs of `snic_gbps` (default:
    one CNIC's rate) each, compute NICs of `cnic_gbps` per GPU and `dram_gbs` GB/s of host DRAM."""
    values = {"--gpus-per-node": gpus_per_node, "--snic-per-node": snic_per_node, "--cnic-gbps": cnic_gbps,
              "--dram-gbs": dram_gbs, "--snic-gbps": cnic_gbps if snic_gbps is None else snic_gbps}
    for name, v in values.items():
        if not v > 0:
            raise HardwareError(f"{name} must be positive, got {v}")
    g = Fraction(gpus_per_node)
    s = Fraction(snic_per_node) * Fraction(values["--snic-gbps"]) / Fraction(cnic_gbps)  # storage BW in units of B
    if s > g / 2:
        raise HardwareError(f"storage bandwidth s = {s} x B per node exceeds g/2 = {g / 2}: the PE compute NICs "
                            f"could not even read it (2Bs/g <= B fails); add GPUs or use fewer storage NICs")
    bs = Fraction(cnic_gbps) / 8 * s  # GB/s of storage per node
    upper = {"DE CNIC reads": (g - 2 * s) / s, "DE CNIC writes": (g - s) / (2 * s),
             "DE DRAM": (Fraction(dram_gbs) / bs - 3) / 2}
    top = min(upper.values())
    low = s / (g - s)
    if top < low:
        raise HardwareError(f"no feasible P/D ratio: needs >= {low} but the DE side allows at most {top} "
                            f"({min(upper, key=upper.get)}); add DRAM bandwidth or GPUs per node")
    return Window(low, top, "PE CNIC writes", [k for k, v in upper.items() if v == top])
