"""The P/D window of docs/paper.md §8 on the paper's worked example and hand-worked cases, and the DE-memory
constraint against the simulator."""

import dataclasses
import json
from fractions import Fraction

import pytest

from dualjax.cli import main as cli
from dualjax.core.config import ClusterSpec, SimConfig
from dualjax.core.planner import DeMemory, HardwareError, pd_window
from dualjax.sim import model_cost, workload_lengths
from dualjax.sim.profiles import PAPER_H800
from dualjax.sim.search import de_memory, sweep_pd


def test_paper_worked_example():
    # g = 8, s = 1, B*s = 50 GB/s (400 Gbit/s), M = 500 GB/s -> 1/7 <= P/D <= 7/2.
    w = pd_window(8, 1, 400, 500)
    assert (w.min_p_over_d, w.max_p_over_d) == (Fraction(1, 7), Fraction(7, 2))
    assert w.binding_min == "PE CNIC writes" and w.binding == ["DE CNIC writes", "DE DRAM"]  # a tie


def test_dram_binds_when_it_is_scarce():
    # M = 300: (300/50 - 3)/2 = 3/2 < (8-1)/2.
    w = pd_window(8, 1, 400, 300)
    assert w.max_p_over_d == Fraction(3, 2) and w.binding == ["DE DRAM"]
    # Two storage NICs (s = 2): lower 2/6 = 1/3, DE CNIC writes (8-2)/4 = 3/2, reads (8-4)/2 = 2,
    # DRAM (1000/100 - 3)/2 = 7/2.
    w = pd_window(8, 2, 400, 1000)
    assert (w.min_p_over_d, w.max_p_over_d, w.binding) == (Fraction(1, 3), Fraction(3, 2), ["DE CNIC writes"])


@pytest.mark.parametrize("args,message", [((8, 5, 400, 500), "exceeds g/2"), ((0, 1, 400, 500), "positive"),
                                          ((8, 1, -1, 500), "positive"), ((8, 1, 400, 100), "no feasible")])
def test_invalid_hardware_is_rejected_with_the_reason(args, message):
    with pytest.raises(HardwareError, match=message):
        pd_window(*args)


