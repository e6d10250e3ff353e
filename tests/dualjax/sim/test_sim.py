"""The simulator: hand-worked timelines, the paper's cost model, its claims at small scale, the CLI."""

import dataclasses
import json
import math
import os

import numpy as np
import pytest

from dualjax.cli.main import main
from dualjax.core.batching import Work, pack
from dualjax.core.config import ClusterSpec, SimConfig
from dualjax.sim import SimError, Simulation, build, simulate
from dualjax.sim.engine import _slowdowns
from dualjax.sim.profiles import PAPER_H800, Hardware, ModelCost, model_cost
from dualjax.sim.resources import Buffer, Costs, DepthLink, FifoLink, Lane, PassTable, carry_model
from tests.dualjax.core.trace_fixtures import write_jsonl

# A machine where every cost is a round number: prefill 1 ms per new token, decode 10 ms per step,
# storage 1 MB/s, free transfers; a model of 4 layers and 1,000 bytes of KV per token.
TOY_HW = Hardware("toy", gpus_per_node=1, snic_bytes_per_s=1e6, cnic_bytes_per_s=math.inf, kv_share=1.0,
                  dram_bytes_per_s=math.inf, pe_buffer_bytes=1e9, de_buffer_bytes=1e9, hbm_bytes=math.inf,
                  hbm_bytes_per_s=math.inf, flops_per_s=math.inf, efficiency=1.0, decode_batch=8, padded=True,
                  prefill_fit=(0.0, 1e-3, 0.0), decode_fit=(0.01, 0.0))
TOY_MODEL = ModelCost("toy", n_layers=4, kv_bytes_per_token=1000, linear_flops=0.0, attn_flops=0.0)


def toy(policy: str, append=(100, 20), gen=(5, 5)) -> Simulation:
    cfg = SimConfig(ClusterSpec(1, 1), hardware="toy", model="toy", policy=policy)
    return Simulation(cfg, TOY_HW, TOY_MODEL, [np.array(append)], [np.array(gen)], np.zeros(1), progress=False).run()


def test_basic_timeline_by_hand():
    # Turn 0: 100 new tokens -> prefill 0.1 s, first token at 0.1, 4 decode steps -> done at 0.14.
    # Turn 1: context 105 -> hit 64 tokens (one full block stored; 104 tokens have KV), prompt 125, miss 61.
    # Basic reads 64,000 bytes at 1 MB/s (0.064 s) and only then computes 0.061 s; 4 steps: done at 0.305.
    # TTST is the second token's time less the first's: one decode step.
    c = toy("basic").columns()
    assert c["hit_tokens"].tolist() == [0, 64] and c["prompt_tokens"].tolist() == [100, 125]
    assert c["first_token"][0] == pytest.approx(0.1) and c["done"][0] == pytest.approx(0.14)
    assert c["prefill_start"][1] == pytest.approx(0.204) and c["done"][1] == pytest.approx(0.305)
    assert c["tpot"][1] == pytest.approx(0.01) and c["ttst"][1] == pytest.approx(0.01)


def two_agents(hw=TOY_HW, **settings) -> Simulation:
    """Two agents of the Basic timeline above, both starting at 0."""
    cfg = SimConfig(ClusterSpec(1, 1), hardware="toy", model="toy", policy="basic", **settings)
    return Simulation(cfg, hw, TOY_MODEL, [np.array([100, 20])] * 2, [np.array([5, 5])] * 2, np.zeros(2),
                      progress=False).run()


def test_basic_loads_a_batch_only_when_the_last_one_computed_by_hand():
    # basic_ahead 0: a PE loads a batch, computes it, then loads the next. Turn 0: agent 0's batch computes
    # 0-0.1; agent 1's is formed when it ends and computes 0.1-0.2. Agent 0's turn 1 (at 0.14) waits for that
    # pass: formed at 0.2, read 0.2-0.264, computed 0.264-0.325; agent 1's turn 1 (at 0.24) then waits for it:
    # read 0.325-0.389. One batch ahead, the reads start as the turns arrive: 0.14-0.204 and 0.24-0.304.
    assert two_agents().columns()["prefill_start"] == pytest.approx([0.0, 0.1, 0.264, 0.389])
    assert two_agents(basic_ahead=1).columns()["prefill_start"] == pytest.approx([0.0, 0.1, 0.204, 0.304])
    assert two_agents().pe_summary()["load_wait_s"]["mean"] == pytest.approx((0 + 0.1 + 0.06 + 0.085) / 4)


def test_a_measured_profile_packs_on_attention_time_by_hand():
    # The fit of a measured profile: 1e-6 s x new x (cached + new/2) of attention + 1 ms per new token. Three
    # agents of one turn, 200 new tokens each: a row's attention is 1e-6 x 200 x 100 = 0.02 s over the model's
    # 4 layers, 5 ms per layer; the whole row 0.22 s. Agent 0 starts a pass alone (0-0.22 s); agents 1 and 2
    # wait for it. The quota (12 ms) bounds one attention layer, 2 x 5 ms: both go into the next padded pass,
    # 2 x 0.22 s, ending at 0.66. A quota on all layers' attention (2 x 20 ms > 12 ms) or on the whole row would
    # run agent 1 alone.
    hw = dataclasses.replace(TOY_HW, prefill_fit=(1e-6, 1e-3, 0.0))
    cfg = SimConfig(ClusterSpec(1, 1), hardware="toy", model="toy", policy="basic", compute_quota_ms=12.0)
    sim = Simulation(cfg, hw, TOY_MODEL, [np.array([200])] * 3, [np.array([5])] * 3, np.zeros(3), progress=False)
    c = sim.run().columns()
    assert c["prefill_start"] == pytest.approx([0.0, 0.22, 0.22])
    assert c["first_token"] == pytest.approx([0.22, 0.66, 0.66])
    assert sim.pe_summary()["passes"] == 2


