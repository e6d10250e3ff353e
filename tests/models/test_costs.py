"""Every family's serving costs (`models.costs.serving_costs`, from the family's own `costs.py`): what the
simulator asks a family instead of knowing its fields, checked against the declarations and by hand."""

import subprocess
import sys

import pytest

import models
from models import costs
from models.dense import costs as dense_costs

FAMILIES = models.families()


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
def test_serving_costs_of_every_preset_follow_its_served_config(family):
    """Each preset's serving costs are those of the config as served, in the preset's own family; the weights
    held by every GPU and the experts split over a group add up to the declared parameters."""
    for name in models.preset_names():
        cfg = models.get_config(name)
        if cfg.family is not family:
            continue
        s = costs.serving_costs(cfg)
        assert s.config.family is family and s.config.name == cfg.name and s.terms == costs.cost_terms(s.config)
        assert models.param_count(s.config) == models.param_count(cfg)  # served as it is declared: same weights
        assert (s.moe_layers == 0) == (s.expert_weight_bytes == 0) == (s.ep_bytes_per_token == 0)
        bytes_per_param = (s.weight_bytes + s.expert_weight_bytes) / models.param_count(cfg)
        assert bytes_per_param in (1, cfg.jnp_dtype.itemsize)  # FP8 weights, or the config's dtype


def test_dense_serving_costs_by_hand():
    tiny = models.get_config("tiny")  # D 64, N 4, K 2, H 16, F 128, V 256, 2 layers, untied head
    layer = 2 * 64 + 64 * 4 * 16 + 2 * 64 * 2 * 16 + 4 * 16 * 64 + 3 * 64 * 128
    assert dense_costs.param_count(tiny) == 2 * layer + 2 * 256 * 64 + 64 == 106_816
    s = costs.serving_costs(tiny)
    assert (s.weight_bytes, s.expert_weight_bytes, s.ep_bytes_per_token, s.moe_layers) == (106_816 * 4, 0, 0, 0)
    for name in models.preset_names():  # the JAX-free count equals the declarations' for every dense preset
        cfg = models.get_config(name)
        if cfg.family_name() == "dense":
            for variant in (cfg, cfg.replace(qkv_bias=not cfg.qkv_bias, tie_embeddings=not cfg.tie_embeddings)):
                assert dense_costs.param_count(variant) == models.param_count(variant), name


def test_deepseek_serving_costs_by_hand():
    """V3.2: 61 layers, the first 3 dense; 256 routed experts of 3 x 7168 x 2048, top-8; FP8 cache and weights."""
    s = costs.serving_costs(models.get_config("deepseek-v3.2"))
    assert s.config.kv_cache_dtype == "fp8" and s.terms.kv_bytes_per_token == 61 * 656
    assert s.moe_layers == 58 and s.expert_weight_bytes == 58 * 256 * 3 * 7168 * 2048
    assert s.ep_bytes_per_token == 58 * 8 * 7168 * (1 + 2)  # FP8 dispatch + BF16 combine per expert copy
    assert s.weight_bytes + s.expert_weight_bytes == models.param_count(s.config)  # 1 B per parameter


def test_serving_costs_import_without_jax():
    code = ("import sys, models.costs, models.presets as p; "
            f"[models.costs.serving_costs(p.get_config(n)) for n in {[f.tiny_preset for f in FAMILIES]}]; "
            "assert 'jax' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)