def test_plan_command_writes_json(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert cli.main(["plan", "--gpus-per-node", "8", "--snic-per-node", "1", "--cnic-gbps", "400", "--dram-gbs",
                     "500", "--json", str(out)]) == 0
    assert "1/7" in capsys.readouterr().out and '"max_p_over_d_fraction": "7/2"' in out.read_text()
    assert cli.main(["plan", "--snic-per-node", "6"]) == 2 and "g/2" in capsys.readouterr().err


def test_de_memory_bounds_the_decode_side_by_split():
    # 6 nodes, 10 tokens in flight; D = 1..5 decode nodes hold 0, 8, 12, 9, 20 tokens (uneven, as with
    # expert-parallel groups). Holding: D = 3 (P/D 1) and D = 5 (1/5), so DE memory allows P/D <= 1,
    # tighter than the bandwidth's 7/2; 2p4d (1/2) is inside the ratio range but its 4 nodes hold only 9.
    m = DeMemory(6, 10, (0, 8, 12, 9, 20))
    w = pd_window(8, 1, 400, 500, de_memory=m)
    assert (w.max_p_over_d, w.binding) == (Fraction(1), ["DE memory"])
    assert w.violated(3, 3) == [] and w.violated(1, 5) == [] and w.violated(2, 4) == ["DE memory"]
    # 5p1d: P/D 5 > 7/2 (DE CNIC writes and DE DRAM, a tie) but < 7 (DE CNIC reads); 1 node holds nothing
    assert w.violated(5, 1) == ["DE memory", "DE CNIC writes", "DE DRAM"]
    assert pd_window(8, 1, 400, 500).violated(1, 9) == ["PE CNIC writes"]  # 1/9 < 1/7
    with pytest.raises(HardwareError, match="no split of 6 nodes holds"):
        pd_window(8, 1, 400, 500, de_memory=DeMemory(6, 21, (0, 8, 12, 9, 20)))
    with pytest.raises(HardwareError, match="at least 2 nodes"):
        DeMemory(1, 10, ())


def test_de_memory_of_a_simulated_cluster_is_what_its_gpus_hold():
    # paper-h800 with DeepSeek-V3.2: a GPU holds (80 GB - its weights under EP over its group - 10 GB reserve)
    # / (KV + indexer bytes per token); expert-parallel groups of at most 4 nodes (32 GPUs).
    cfg = SimConfig(ClusterSpec(1, 1), workload="paper-32k", agents=8, turns=3)
    m = model_cost(cfg.model)
    per_gpu = {ep: (80e9 - m.weights_per_gpu(ep) - 10e9) // m.cache_bytes_per_token for ep in (16, 24, 32)}
    mem = de_memory(cfg, 7)
    assert mem.capacity_tokens[1:] == (16 * per_gpu[16], 24 * per_gpu[24], 32 * per_gpu[32],
                                       24 * per_gpu[24] + 16 * per_gpu[16], 2 * 24 * per_gpu[24])
    assert mem.capacity_tokens[0] == 0  # one node cannot hold the weights
    append, gen, _, _ = workload_lengths(cfg)  # every agent has one request in flight: prompt + generation
    holds = [sum(append[a][: k + 1]) + sum(gen[a][: k + 1]) for a in range(8) for k in range(len(append[a]))]
    assert mem.demand_tokens == pytest.approx(8 * sum(holds) / len(holds))


def test_a_split_the_planner_says_memory_breaks_is_memory_bound_in_the_simulator():
    # DE GPUs that hold 26k tokens each (EP over 16 GPUs): 2 decode nodes hold 416k tokens, about half the
    # KV in flight of 128 agents; 3 decode nodes (EP over 24 GPUs, lighter weights per GPU) hold far more.
    # The planner counts DE memory reserved from placement (`search.de_memory`): the simulator the same way.
    cfg = SimConfig(ClusterSpec(1, 1), workload="paper-32k", agents=128, turns=3, de_memory="reserved")
    m = model_cost(cfg.model)
    hw = dataclasses.replace(PAPER_H800, hbm_bytes=m.weights_per_gpu(16) + 10e9 + 26_000 * m.cache_bytes_per_token)
    mem = de_memory(cfg, 5, hw)
    assert mem.capacity_tokens[1] == 416_000 and mem.demand_tokens > 1.5 * 416_000 and mem.holds(3)
    w = pd_window(8, 1, 400, 500, snic_gbps=400 * hw.snic_efficiency, de_memory=mem)
    result = sweep_pd(cfg, 5, w, hardware=hw, log=lambda _: None)
    rows = {r["cluster"]: r for r in result["sweep"]}
    assert rows["3p2d"]["planner_violated"] == ["DE memory"] and rows["3p2d"]["saturating"] == "de_memory_peak"
    assert rows["2p3d"]["planner_violated"] == [] and rows["2p3d"]["saturating"] != "de_memory_peak"
    assert result["recommended"] == "2p3d"


def test_plan_sweep_judges_splits_by_the_simulated_clusters_window(tmp_path):
    # --snic-mbps 10000 (per node, the rate delivered, as the simulator takes it): s = 80 / 400 = 1/5 of a CNIC,
    # so the lower bound is s/(8 - s) = 1/39; 24 agents fit 2 decode nodes but not 1, so DE memory allows 3/2
    # (3p2d), far below the bandwidth's (8 - s)/(2s) = 39/2.
    out = tmp_path / "plan.json"
    assert cli.main(["plan", "--sweep", "--nodes", "5", "--workload", "paper-32k", "--agents", "24", "--turns", "2",
                     "--snic-mbps", "10000", "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    w = r["simulated_window"]
    assert (w["min_p_over_d_fraction"], w["max_p_over_d_fraction"], w["binding"]) == ("1/39", "3/2", ["DE memory"])
    assert w["upper"]["DE CNIC writes"] == pytest.approx(39 / 2) and r["max_p_over_d_fraction"] == "7/2"
    assert {row["cluster"]: row["planner_violated"] for row in r["sweep"]}["4p1d"][0] == "DE memory"