def test_beta_rates_a_pass_of_the_rows_the_quota_admits():
    # beta's pass holds as many of the workload's typical rows (102 cached, 200 new: 40.4 ms of attention over
    # the 4 layers, 10.1 ms per layer) as `pack` admits whole under a 50-ms quota on one layer: 4 rows (a quota
    # on all four layers' attention would admit 1). Passes of more tokens run at a higher rate (half of the
    # saturated rate at 800 new tokens), so the rows change beta.
    hw = dataclasses.replace(TOY_HW, prefill_fit=(1e-6, 1e-3, 0.0), prefill_half_tokens=800)
    cfg = SimConfig(ClusterSpec(1, 1), hardware="toy", model="toy", policy="basic", compute_quota_ms=50.0)
    sim = Simulation(cfg, hw, TOY_MODEL, [np.array([200])] * 8, [np.array([5])] * 8, np.zeros(8), progress=False)
    packed = pack([Work(i, 102, 200) for i in range(16)], sim.costs, 0.05, cfg.prefill_chunk, padded=hw.padded,
                  layers=TOY_MODEL.n_layers)
    rows = sum(n == 200 for _, n in packed)
    assert rows == 4
    rate = rows * 200 / sim.costs.pass_seconds([(102, 200)] * rows)
    assert sim.scheduler.th.beta_tokens == pytest.approx(5 * rate * (102 + 200) / 200)


def test_beta_rates_a_pass_of_at_most_one_row_per_agent(tmp_path):
    # one agent of two 10-token turns (typical row: 12 cached, 10 new): the quota would admit millions of
    # such rows; beta's pass holds one
    path = write_jsonl(str(tmp_path / "short.jsonl"), [{"turns": [{"append_len": 10, "gen": 2}] * 2}])
    sim = build(SimConfig(ClusterSpec(1, 1), model="tiny", workload=path), progress=False)
    rate = 10 / sim.costs.pass_seconds([(12, 10)])
    assert sim.scheduler.th.beta_tokens == pytest.approx(5 * rate * (12 + 10) / 10)
    assert sim.run().columns()["done"].size == 2


def test_a_fit_without_attention_term_puts_no_quota_on_the_batch():
    # a = 0 (TOY_HW: 1 ms per new token, nothing else): no attention time, so the quota never binds and
    # 1,000 new tokens go in one pass of 1 s (a quota on the whole row would cut them into 300-token chunks).
    # beta rates a one-row pass: 5 s x 1,000 tok/s x (cached + new) / new at the workload's typical row,
    # 1,000 new over (1,000 + 5) / 2 = 502 cached.
    sim = Simulation(SimConfig(ClusterSpec(1, 1), hardware="toy", model="toy", policy="basic"), TOY_HW, TOY_MODEL,
                     [np.array([1000])], [np.array([5])], np.zeros(1), progress=False)
    assert sim.scheduler.th.beta_tokens == pytest.approx(5 * 1000 * 1502 / 1000)
    c = sim.run().columns()
    assert c["prefill_end"][0] == pytest.approx(1.0) and sim.pe_summary()["passes"] == 1


def test_layerwise_overlaps_the_load_by_hand():
    # Layerwise starts at 0.14 with the read: layer l arrives at 0.14 + 0.016 (l+1) and takes 0.061 / 4.
    # The pass ends at max(0.14 + 0.061, 0.14 + 0.016 + 0.061, 0.204 + 0.061 / 4) = 0.21925.
    c = toy("pe-only").columns()
    assert c["prefill_end"][1] == pytest.approx(0.21925) and c["done"][1] == pytest.approx(0.25925)


def test_a_chunked_row_relays_its_de_share_once():
    # Turn 1 hits 64 tokens and computes 241 more in 50-token chunks (5 passes): the DE relays the hit tokens
    # it read once, not the growing prefix at every pass; a PE host sends the prompts' KV to the DE.
    cfg = SimConfig(ClusterSpec(1, 1), hardware="toy", model="toy", policy="de-only", prefill_chunk=50)
    sim = Simulation(cfg, TOY_HW, TOY_MODEL, [np.array([100, 200])], [np.array([5, 5])], np.zeros(1),
                     progress=False).run()
    c, hosts = sim.columns(), sim.host_stats()
    assert sim.pe_summary()["passes"] > 5 and c["de_tokens"].sum() > 0
    assert hosts[1].kv_sent_bytes == c["de_tokens"].sum() * TOY_MODEL.kv_bytes_per_token
    assert hosts[0].kv_sent_bytes == (c["prompt_tokens"] - c["de_tokens"]).sum() * TOY_MODEL.kv_bytes_per_token


def test_de_path_reads_on_the_decode_node():
    sim = toy("de-only")
    hosts = sim.host_stats()
    assert [h.snic.bytes_read for h in hosts] == [0, 64_000]
    assert hosts[1].kv_sent_bytes == 64_000  # relayed to the PE


