"""Shared fixtures: a 4-device CPU platform (set before JAX starts), full float32 matmuls, and tiny
params built once."""

import jax

jax.config.update("jax_num_cpu_devices", 4)
# Full float32 matmuls on every backend (GPUs default to TF32), so the tests' tolerances hold there too.
jax.config.update("jax_default_matmul_precision", "highest")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import models  # noqa: E402


@pytest.fixture(scope="session")
def tiny():
    cfg = models.get_config("tiny")
    return cfg, models.init_params(cfg, seed=0)


@pytest.fixture
def rng():
    return np.random.default_rng(1234)
