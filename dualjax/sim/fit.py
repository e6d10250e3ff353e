"""The calibration of `paper-h800`: three inputs fitted to three figures of the paper, nothing else.

* `prefill_half_tokens` on the shape of the paper's Fig. 3 (right): a PE's prefill token throughput
  with 5 and 10 requests per pass against one (30K cached, 300 appended tokens each), 2.55x and 2.95x.
  Only the shape: the ratio does not depend on the prefill efficiency (`fig3_ratios`).
* `efficiency` (of H800 peak, prefill and decode compute) on DualPath's JCT, and `snic_efficiency`
  (storage reads delivered over the storage NIC's line rate) on the ablation's + layerwise step's JCT,
  both at 2P4D x 2,048 agents of paper-64k on DeepSeek-V3.2 (the paper's ablation figure: about
  5,450 s and 8,750 s). + layerwise reads on the PE side only, so its storage rate binds there; its
  stalls are the simulator's own (the loading discipline, `dualjax.sim.prefill`), not part of the fit.

Each JCT is matched in turn by a secant in log space (JCT ~ value^-k, k re-estimated from the last
two runs) until both are within `tolerance`; the two interact, so the pair is repeated until neither
moves. Every other input is physical, stated or assumed (docs/simulator.md). `fit_paper` returns the
fit file `dualjax sim fit` writes (`profiles.PAPER_FIT`, read by the `paper-h800` preset).
"""

from __future__ import annotations

import dataclasses
import math
import time

import scipy.optimize

from dualjax.core.config import ClusterSpec, SimConfig
from dualjax.sim.ablation import step_report
from dualjax.sim.engine import ep_groups
from dualjax.sim.profiles import FITTED, Hardware, ModelCost, model_cost
from dualjax.sim.resources import Costs

POINT = SimConfig(ClusterSpec(2, 4), workload="paper-64k", model="deepseek-v3.2", agents=2048)
# A physical figure to read the fitted storage rate against: DeepSeek's 3FS README reports KV-cache read peaks
# of about 40 GiB/s per client node with one 400 Gbps NIC.
THREEFS_CLIENT_PEAK_BYTES_PER_S = 40 * 2**30
TARGETS = {"layerwise_jct_s": 8750.0, "dualpath_jct_s": 5450.0, "fig3": {5: 2.55, 10: 2.95}}
FIG3_CACHED, FIG3_NEW = 30_000, 300
BOUNDS = {"efficiency": (1e-3, 1.0), "snic_efficiency": (1e-3, 1.0)}


def fig3_ratios(hw: Hardware, model: ModelCost, pe_nodes: int, batches=(5, 10)) -> dict[int, float]:
    """A PE's prefill token throughput with b rows of (30K cached, 300 new) per pass over one row's: a pass
    is its compute at the batch's efficiency overlapped with its EP all-to-all, as `_member_pass` times it."""
    costs = Costs(hw, model, 1, pe_ep=pe_nodes * hw.gpus_per_node)

    def per_token(b: int) -> float:
        compute = costs.pass_seconds([(FIG3_CACHED, FIG3_NEW)] * b)
        return max(compute, costs.ep_bytes(b * FIG3_NEW, pe_nodes) / hw.cnic_bytes_per_s) / (b * FIG3_NEW)
    return {b: per_token(1) / per_token(b) for b in batches}


def fit_half(hw: Hardware, model: ModelCost, pe_nodes: int, target: dict[int, float]) -> float:
    """`prefill_half_tokens` whose Fig. 3 ratios are nearest `target` (least squares on relative errors)."""
    def loss(half: float) -> float:
        got = fig3_ratios(dataclasses.replace(hw, prefill_half_tokens=half), model, pe_nodes, tuple(target))
        return sum((got[b] / t - 1) ** 2 for b, t in target.items())
    return float(scipy.optimize.minimize_scalar(loss, bounds=(0.0, 1e5), method="bounded",
                                                options={"xatol": 0.01}).x)