def test_pass_table_lookups():
    table = PassTable(((1, 256, 0, 0.1), (2, 256, 0, 0.3), (4, 256, 0, 0.5), (1, 256, 512, 0.2), (1, 512, 512, 0.6)))
    assert table(2, 256, 0) == 0.3 and table(3, 256, 0) == pytest.approx(0.4)  # measured; rows in between
    assert table(8, 256, 0) == pytest.approx(1.0)  # more rows than measured: in proportion
    assert table(2, 256, 512) == pytest.approx(0.4)
    # Past the longest prefix / chunk measured: in proportion to new * (prefix + new).
    assert table(1, 256, 1024) == pytest.approx(0.2 * 1280 / 768)
    assert table(1, 1024, 512) == pytest.approx(0.6 * 1024 * 1536 / (512 * 1024))


def test_a_local_pass_takes_the_table_time_of_its_padded_shape():
    # The PE packs with the fit (1 ms per token: both turn-1 chunks fit a 300 ms quota), but a pass
    # takes what the table says for its padded shape, times the hosts' overhead.
    hw = dataclasses.replace(TOY_HW, pass_table=((1, 256, 0, 0.05), (1, 256, 512, 0.08)), prefill_scale=1.5)
    cfg = SimConfig(ClusterSpec(1, 1), hardware="toy", model="toy", policy="basic")
    c = Simulation(cfg, hw, TOY_MODEL, [np.array([100, 20])], [np.array([5, 5])], np.zeros(1),
                   progress=False).run().columns()
    assert c["first_token"][0] == pytest.approx(0.075)  # 1 x 256 x 0, not the fit's 0.1 s
    assert c["prefill_end"][1] - c["prefill_start"][1] == pytest.approx(0.12)  # 1 x 256 x 512


def test_engines_sharing_cores_slow_passes_and_steps_by_their_own_factors():
    hw = dataclasses.replace(TOY_HW, contention=(2.0, 2.5), decode_contention=(1.5,))
    cfg = SimConfig(ClusterSpec(1, 1), hardware="toy", model="toy")
    sim = Simulation(cfg, hw, TOY_MODEL, [np.array([100])], [np.array([5])], np.zeros(1), progress=False)
    pe, de = sim.engines[1], sim.engines[2]
    assert sim._slowdown(pe) == 1.0 and sim._slowdown(de) == 1.0  # nothing else computes
    pe.group.busy, de.n = True, 1
    assert sim._slowdown(pe) == 2.0 and sim._slowdown(de) == 1.5
    assert _slowdowns((2.0, 2.5), 5) == [1.0, 2.0, 2.5, 3.0, 3.5]  # 0 others, the measured, then linear
    assert _slowdowns((), 3) == [1.0, 1.0, 1.0]  # GPUs: nothing shared


def test_fifo_link_and_buffer():
    link = FifoLink(100.0)
    assert link.reserve(0.0, 100) == 1.0 and link.start == 0.0
    assert link.reserve(0.5, 50) == 1.5 and link.start == 1.0
    assert link.reserve(3.0, 100) == 4.0 and link.start == 3.0 and link.busy_s == 2.5
    order = []
    buf = Buffer("PE", 10)
    buf.reserve(6, lambda: order.append("a"))
    buf.reserve(6, lambda: order.append("b"))  # waits for room
    buf.reserve(1, lambda: order.append("c"))  # FIFO: behind b even though it fits
    assert order == ["a"]
    buf.release(6)
    assert order == ["a", "b", "c"] and buf.peak == 7
    with pytest.raises(SimError, match="budget"):
        buf.reserve(11, lambda: None)


def test_kv_gets_what_model_traffic_leaves_of_a_compute_nic():
    # 100 B/s lanes; KV is timed at the rate in force when it is queued.
    tx, rx = Lane(100.0, priority=True, share=0.99), Lane(100.0, priority=True, share=0.99)
    assert tx.reserve(0.0, 100) == 1.0  # no model traffic: the line
    carry_model(tx, rx, 0.75)
    assert tx.reserve(1.0, 100) == 5.0 and rx.reserve(0.0, 25) == 1.0  # a quarter of the line
    carry_model(tx, rx, 1.0)
    assert rx.reserve(1.0, 1) == pytest.approx(2.0)  # priority: KV still gets 1 - share
    carry_model(tx, rx, 0.0)
    assert tx.reserve(5.0, 100) == 6.0 and tx.bytes == 300
    even, other = Lane(100.0, priority=False), Lane(100.0, priority=False)
    carry_model(even, other, 0.9)
    assert even.reserve(0.0, 100) == 2.0  # no priority: an even split while both run
    assert even.model_rate(1.0) == 50.0 and even.model_rate(2.0) == 100.0  # model traffic halved while KV queues


def test_storage_throughput_grows_with_the_reads_outstanding():
    # 100 B/s saturated, half the rate at one read outstanding: a read finding k - 1 others runs at k / (k + 1).
    link = DepthLink(100.0, half=1.0)
    assert link.reserve(0.0, 100) == 2.0 and link.start == 0.0  # alone: 50 B/s
    assert link.reserve(0.0, 100) == 3.5 and link.start == 2.0  # behind one: 2/3 of 100 B/s, after it
    assert link.reserve(5.0, 100) == 7.0 and link.start == 5.0  # both ended: alone again
    assert link.reserve(6.0, 50) == 7.75 and link.start == 7.0 and link.busy_s == 6.25
    # Two equal reads queued together end when they would if re-timed as the queue drains: 100 B at
    # depth 2 (1.5 s), then 100 B at depth 1 (2 s): 3.5 s, as above.
    with pytest.raises(SimError, match="snic_depth_half"):
        DepthLink(100.0, half=-1.0)


