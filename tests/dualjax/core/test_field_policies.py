"""The load-or-recompute rules of other systems (docs/policies.md, "Baselines from the field"), each on
views worked out by hand, and every built-in's answer a plan that fits, whatever the views lack."""

import itertools

import pytest

from dualjax.core.batching import AttentionFit
from dualjax.core.policies import POLICIES, Plan, as_plan, get_policy
from dualjax.core.scheduler import EngineView, RequestView

T = 64
LINEAR = AttentionFit(0.0, 5e-4, 1e-3).predict  # 1 ms + 0.5 ms per new token


def req(hit=40 * T, prompt=41 * T, i=0):
    return RequestView(i, i, 1, prompt, hit, 10, T)


def pe(rate=1000.0, tokens=0, q=0, seq=0, fit=LINEAR):
    return EngineView(1, "prefill", 1, seq=seq, tokens=tokens, read_q_tokens=q, read_tokens_per_s=rate,
                      prefill_tokens_per_s=2000.0, prefill_s=fit)


def de(rate=1000.0, q=0):
    return EngineView(2, "decode", 2, read_q_tokens=q, read_tokens_per_s=rate)


ALL = Plan(recompute_tokens=40 * T)  # recompute every hit block


def test_llmd_pull_compares_the_pull_with_recomputing_at_the_pes_loaded_rate():
    # recomputing 2,560 hit tokens on an idle PE: 0.5 ms x 2,560 = 1.28 s; pulling them at R: 2,560 / R
    p = get_policy("llmd-pull")
    assert p.path(req(), pe(rate=4000.0), de(rate=4000.0)) == "pe"  # 0.64 s < 1.28 s
    assert p.path(req(), pe(rate=1000.0), de(rate=1000.0)) == ALL  # 2.56 s > 1.28 s
    # 8,192 tokens in flight (one batch): R_eff halves, 2.56 s against 2.56 s: not below, recompute;
    # 16,384: a third, 3.84 s: pull
    assert p.path(req(), pe(tokens=8192), de()) == ALL
    assert p.path(req(), pe(tokens=16_384), de()) == "pe"
    assert get_policy("llmd-pull:t0_s=1.0").path(req(), pe(rate=4000.0), de(rate=4000.0)) == ALL  # 1.64 s
    assert p.path(req(), pe(rate=4000.0, q=10), de(rate=4000.0)) == "de"  # the source with the shorter queue
    # with the queue in the pull: 1 s of reads queued ahead makes 0.64 s 1.64 s
    assert get_policy("llmd-pull:read_queue=True").path(req(), pe(4000.0, q=4000), de(4000.0, q=4000)) == ALL


def test_hit_ratio_loads_above_its_threshold():
    p = get_policy("hit-ratio")
    assert p.path(req(), pe(), de()) == "pe"  # 2,560 / 2,624 = 0.98
    assert p.path(req(hit=10 * T, prompt=2000), pe(), de()) == Plan(recompute_tokens=10 * T)  # 0.32
    assert get_policy("hit-ratio:threshold=0.99").path(req(), pe(), de()) == ALL


def test_hicache_prefetches_only_past_its_threshold():
    for name in ("hicache-wait", "hicache-best-effort", "hicache-timeout"):
        assert get_policy(name).path(req(hit=3 * T), pe(), de()) == Plan(recompute_tokens=3 * T)  # 192 < 256
    assert get_policy("hicache-wait").path(req(hit=4 * T), pe(), de()) == "pe"


def test_hicache_best_effort_loads_what_arrives_while_the_pe_is_busy():
    p = get_policy("hicache-best-effort")
    # 4,000 queued tokens at 2,000/s: 2 s; the NIC delivers 2,000 tokens in 2 s, 500 of them queued
    # before: 1,500 of ours, 23 whole blocks (1,472 tokens); the other 17 blocks are recomputed
    assert p.path(req(), pe(tokens=4000, q=500), de()) == Plan(recompute_tokens=17 * T)
    assert p.path(req(), pe(), de()) == ALL  # an idle PE starts at once, with nothing loaded


def test_hicache_timeout_reads_under_its_deadline():
    # 1 s + 0.25 s x 2,560 / 1,024 = 1.625 s: the read's deadline, whatever the NIC (the read delivers
    # what it delivers by then: tests/dualjax/sim/test_sim_deadline.py)
    assert get_policy("hicache-timeout").path(req(), pe(), de()) == Plan(deadline_s=1.625)
    assert get_policy("hicache-timeout").path(req(), pe(rate=1e6), de()) == Plan(deadline_s=1.625)
    got = get_policy("hicache-timeout:side=de").path(req(), pe(), de(q=600))
    assert got == Plan(de_tokens=40 * T, deadline_s=1.625)


def test_llmd_selective_loads_long_prefixes_on_a_quiet_pe():
    p = get_policy("llmd-selective")
    assert p.path(req(hit=16 * T, prompt=17 * T), pe(seq=7), de()) == "pe"  # 1,024 tokens, 7 requests
    assert p.path(req(hit=16 * T, prompt=17 * T), pe(seq=8), de()) == Plan(recompute_tokens=16 * T)
    assert p.path(req(hit=15 * T, prompt=17 * T), pe(), de()) == Plan(recompute_tokens=15 * T)


VIEWS = [(pe(), de()), (pe(rate=None, fit=None), de(rate=None)), (pe(tokens=50_000, q=9_000, seq=9), de(q=3)),
         (pe(rate=float("inf")), de(rate=float("inf"))), (pe(rate=1.0, q=10**6), de(rate=1.0))]


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_builtin_answers_a_plan_that_fits(name):
    for (p, d), hit in itertools.product(VIEWS, (0, T, 4 * T, 40 * T)):
        policy = get_policy(name)
        r = req(hit=hit, prompt=hit + 70)
        plan, _ = as_plan(policy.path(r, p, d), r, policy)
        assert plan.loaded(r) + plan.recompute_tokens == hit
