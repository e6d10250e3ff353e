"""The DeepSeek cost model (models.costs over models.deepseek.costs) against hand-worked values for the real
V3.2 shape."""

import subprocess
import sys

import pytest

import models
from models import costs
from models.deepseek import costs as ds_costs
from models.deepseek.config import PRESETS

V32 = PRESETS["deepseek-v3.2"]


def test_linear_flops_by_hand():
    attn = 7168 * 1536 + 1536 * 128 * 192 + 7168 * 576 + 128 * 512 * 256 + 128 * 128 * 7168  # MLA, absorbed
    indexer = 1536 * 64 * 128 + 7168 * 128 + 7168 * 64
    dense, moe = 3 * 7168 * 18432, 7168 * 256 + 3 * 7168 * 2048 * (8 + 1)
    macs = 61 * (attn + indexer) + 3 * dense + 58 * moe + 7168 * 129280
    assert costs.linear_flops_per_token(V32) == 2 * macs == 74_952_212_480


def test_cache_bytes_per_token_layer():
    assert ds_costs.cache_bytes_per_token_layer(V32) == {"latent": 1024, "rope": 128, "indexer": 256}
    fp8 = V32.replace(kv_cache_dtype="fp8")
    assert ds_costs.cache_bytes_per_token_layer(fp8) == {"latent": 512 + 16, "rope": 128, "indexer": 132}
    assert costs.kv_bytes_per_token(fp8) == 61 * 788
    t = costs.cost_terms(fp8)
    assert (t.kv_bytes_per_token, t.indexer_bytes_per_token) == (61 * 656, 61 * 132)
    small = PRESETS["ds-27b"].replace(kv_cache_dtype="fp8")
    assert ds_costs.cache_bytes_per_token_layer(small) == {"latent": 528, "rope": 128, "indexer": 68}


def test_prefill_and_decode_by_hand():
    fp8 = V32.replace(kv_cache_dtype="fp8")
    attn_pair, idx_pair = 61 * 2 * 128 * (512 + 64 + 512), 61 * 2 * 64 * 128
    # 10 new tokens after 3000 cached: each attends to 2048 positions, the indexer scores all of them.
    visible = sum(range(3001, 3011))
    want = 10 * 74_952_212_480 + attn_pair * 10 * 2048 + idx_pair * visible
    assert costs.prefill_flops(fp8, 10, 3000) == pytest.approx(want)
    # Causal below the window: 1 + 2 + ... + 100 positions.
    assert costs.prefill_flops(fp8, 100) == pytest.approx(100 * 74_952_212_480 + (attn_pair + idx_pair) * 5050)
    # The paper's cache-compute ratio (docs/paper.md §1: ~22 GB/PFLOP at 32.7k context, 429-token append).
    ratio = 32_721 * 61 * 656 / 1e9 / (costs.prefill_flops(fp8, 429, 32_721) / 1e15)
    assert ratio == pytest.approx(21.4, abs=0.05)
    assert costs.decode_bytes_per_step(fp8, 9999) == 10_000 * 61 * 132 + 2048 * 61 * 656


def test_param_count_without_jax_matches_declarations():
    for cfg in PRESETS.values():
        assert ds_costs.param_count(cfg) == models.param_count(cfg)
    assert ds_costs.expert_param_count(V32) == 58 * 256 * 3 * 7168 * 2048


def test_costs_import_without_jax():
    code = ("import sys, models, models.costs, models.presets, models.dense.costs, models.deepseek.costs; "
            "models.get_config('ds-27b').cost_terms(); assert 'jax' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)