def test_storage_queue_depth_in_the_simulation_by_hand():
    # Two agents as in the Basic timeline, one batch loading ahead: turn 0 passes end at 0.1 and 0.2 (one row
    # each), so agent 0's turn 1 reads its 64,000 bytes alone from 0.14: at half of 1 MB/s, 0.128 s (without the
    # curve 0.064 s). Agent 1's read, issued at 0.24 while agent 0's is outstanding, runs at 2/3 of 1 MB/s,
    # 0.096 s, after it: 0.268-0.364.
    def run(hw):
        return two_agents(hw, basic_ahead=1)
    flat, deep = run(TOY_HW), run(dataclasses.replace(TOY_HW, snic_depth_half=1.0))
    assert flat.columns()["prefill_start"][2:] == pytest.approx([0.204, 0.304])
    assert deep.columns()["prefill_start"][2:] == pytest.approx([0.268, 0.364])
    assert deep.columns()["done"][2:] == pytest.approx([0.369, 0.465])  # + 0.061 s of prefill + 4 steps of 10 ms
    assert deep.host_stats()[0].snic.busy_s == pytest.approx(0.224)
    assert deep.scheduler.th == flat.scheduler.th  # alpha from the saturated rate


def test_deepseek_cost_model_reproduces_the_cache_compute_ratio():
    # ../shared/traces/README.md §4: 32,721 reused + 429 new tokens give 21.5 GB of KV per PFLOP.
    m = model_cost("deepseek-v3.2")
    assert m.kv_bytes_per_token == 40_016
    ratio = 32_721 * m.kv_bytes_per_token / 1e9 / (m.prefill_flops(32_721, 429) / 1e15)
    assert ratio == pytest.approx(21.4, abs=0.1)  # 21.5 with the hand-typed 74 GFLOP; 75.0 derived (models.costs)
    dense = model_cost("tiny")  # without a window: attention over every position
    expected = 5 * dense.linear_flops + dense.attn_flops * (11 + 12 + 13 + 14 + 15)
    assert dense.prefill_flops(10, 5) == pytest.approx(expected)


@pytest.fixture(scope="module")
def storage_bound():
    """2P2D of paper-h800 nodes (DeepSeek-V3.2 needs two nodes per expert-parallel group), 64 agents x ~24
    turns of paper-64k: the PE nodes' storage NICs bind."""
    cfg = SimConfig(ClusterSpec(2, 2), workload="paper-64k", agents=64, turns=24, snic_mbps=300)
    return {p: simulate(dataclasses.replace(cfg, policy=p), progress=False) for p in ("basic", "dualpath")} | \
        {"oracle": simulate(dataclasses.replace(cfg, hardware="oracle", snic_mbps=None), progress=False)}


def test_dualpath_uses_both_storage_nics(storage_bound):
    basic, dual, oracle = storage_bound["basic"], storage_bound["dualpath"], storage_bound["oracle"]
    n = basic["requests"]  # 64 agents of up to ~24 turns (each draws its turn count)
    assert basic["paths"] == {"pe": n, "de": 0, "split": 0, "none": 0} and dual["paths"]["pe"] and dual["paths"]["de"]
    assert dual["requests"] == n
    # two NICs instead of one, theory 2; agents' turn counts vary, so the longest ones' tail runs below it
    assert basic["jct_s"] / dual["jct_s"] > 1.35
    assert oracle["jct_s"] < dual["jct_s"]
    assert dual["snic_max_over_avg"] < basic["snic_max_over_avg"]
    assert dual["relay_bytes"] > 0 and basic["relay_bytes"] == 0
    assert 64 * 12 < n < 64 * 36 and basic["hit_rate"] > 0.9


def test_custom_policy_object_runs_in_the_simulator():
    from dualjax.core.policies import Policy

    class Decode(Policy):
        name = "always-de"

        def path(self, request, pe, de):
            return "de"

    r = simulate(SimConfig(ClusterSpec(2, 2), workload="paper-32k", agents=8, turns=4), policy=Decode(),
                 progress=False)
    assert r["policy"] == "always-de" and r["paths"] == {"pe": 0, "de": r["requests"], "split": 0, "none": 0}