class Fitter:
    """Runs the simulations of a fit and keeps every one (`runs`)."""

    def __init__(self, cfg: SimConfig, log=print):
        self.cfg, self.log, self.runs = cfg, log, []

    def jct(self, hw: Hardware, step: str) -> float:
        t0 = time.perf_counter()
        r = step_report(self.cfg, step, hw)
        self.runs.append({"step": step, **{k: getattr(hw, k) for k in FITTED}, "jct_s": r["jct_s"],
                          "wall_s": time.perf_counter() - t0})
        self.log(f"  {step:10s} " + "  ".join(f"{k} {getattr(hw, k):.5g}" for k in FITTED)
                 + f"  ->  JCT {r['jct_s']:9.1f} s  ({time.perf_counter() - t0:.0f} s)")
        return r["jct_s"]

    def solve(self, hw: Hardware, name: str, step: str, target: float, tolerance: float,
              iterations: int = 8) -> tuple[Hardware, float]:
        """`hw` with `name` set so that `step`'s JCT is within `tolerance` of `target`: a secant on
        log JCT against log value (JCT falls as either efficiency rises), k = 1 to start."""
        lo, hi = BOUNDS[name]
        x, y = getattr(hw, name), self.jct(hw, step)
        k, prev = 1.0, None
        for _ in range(iterations):
            if abs(y / target - 1) <= tolerance:
                break
            if prev is not None and prev[0] != x and prev[1] != y:
                k = min(4.0, max(0.1, -math.log(y / prev[1]) / math.log(x / prev[0])))
            prev = (x, y)
            x = min(hi, max(lo, x * (y / target) ** (1 / k)))
            hw = dataclasses.replace(hw, **{name: x})
            y = self.jct(hw, step)
        return hw, y


def physical(hw: Hardware) -> dict:
    """The fitted rates as physical figures beside published ones: the storage read rate per node against 3FS's
    reported client peak, and the compute fraction of the GPU's bf16 peak. A fit that needs an implausible value
    points at a mechanism the simulator gets wrong, not at a number to keep."""
    snic = hw.snic_bytes_per_s * hw.snic_efficiency
    return {"snic_gbs_per_node": snic / 1e9, "snic_line_gbs_per_node": hw.snic_bytes_per_s / 1e9,
            "threefs_client_peak_gbs": THREEFS_CLIENT_PEAK_BYTES_PER_S / 1e9,
            "snic_over_threefs_peak": snic / THREEFS_CLIENT_PEAK_BYTES_PER_S,
            "compute_fraction_of_bf16_peak": hw.efficiency, "bf16_peak_tflops_per_gpu": hw.flops_per_s / 1e12}


def fit_paper(start: Hardware, cfg: SimConfig = POINT, targets: dict = TARGETS, tolerance: float = 0.01,
              rounds: int = 4, log=print) -> dict:
    """The three fitted inputs of `start` (a profile with the physical, stated and assumed inputs), the
    JCTs and Fig. 3 ratios they reach, and every run behind them: the fit file's contents."""
    t0 = time.perf_counter()
    targets = {**targets, "fig3": {int(b): v for b, v in targets["fig3"].items()}}  # batch sizes (JSON: strings)
    model = model_cost(cfg.model)
    pe_nodes = ep_groups(cfg.cluster.prefill, start.gpus_per_node, start.ep_gpus)[0]
    fitter, hw = Fitter(cfg, log), start
    for r in range(rounds):
        hw = dataclasses.replace(hw, prefill_half_tokens=fit_half(hw, model, pe_nodes, targets["fig3"]))
        log(f"round {r + 1}: prefill_half_tokens {hw.prefill_half_tokens:.1f} (Fig. 3 shape)")
        before = tuple(getattr(hw, k) for k in FITTED)
        hw, dual = fitter.solve(hw, "efficiency", "dualpath", targets["dualpath_jct_s"], tolerance)
        hw, layer = fitter.solve(hw, "snic_efficiency", "layerwise", targets["layerwise_jct_s"], tolerance)
        if tuple(getattr(hw, k) for k in FITTED) == before:  # both JCTs were within tolerance as they were
            break
    else:  # out of rounds while still moving: DualPath's JCT at the values reached
        dual = fitter.jct(hw, "dualpath")
    achieved = {"dualpath_jct_s": dual, "layerwise_jct_s": layer,
                "fig3": fig3_ratios(hw, model, pe_nodes, tuple(targets["fig3"]))}
    return {"profile": start.name, "fitted": {k: getattr(hw, k) for k in FITTED},
            "physical": physical(hw), "targets": targets, "achieved": achieved, "tolerance": tolerance,
            "point": {"cluster": cfg.cluster.name, "agents": cfg.agents, "workload": cfg.workload,
                      "model": cfg.model, "turns": cfg.turns},
            "runs": fitter.runs, "wall_s": time.perf_counter() - t0}
