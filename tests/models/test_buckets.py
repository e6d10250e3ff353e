"""Shape buckets keep a long multi-turn run down to a handful of compiled prefill programs."""

import numpy as np

import models

BLOCK = 64


def test_thirty_turn_agentic_run_compiles_at_most_ten_prefill_programs():
    cfg = models.get_config("small")
    params = models.init_params(cfg, seed=0)
    rng = np.random.default_rng(0)
    before = models.compile_counts()
    context = np.zeros((1, 0), np.int32)
    cached = None  # KV of the full blocks of the context, as a store would hold it
    for _ in range(30):
        append = rng.integers(0, cfg.vocab, (1, int(rng.integers(32, 160))))
        generated = rng.integers(0, cfg.vocab, (1, 32))  # stands in for the turn's output
        hit = 0 if cached is None else cached.shape[2]
        prompt = np.concatenate([context, append], axis=1)
        _, kv = models.prefill(params, cfg, prompt[:, hit:], cached)
        full = np.concatenate([cached, kv], axis=2) if cached is not None else kv
        context = np.concatenate([prompt, generated], axis=1)
        cached = full[:, :, : (prompt.shape[1] // BLOCK) * BLOCK]
    after = models.compile_counts()
    compiled = after["prefill"] - before["prefill"]
    assert context.shape[1] > 4000  # the run really crossed several prefix buckets
    print(f"prefill programs compiled over 30 turns: {compiled}")
    assert 1 <= compiled <= 10, compiled