def test_the_steady_state_is_the_paper_s_stationarity_rule():
    # Mean TTFT per 150-s window of arrivals: 10 % higher each window, flat from the window ending at 2,400 s
    # on. The first window checked ends at 1,950 s (30 minutes + one window); one is steady once its mean is
    # within 5 % of the mean 30 minutes earlier, so the first is the one whose earlier window is flat too:
    # ending at 2,400 + 1,800 = 4,200 s.
    from dualjax.sim.search import stationary_window
    arrival = np.arange(0.5, 6000.0, 1.0)
    ttft = np.minimum(1.1 ** (arrival // 150), 1.1 ** 15)
    assert stationary_window(arrival, ttft, 1950.0, 6000.0) == [4050.0, 4200.0]
    assert stationary_window(arrival, 1.1 ** (arrival // 150), 1950.0, 6000.0) is None  # never settles
    unfinished = ttft.copy()
    unfinished[arrival > 3000] = np.nan  # an overloaded tail: no first token yet
    assert stationary_window(arrival, unfinished, 1950.0, 6000.0) is None


def test_a_run_stopped_and_resumed_ends_as_one_run():
    cfg = SimConfig(ClusterSpec(2, 2), workload="paper-32k", agents=64, turns=4, aps=0.5, policy="basic")
    whole = build(cfg, progress=False).run().columns()
    parts = build(cfg, progress=False)
    for until in (30.0, 60.0, None):
        parts.run(until)
    for k, v in parts.columns().items():
        assert np.array_equal(v, whole[k], equal_nan=True) if v.dtype.kind == "f" else np.array_equal(v, whole[k]), k


def test_online_capacity_search_scores_the_steady_state():
    from dualjax.sim.search import LOOKBACK_S, WINDOW_S, find_capacity
    cfg = SimConfig(ClusterSpec(2, 2), workload="paper-32k", turns=4, snic_mbps=300)
    result = find_capacity(cfg, start_aps=0.5, steps=1, log=lambda *_: None, reading="attainment")
    assert result["bracketed"]
    trials = {t["aps"]: t for t in result["trials"]}
    best = trials[result["capacity_aps"]]
    assert best["attained"] >= 0.9 and best["window_s"] == result["window_s"]
    assert any(a > result["capacity_aps"] and not (t["stationary"] and t["attained"] >= 0.9)
               for a, t in trials.items())
    for t in trials.values():  # one 150-s window of arrivals, no earlier than 30 minutes + one window in
        if t["stationary"]:
            assert t["window_s"][1] - t["window_s"][0] == WINDOW_S and t["window_s"][1] >= LOOKBACK_S + WINDOW_S
            assert t["ttst_s"]["p50"] > 0  # the second token: the hand-off and a decode step after the first


def test_sim_cli_json_and_report(tmp_path, capsys, monkeypatch):
    out, js = tmp_path / "sim", tmp_path / "sim.json"
    args = ["sim", "--cluster", "2p2d", "--workload", "paper-32k", "--agents", "16", "--turns", "4", "--quiet"]
    monkeypatch.chdir(tmp_path)
    assert main([*args, "--json", str(js)]) == 0 and os.listdir(tmp_path) == ["sim.json"]  # nothing else written
    assert main([*args, "--out", str(out)]) == 0
    r = json.loads(js.read_text())
    for key in ("jct_s", "tokens_per_s", "ttft_s", "tpot_s", "snic_max_over_avg"):
        assert r[key] is not None, key
    assert r["sim"]["events"] > 0 and r["sim"]["wall_s"] > 0
    assert {p.name for p in out.iterdir()} == {"report.json", "requests.parquet", "storage.png", "ttft_cdf.png"}
    assert main(["report", str(out), "--plot", str(tmp_path / "cmp.png")]) == 0  # the real runs' comparison reads it
    assert main(["sim", "--hardware", "nowhere", "--out", str(out)]) == 2
    assert "paper-h800" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [(["--basic-lands", "disk"], "basic_lands must be 'hbm' or 'host'"),
                                           (["--basic-ahead", "-1"], "basic_ahead must be >= 0"),
                                           (["--layerwise-layers", "3"], "layerwise_layers must be 1 or 2")])
def test_bad_loading_settings_are_one_line(tmp_path, capsys, argv, message):
    assert main(["sim", *argv, "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_plan_sweep_recommends_a_split_inside_the_window(tmp_path, capsys):
    js = tmp_path / "plan.json"
    assert main(["plan", "--sweep", "--nodes", "5", "--workload", "paper-32k", "--agents", "24", "--turns", "4",
                 "--json", str(js)]) == 0
    r = json.loads(js.read_text())
    assert [row["cluster"] for row in r["sweep"]] == ["1p4d", "2p3d", "3p2d", "4p1d"]
    # DeepSeek-V3.2's weights need two nodes per expert-parallel group: one-node roles are infeasible
    assert ["infeasible" in row for row in r["sweep"]] == [True, False, False, True]
    assert r["recommended"] in {"2p3d", "3p2d"} and r["min_p_over_d"] == pytest.approx(1 / 7)
    assert all(row["saturating"] in row["utilisation"] for row in r["sweep"] if "infeasible" not in row)
    assert main(["plan", "--sweep", "--nodes", "1"]) == 2


def test_a_request_that_fits_no_engine_is_reported():
    m = model_cost("deepseek-v3.2")  # EP over 16 GPUs: weights + reserve leave 1.5e8 B = 3,120 tokens
    tiny_hbm = dataclasses.replace(PAPER_H800, hbm_bytes=m.weights_per_gpu(16) + 10e9 + 1.5e8)
    with pytest.raises(SimError, match="more than a decode engine holds"):
        simulate(SimConfig(ClusterSpec(2, 2), workload="paper-32k", agents=2, turns=6), hardware=tiny_hbm,
                 progress=False)
    with pytest.raises(SimError, match="no device memory for KV .* over 8 GPUs"):  # one node cannot hold V3.2
        simulate(SimConfig(ClusterSpec(1, 2), workload="paper-32k", agents=2, turns=2), progress=False)


def test_storage_balance_over_the_steady_state():
    from dualjax.core.records import HostStats, SnicStats
    from dualjax.core.report import snic_balance

    def host(series):
        return HostStats(0, "prefill", snic=SnicStats(series=series))
    a = host([(0, 0), (1, 10), (2, 20), (3, 30), (4, 40)])  # 10 bytes in each of 4 windows
    b = host([(0, 0), (1, 0), (2, 10), (3, 20), (4, 20)])  # idle in the first and the last
    assert snic_balance([a, b]) == pytest.approx(1.0)  # windows 1-2: both read 10
    assert snic_balance([a, b], steady=False) == pytest.approx((2 + 1 + 1 + 2) / 4)
    assert snic_balance([a, host([(0, 0), (4, 0)])]) == pytest.approx(2.0)  # one NIC never reads


def test_kv_traffic_raises_tpot_only_without_priority():
    # docs/paper.md §5: model (EP) traffic has priority on the compute NICs, so KV moving through a DE's NIC while
    # it decodes must not lengthen its steps. Each step: 10 ms of compute overlapped with an EP all-to-all
    # of 1.5 MB (one sequence, 2 nodes: half of 1.5e6 x 2 crosses) = 7.5 ms at 100 MB/s: 10 ms. Without
    # priority the all-to-all gets half the NIC while KV is queued there: 15 ms. The steps' cadence runs from
    # the second token (TPOT from the first also spreads the P->D hand-off, which TTST holds, over the tokens).
    hw = dataclasses.replace(TOY_HW, gpus_per_node=1, cnic_bytes_per_s=1e8, decode_batch=1,
                             prefill_fit=(0.0, 1e-4, 0.0), ep_gpus=2, loopbacks=True)
    model = dataclasses.replace(TOY_MODEL, kv_bytes_per_token=20_000, ep_bytes_per_token=1.5e6)
    cfg = SimConfig(ClusterSpec(1, 2), hardware="toy", model="toy", policy="de-only")
    n = 6

    def tpot(priority: bool) -> np.ndarray:
        sim = Simulation(cfg, dataclasses.replace(hw, kv_priority=priority), model,
                         [np.array([2000, 200, 200, 200])] * n, [np.array([20] * 4)] * n, np.arange(n) * 0.25,
                         progress=False).run()
        assert sim.host_stats()[1].kv_sent_bytes > 0  # relays did cross the DEs' NICs
        c = sim.columns()
        return (c["done"] - c["second_token"]) / (c["gen_len"] - 2)

    assert tpot(True) == pytest.approx(np.full(4 * n, 0.010))
    slow = tpot(False)  # the second token's step is timed at its join: the steps re-timed after it add 2 %
    assert slow.max() == pytest.approx(0.015, rel=0.02) and (slow > 0.0101).sum() >= 3


def four_agents(policy: str, hbm_mb: float, **settings) -> Simulation:
    cfg = SimConfig(ClusterSpec(1, 1), hardware="toy", model="toy", policy=policy, pe_hbm_mb=hbm_mb, **settings)
    return Simulation(cfg, TOY_HW, TOY_MODEL, [np.array([100, 20])] * 4, [np.array([5, 5])] * 4, np.zeros(4),
                      progress=False).run()


def test_basic_holds_every_layer_in_device_memory_and_layerwise_does_not():
    # Four agents of two turns; turn 1: prompt 125 tokens (64 hit) = 125 KB of KV with all layers. A PE
    # budget of 0.2 MB holds one such row: Basic batches one row at a time, and roomy it batches more, but
    # either way it loads a batch before computing it. Layerwise prefill holds two layers (2 x 125 KB / 4 per
    # row) and overlaps the reads with compute, so it ends first.
    tight, roomy, layerwise = four_agents("basic", 0.2), four_agents("basic", 100.0), four_agents("pe-only", 0.2)
    t, r = tight.pe_summary(), roomy.pe_summary()
    assert t["hbm_peak_gb"] <= 0.2e-3 < r["hbm_peak_gb"] and t["rows_per_pass"] < r["rows_per_pass"]
    assert layerwise.pe_summary()["hbm_peak_gb"] <= 0.2e-3
    done = [np.nanmax(sim.columns()["done"]) for sim in (tight, roomy, layerwise)]
    assert done[2] < min(done[:2])


def test_layerwise_holding_one_layer_batches_more_rows():
    # 70 KB of device memory: one turn-1 row's two layers (62.5 KB), or two rows' one layer (31.25 KB each).
    two, one = four_agents("pe-only", 0.07), four_agents("pe-only", 0.07, layerwise_layers=1)
    assert two.pe_summary()["rows_per_pass"] == 1.0 < one.pe_summary()["rows_per_pass"]
    assert max(two.pe_summary()["hbm_peak_gb"], one.pe_summary()["hbm_peak_gb"]) <= 0.07e-3


def test_basic_batches_ahead_wait_in_the_pe_buffer_when_they_land_on_the_host():
    # One batch ahead: landing in HBM, device memory holds the batch computing and the one loading; landing
    # in the PE buffer, device memory holds one batch only and the buffer the batch loading.
    hbm, host = four_agents("basic", 100.0, basic_ahead=1), four_agents("basic", 100.0, basic_ahead=1,
                                                                         basic_lands="host")
    one_row = 125 * 1000 / 1e9
    assert hbm.pe_summary()["hbm_peak_gb"] > 2 * one_row and host.pe_summary()["hbm_peak_gb"] <= 2 * one_row
    assert hbm.sim_summary()["pe_buffer_peak_gb"] == 0 < host.sim_summary()["pe_buffer_peak_gb"]


def test_naive_scheduling_packs_every_ready_row():
    # Rows of 200 new tokens: 5 ms of attention per layer each (padded passes). A quota of 6 ms per layer
    # admits one row per pass; without intra-engine scheduling (naive) a pass takes all the rows ready.
    hw = dataclasses.replace(TOY_HW, prefill_fit=(1e-6, 1e-3, 0.0))

    def run(scheduler):
        cfg = SimConfig(ClusterSpec(1, 1), hardware="toy", model="toy", policy="pe-only", compute_quota_ms=6.0,
                        scheduler=scheduler)
        return Simulation(cfg, hw, TOY_MODEL, [np.array([200])] * 3, [np.array([5])] * 3, np.zeros(3),
                          progress=False).run().pe_summary()["passes"]
    assert run("full") == 3 and run("naive") == 2  # naive: agent 0 alone (the others not placed yet), then both


def test_snic_mbps_is_the_delivered_rate():
    # --snic-mbps sets what a node's reads get, as a real host's cap does; without it, line x efficiency.
    cfg = SimConfig(ClusterSpec(2, 2), workload="paper-32k", agents=2, turns=2)
    capped = build(dataclasses.replace(cfg, snic_mbps=100.0), progress=False)
    assert capped.nodes[0].snic.rate == 100e6
    plain = build(cfg, progress=False)
    assert plain.nodes[0].snic.rate == pytest.approx(PAPER_H800.snic_bytes_per_s * PAPER_H800.snic_efficiency)


def test_decode_steps_wait_for_the_ep_latency_floor():
    # DeepEP's low-latency kernels: EP32 dispatch 155 us + combine 273 us per MoE layer (58 in V3.2); EP24 lies
    # halfway (in log2 EP) between EP16's 313 us and EP32's 428 us.
    m = model_cost("deepseek-v3.2")
    costs = Costs(PAPER_H800, m, 1)
    assert m.moe_layers == 58 and costs.ep_latency_s(32) == pytest.approx(58 * 428e-6)
    x = (np.log2(24) - 4)
    assert costs.ep_latency_s(24) == pytest.approx(58 * (313 + 115 * x) * 1e-6)
    assert costs.ep_latency_s(1) == 0.0 and costs.ep_latency_s(1024) == pytest.approx(58 * 554e-6)
    r = simulate(SimConfig(ClusterSpec(2, 4), workload="paper-32k", agents=8, turns=3), progress=False)
    assert r["tpot_s"]["p50"] >= 58 * 428e-6 + PAPER_H800.decode_step_overhead_s  # 4 DE nodes: one EP32 group


def test_each_decode_engine_steps_with_its_own_group_s_weights():
    # 5 DE nodes of 8 GPUs in EP groups of at most 32 GPUs: one group of 3 nodes (EP24) and one of 2 (EP16).
    # A DE's step reads its own group's share of the weights and waits for its own group's EP latency.
    sim = build(SimConfig(ClusterSpec(2, 5), workload="paper-64k", agents=8, turns=2), progress=False)
    assert sorted({d.ep_nodes for d in sim.decoders}) == [2, 3]
    for d in sim.decoders:
        ep = d.ep_nodes * sim.hw.gpus_per_node
        assert d.costs.de_weights == sim.model.weights_per_gpu(ep)
        assert d.ep_floor_s == Costs(sim.hw, sim.model, sim.capacity).ep_latency_s(ep)


def test_a_recorded_trace_sizes_decode_slots_by_its_own_prompts(tmp_path):
    # Mooncake records replay their own prompts (the second shares 6 of its 10 blocks): decode slots hold the
    # longest prompt + output, 5,010 tokens, not the first prompt plus the second's misses (3,500 + 1,928).
    recs = [{"timestamp": 0, "input_length": 3500, "output_length": 10, "hash_ids": list(range(7))},
            {"timestamp": 3000, "input_length": 5000, "output_length": 10, "hash_ids": [*range(6), *range(100, 104)]}]
    path = write_jsonl(str(tmp_path / "mc.jsonl"), recs)
    hw = dataclasses.replace(PAPER_H800, decode_fit=(0.01, 1e-7), decode_batch=1)
    sim = build(SimConfig(ClusterSpec(2, 2), workload=f"mooncake:{path}"), hardware=hw, progress=False)
    assert sim.capacity >= 5010
    assert sim.run().columns()["done"].size == 2


def test_buffer_peaks_are_reported_against_their_budgets():
    r = simulate(SimConfig(ClusterSpec(2, 2), workload="paper-32k", agents=8, turns=3), progress=False)
    s = r["sim"]
    assert s["pe_buffer_budget_gb"] == s["de_buffer_budget_gb"] == 80.0  # paper-h800: 80 GB per node
    assert 0 < s["de_buffer_peak_gb"] <= 80.0
    de = [h for h in r["hosts"] if h["role"] == "decode"]
    assert max(h["buffer_peak_bytes"] for h in de) == pytest.approx(s["de_buffer_peak_gb"] * 1e9)
    assert all(h["buffer_budget_bytes"] == 80e9 for h in r["hosts"])


def test_ablation_cli_writes_every_step(tmp_path):
    js = tmp_path / "ablation.json"
    assert main(["sim", "ablation", "--cluster", "2p2d", "--workload", "paper-32k", "--agents", "8", "--turns", "3",
                 "--json", str(js), "--plot", str(tmp_path / "ablation.png")]) == 0
    r = json.loads(js.read_text())
    steps = {"basic", "layerwise", "dual-path", "dualpath", "oracle"}
    for key in ("jct_s", "vs_basic", "snic_max_over_avg"):
        assert steps <= set(r[key]), key
    assert r["vs_basic"]["basic"] == 0 and r["jct_s"]["oracle"] <= r["jct_s"]["dualpath"] + 1e-9  # I/O free
    assert r["steps"]["dual-path"]["scheduler"] == "naive" and (tmp_path / "ablation.png").exists()


def test_fit_memory_keeps_the_rows_whose_kv_fits():
    # 4 layers, 10 B per token (all layers). Rows (cached, new): (90, 10), (40, 10), (0, 50) = 100, 50, 50
    # tokens. Basic holds all 4 layers: 1,000 + 500 B fit 1,600, the third (2,000) does not. Layerwise
    # holds 2 of 4: 500 + 250 + 250 = 1,000 <= 1,600, all stay. The first row stays even alone over budget.
    from dualjax.core.batching import Work, fit_memory
    plan = [(Work("a", 90, 10), 10), (Work("b", 40, 10), 10), (Work("c", 0, 50), 50)]
    assert [w.key for w, _ in fit_memory(plan, 1600, 10, 4, 4)] == ["a", "b"]
    assert [w.key for w, _ in fit_memory(plan, 1600, 10, 2, 4)] == ["a", "b", "c"]
    assert [w.key for w, _ in fit_memory(plan, 10, 10, 4, 4)] == ["a"]


def test_fig3_fit_recovers_the_half_tokens_behind_its_ratios():
    from dualjax.sim.fit import fig3_ratios, fit_half
    m = model_cost("deepseek-v3.2")
    target = fig3_ratios(dataclasses.replace(PAPER_H800, prefill_half_tokens=500.0), m, 2)
    assert fit_half(PAPER_H800, m, 2, target) == pytest.approx(500.0, rel=1e-3)
    assert target[10] > target[5] > 1  # more rows per pass, more tokens per second


def test_the_fit_reaches_its_targets_and_writes_a_profile(tmp_path):
    # Targets made by a known profile at a small point (2P2D x 192 agents x 12 turns): the fit, started from
    # paper-h800's values, reaches both JCTs within its tolerance, and the fit file is a profile.
    from dualjax.sim.ablation import step_report
    from dualjax.sim.profiles import PAPER_H800_BASE, get_hardware
    cfg = SimConfig(ClusterSpec(2, 2), workload="paper-64k", agents=192, turns=12)
    true = dataclasses.replace(PAPER_H800_BASE, efficiency=0.2, snic_efficiency=0.3, prefill_half_tokens=866.8)
    targets = {"layerwise_jct_s": step_report(cfg, "layerwise", true)["jct_s"],
               "dualpath_jct_s": step_report(cfg, "dualpath", true)["jct_s"], "fig3": {"5": 2.55, "10": 2.95}}
    out = tmp_path / "fit.json"
    assert main(["sim", "fit", "--json", str(out), "--cluster", "2p2d", "--agents", "192", "--turns", "12",
                 "--targets", json.dumps(targets)]) == 0
    fit = json.loads(out.read_text())
    for k in ("layerwise_jct_s", "dualpath_jct_s"):
        assert fit["achieved"][k] == pytest.approx(targets[k], rel=fit["tolerance"])
    assert fit["fitted"]["efficiency"] == pytest.approx(0.2, rel=0.05)  # DualPath is compute-bound here
    assert all(run["jct_s"] > 0 for run in fit["runs"]) and fit["command"].startswith("dualjax sim fit")
    hw = get_hardware(str(out))
    assert hw.efficiency == fit["fitted"]["efficiency"] and hw.pe_buffer_bytes == PAPER_H800_BASE.pe_buffer_bytes


@pytest.mark.slow
def test_sim_paper_quick_writes_every_key_a_table_and_a_figure(tmp_path):
    js = tmp_path / "paper.json"
    assert main(["sim", "paper", "--quick", "--json", str(js), "--md", str(tmp_path / "paper.md"), "--plot",
                 str(tmp_path / "paper.png")]) == 0
    r = json.loads(js.read_text())
    assert set(r["ablation"]) == {"8", "16"} and set(r["ablation"]["16"]) == {"basic", "layerwise", "dual-path",
                                                                              "dualpath", "oracle", "dual-path-queue"}
    assert set(r["capacity_aps_by_reading"]) == {"mean", "attainment"}
    assert r["capacity_aps_by_reading"]["mean"] == r["capacity_aps"]  # the default reading
    assert set(r["attention_max_over_avg"]) == {"dual-path", "dualpath"}
    assert set(r["offline"]) == {"8", "16", "32"} and set(r["offline"]["32"]) == {"dualpath", "basic", "oracle"}
    assert set(r["capacity_aps"]) == {"basic", "dualpath"} and set(r["snic_max_over_avg"]) == {"round-robin",
                                                                                               "dualpath"}
    assert {"ttft_s", "ttst_s", "tpot_s"} <= set(r["online"]) and {"jct_s", "wall_s"} <= set(r["large"])
    assert r["large"]["jct_s"] > 0 and all(v > 0 for v in r["ablation"]["16"].values())
    assert (tmp_path / "paper.md").read_text().count("|") > 50 and (tmp_path / "paper.png").exists()
    assert sorted(os.listdir(tmp_path)) == ["paper.json", "paper.md", "paper.png"]  # nothing else written
