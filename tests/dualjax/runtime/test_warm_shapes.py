"""The passes a run can compute are among the shapes its hosts compile before the clock
(`warmup.warm_shapes`): checked against `batching.pack`, the rule the prefill host packs with, over
random queues of the workload's requests, with a fit under which the compute quota binds and one
under which it cannot. No JAX: shapes only."""

import numpy as np
import pytest

import models
from dualjax.core.batching import AttentionFit, Work, pack
from dualjax.core.config import ClusterSpec, RunConfig
from dualjax.core.lengths import hit_tokens
from dualjax.core.workload import Agent, Turn
from dualjax.runtime.warmup import _agents, _pieces, warm_shapes
from models.buckets import DEFAULT_BUCKETS

BASE = RunConfig(ClusterSpec(1, 1), model="small", workload="agentic-e2e", agents=6, turns=4)
LOOSE = AttentionFit(1e-12, 1e-4, 0.0)  # the quota (300 ms a layer) never binds
TIGHT = AttentionFit(8.7e-7, 5e-4, 0.0)  # `small` on this machine: two first turns fill the quota


def _requests(cfg, model_cfg):
    """(prompt, hit) of every turn of `cfg`'s workload, hitting every full block before it."""
    out = []
    for agent in _agents(cfg, model_cfg):
        ctx = 0
        for turn in agent.turns:
            prompt = ctx + len(turn.append)
            out.append((prompt, hit_tokens(ctx, prompt, cfg.block_tokens)))
            ctx = prompt + turn.gen_len
    return out


@pytest.mark.parametrize("fit, scheduler", [(LOOSE, "full"), (TIGHT, "full"), (TIGHT, "naive")])
def test_packed_passes_are_warmed(fit, scheduler):
    """Every pass `pack` forms from up to one request per agent, each at a point its own earlier
    passes can have left it (a `prefill_chunk` cut, or any token once the quota can cut), has a
    shape in `warm_shapes`."""
    cfg = BASE.replace(scheduler=scheduler, prefill_chunk=512)
    model_cfg = models.get_config(cfg.model)
    warmed = set(warm_shapes(cfg, model_cfg, cfg.block_tokens, fit))
    assert max(rows for rows, _, _ in warmed) == cfg.agents
    requests, rng = _requests(cfg, model_cfg), np.random.default_rng(0)
    quota = None if scheduler == "naive" else cfg.compute_quota_ms / 1e3
    anywhere = fit is TIGHT and scheduler == "full"  # the quota binds: a pass may leave a request anywhere
    seen, cut = set(), False
    for _ in range(3000):
        queue = []
        for i in rng.choice(len(requests), rng.integers(1, cfg.agents + 1), replace=False):
            prompt, hit = requests[i]
            cuts = list(range(hit, prompt, cfg.prefill_chunk))
            start = int(rng.integers(hit, prompt)) if anywhere and rng.random() < 0.5 else int(rng.choice(cuts))
            queue.append(Work(i, start, prompt - start))
        plan = pack(queue, fit, quota, cfg.prefill_chunk, layers=model_cfg.n_layers)
        cut |= any(n < min(w.remaining, cfg.prefill_chunk) for w, n in plan)
        seen.add(DEFAULT_BUCKETS.pass_shape(len(plan), max(w.cached for w, _ in plan), max(n for _, n in plan)))
    assert cut == anywhere  # the quota cuts where it binds, and only there
    assert seen and seen <= warmed, sorted(seen - warmed)


def test_quota_widens_the_buckets():
    """Where the quota can cut a request at any length, the new and prefix buckets run from the
    smallest up to the longest piece and prompt; where it cannot, only the pieces' own buckets. By
    hand: first turns of 1,024 new tokens (bucket 1,024, no prefix), later turns of 72 new tokens
    (64 appended, 8 generated; bucket 256) over a hit of 1,024 (bucket 1,024) and then more (2,048);
    prompts stay under 2,048."""
    cfg = BASE
    model_cfg = models.get_config(cfg.model)
    loose = {(n, c) for _, n, c in warm_shapes(cfg, model_cfg, cfg.block_tokens, LOOSE)}
    tight = {(n, c) for _, n, c in warm_shapes(cfg, model_cfg, cfg.block_tokens, TIGHT)}
    assert max(p for p, _ in _requests(cfg, model_cfg)) < 2048
    assert loose == {(n, c) for n in (256, 1024) for c in (0, 1024, 2048)}
    assert tight == {(n, c) for n in (256, 512, 1024) for c in (0, 512, 1024, 2048)}


def test_pieces_start_where_the_store_hits():
    """A turn starts computing where the store's hits end: after a first turn of 8 prompt and 4 generated
    tokens, 11 have KV (the last generated is never fed back), two 4-token blocks; the next turn's 17-token
    prompt (5 appended) computes from token 8, one piece of 9 (not from 12: the context's 12th token has
    no KV). A 100-token chunk cuts nothing; without a store both turns compute whole."""
    agent = Agent(0.0, [Turn(np.zeros(8, np.int32), 4), Turn(np.zeros(5, np.int32), 3)])
    cfg = BASE.replace(prefill_chunk=100)
    assert _pieces(cfg, 4, [agent]) == ({(0, 8), (8, 9)}, 17)
    assert _pieces(cfg.replace(use_store=False), 4, [agent]) == ({(0, 8), (0, 17)}, 17)
