"""Shared fixtures: a 4-device CPU platform (set before JAX starts), full float32 matmuls, tiny
params built once, and JAX's compile log."""

import logging

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


@pytest.fixture
def compile_log():
    """Every JAX compilation while the test runs, in any thread, as (time, "Compiling jit(name)")."""
    seen: list[tuple[float, str]] = []
    handler = logging.Handler()

    def emit(record):
        if record.getMessage().startswith("Compiling "):
            seen.append((record.created, record.getMessage().split(" with ")[0]))
    handler.emit = emit
    log, was = logging.getLogger("jax"), jax.config.jax_log_compiles
    log.addHandler(handler)
    jax.config.update("jax_log_compiles", True)  # globally: `with jax.log_compiles()` is one thread's
    try:
        yield seen
    finally:
        jax.config.update("jax_log_compiles", was)
        log.removeHandler(handler)
