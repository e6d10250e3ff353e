"""Plans per request (docs/policies.md): validation, the scheduler's bookkeeping of each side's share and
of recomputed tokens, and the two built-in rules against their definitions. No MPI, no JAX."""

import math

import pytest

from dualjax.core.batching import AttentionFit
from dualjax.core.policies import DualPathRecompute, DualPathSplit, Plan, Policy, recompute_tail
from dualjax.core.scheduler import EngineView, RequestView, Scheduler, Thresholds, Waiting

T = 64
TH = Thresholds(alpha_tokens=3000, beta_tokens=10**6, new_token_weight=5.0)  # 1,000 tokens/s of reads


def req(hit=10 * T, prompt=11 * T + 5, gen=10, i=0):
    return RequestView(i, i, 1, prompt, hit, gen, T)


class Fixed(Policy):
    name = "fixed"

    def __init__(self, choice):
        self.choice = choice

    def path(self, request, pe, de):
        return self.choice


def place(choice, r=None):
    """The scheduler's state after placing one request with `choice` on PE 1 (node 1) and DE 2 (node 2)."""
    sch = Scheduler(Fixed(choice), TH, [EngineView(1, "prefill", 1), EngineView(2, "decode", 2)])
    (d,) = sch.schedule(Waiting([r or req()]))
    return sch, d


@pytest.mark.parametrize("plan,why", [
    (Plan(de_tokens=T + 1), "de_tokens=65 is not a whole number of 64-token blocks"),
    (Plan(recompute_tokens=-T), "recompute_tokens=-64 is not a whole number"),
    (Plan(de_tokens=6 * T, recompute_tokens=5 * T), "exceed the request's 640 hit tokens"),
    (Plan(de_tokens=1.5), "de_tokens=1.5 is not a whole number"),
    ("both", "a path is 'pe', 'de' or a Plan"),
])
def test_a_plan_that_does_not_fit_stops_the_run_in_one_line(plan, why):
    with pytest.raises(ValueError, match="policy 'fixed'") as e:
        place(plan)
    assert why in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("side,plan", [("pe", Plan()), ("de", Plan(de_tokens=10 * T))])
def test_pe_and_de_are_the_trivial_plans(side, plan):
    (a, da), (b, db) = place(side), place(plan)
    assert [a.view(r) for r in (1, 2)] == [b.view(r) for r in (1, 2)]
    assert (da.plan, da.path, db.path) == (plan, side, side)


def test_each_side_queues_its_share_and_the_pe_charges_recomputed_tokens():
    r = req()
    sch, d = place(Plan(de_tokens=3 * T, recompute_tokens=2 * T), r)
    assert (sch.view(1).read_q_tokens, sch.view(2).read_q_tokens) == (5 * T, 3 * T)  # PE reads 10 - 3 - 2 blocks
    assert d.path == "split" and d.pe_tokens == r.prompt_tokens + 2 * T * 4  # a new token counts 5 prompt tokens
    assert sch.view(1).tokens == d.pe_tokens and sch.view(2).tokens == r.total_tokens
    sch.update(1, -1, -d.pe_tokens)  # the owner gives back what the prefill took
    assert (sch.view(1).seq, sch.view(1).tokens) == (0, 0)


def test_views_carry_the_rates_and_the_fit():
    fit = lambda cached, new: 1.0  # noqa: E731
    sch = Scheduler(Fixed("pe"), TH, [EngineView(1, "prefill", 1, prefill_s=fit), EngineView(2, "decode", 2)])
    pe, de = sch.view(1), sch.view(2)
    assert pe.read_tokens_per_s == de.read_tokens_per_s == 1000 and pe.prefill_tokens_per_s == 200_000
    assert pe.prefill_s is fit and de.prefill_tokens_per_s is None


def engine(role, q, rate=1000.0, tokens=0, fit=None):
    return EngineView(1 if role == "prefill" else 2, role, 1 if role == "prefill" else 2, tokens=tokens,
                      read_q_tokens=q, read_tokens_per_s=rate, prefill_tokens_per_s=2000.0, prefill_s=fit)


@pytest.mark.parametrize("pe_q,de_q,rp,rd", [(0, 0, 1, 1), (4000, 0, 1, 1), (0, 9000, 1, 1), (1000, 0, 1, 3),
                                             (3000, 500, 2, 1)])
def test_split_ends_both_queues_together_to_the_block(pe_q, de_q, rp, rd):
    r = req(hit=40 * T, prompt=41 * T)
    plan = DualPathSplit().path(r, engine("prefill", pe_q, rp), engine("decode", de_q, rd))
    ends = lambda x: ((pe_q + r.hit_tokens - x) / rp, (de_q + x) / rd)  # noqa: E731
    best = min(range(0, r.hit_tokens + 1, T), key=lambda x: max(ends(x)))  # every boundary, by brute force
    assert plan.recompute_tokens == 0 and max(ends(plan.de_tokens)) <= max(ends(best)) + T / min(rp, rd) / 2


@pytest.mark.parametrize("rate", [None, math.inf])
def test_split_without_finite_rates_weighs_both_sides_alike(rate):
    r = req(hit=40 * T, prompt=41 * T)
    plan = DualPathSplit().path(r, engine("prefill", 6 * T, rate), engine("decode", 0, rate))
    assert (plan.pe_tokens(r), plan.de_tokens) == (17 * T, 23 * T)  # 6 + 17 = 23 blocks queued on each side


FITS = {  # seconds of a one-row pass (cached, new); reads: 1,000 tokens/s
    "cheap": AttentionFit(0.0, 5e-4, 1e-3).predict,  # 2,000 new tokens/s: recomputing is cheaper than loading
    "dear": AttentionFit(0.0, 4e-3, 1e-3).predict,  # 250 new tokens/s: it never is
    "attention": AttentionFit(2e-7, 7e-4, 1e-3).predict,  # attention over the prefix: a part costs more than all
}


# per fit: no queue, a long queue, a busy PE, only the PE busy, a short queue
@pytest.mark.parametrize("fit", sorted(FITS))
@pytest.mark.parametrize("q,busy_tokens", [(0, 0), (20_000, 0), (20_000, 30_000), (0, 30_000), (5_000, 2_000)])
def test_recompute_tail_ends_the_request_soonest(fit, q, busy_tokens):
    r, f = req(hit=40 * T, prompt=41 * T), FITS[fit]
    pe, reader = engine("prefill", 0, tokens=busy_tokens, fit=f), engine("decode", q)

    def end(x):  # the rule's definition: the later of loading the rest behind the queue and computing it
        load = (q + r.hit_tokens - x) / 1000.0 if x < r.hit_tokens else 0.0
        return max(load, busy_tokens / 2000.0 + f(r.hit_tokens - x, r.miss_tokens + x))
    best = min(range(0, r.hit_tokens + 1, T), key=lambda x: (round(end(x), 9), x))  # by brute force
    dear = f(r.hit_tokens - best, r.miss_tokens + best) - f(r.hit_tokens, r.miss_tokens) > best / 1000.0
    bottleneck = q / 1000.0 > busy_tokens / 2000.0 + f(0, r.prompt_tokens)  # the NIC, whatever the PE does
    assert recompute_tail(r, pe, reader) == (0 if dear and not bottleneck else best)


def test_recompute_tail_cases_cover_none_some_all_and_both_reasons_to_keep_a_tail():
    r = req(hit=40 * T, prompt=41 * T)
    got = {(fit, q): recompute_tail(r, engine("prefill", 0, fit=FITS[fit]), engine("decode", q)) // T
           for fit in FITS for q in (0, 20_000)}
    # cheap: some (a 26-block tail ends the request soonest and costs less than it saves), all;
    # dear: none without a queue; behind 20 s of queued reads, computing the whole prompt (10.5 s) ends
    # it sooner and the NIC is the bottleneck: all; attention, no queue: the soonest tail (19 blocks)
    # costs more than it saves; attention, 20 s of queued reads: the NIC is the bottleneck, all of them
    assert got == {("cheap", 0): 26, ("cheap", 20_000): 40, ("dear", 0): 0, ("dear", 20_000): 40,
                   ("attention", 0): 0, ("attention", 20_000): 40}


LINEAR = AttentionFit(0.0, 5e-4, 1e-3).predict  # 1 ms + 0.5 ms per new token: 2,000 new tokens/s


def views(read_rate, pe_tokens=0, q=0):
    pe = EngineView(1, "prefill", 1, tokens=pe_tokens, read_q_tokens=q, read_tokens_per_s=read_rate,
                    prefill_tokens_per_s=2000.0, prefill_s=LINEAR)
    return pe, EngineView(2, "decode", 2, read_q_tokens=q + 1, read_tokens_per_s=read_rate)


def test_a_slow_nic_recomputes_the_tail_that_ends_the_request_soonest():
    # 40 hit blocks (2,560 tokens), 64 miss; a 100 tokens/s NIC: loading all takes 25.6 s, computing all
    # 1 + 0.5 * 2,624 ms = 1.313 s. A tail of 38 blocks: load 128 tokens in 1.28 s, compute 2,496 new in
    # 1.249 s: ends at 1.28 s; 39 blocks: 0.64 s and 1.281 s; 37 blocks: 1.92 s. So 38 blocks.
    r = req(hit=40 * T, prompt=41 * T)
    pe, de = views(100.0)
    assert recompute_tail(r, pe, pe) == 38 * T
    assert DualPathRecompute().path(r, pe, de) == Plan(recompute_tokens=38 * T)  # the PE's queue is shorter


def test_an_idle_fast_nic_loads_everything():
    r = req(hit=40 * T, prompt=41 * T)
    pe, de = views(1e6)  # 2.56 ms to load, 33 ms to compute the miss over the prefix
    assert recompute_tail(r, pe, pe) == 0 and DualPathRecompute().path(r, pe, de) == "pe"


def test_a_busy_pe_loads_even_from_a_slow_nic():
    r = req(hit=40 * T, prompt=41 * T)
    pe, de = views(100.0, pe_tokens=60_000)  # 30 s of the PE's own queue: the 25.6 s load is done first
    assert recompute_tail(r, pe, pe) == 0 and DualPathRecompute().path(r, pe, de) == "pe"
    pe, de = views(100.0, pe_tokens=40_000)  # 20 s: waiting 25.6 s for the load would idle it 5.6 s
    assert 0 < recompute_tail(r, pe, pe) < r.hit_tokens


def test_a_long_read_queue_on_a_fast_nic_recomputes():
    # what a node-wide cost bound never allowed: 2 s of reads queued ahead on a 1 M tokens/s NIC, an
    # idle PE that computes the whole prompt in 1.313 s
    r = req(hit=40 * T, prompt=41 * T)
    pe, _ = views(1e6, q=2_000_000)
    assert recompute_tail(r, pe, pe) == r.hit_tokens


def test_a_shorter_queue_on_a_fast_nic_loads():
    # 1 s of reads ahead: a 30-block tail would end the request 2 ms sooner (1.00064 s against
    # 1.00256 s) at 0.96 s of the PE's time, to save 1.9 ms of the NIC's, and the queue is shorter than
    # the 1.313 s pass over the whole prompt: the NIC is not the bottleneck, so everything loads
    r = req(hit=40 * T, prompt=41 * T)
    pe, _ = views(1e6, q=1_000_000)
    assert recompute_tail(r, pe, pe) == 0


def test_recompute_keeps_dualpaths_side_and_needs_a_fit():
    r = req(hit=40 * T, prompt=41 * T)
    pe, de = engine("prefill", 50_000, fit=FITS["cheap"]), engine("decode", 20_000)
    plan = DualPathRecompute().path(r, pe, de)  # the DE's queue is shorter: it reads what is loaded
    assert plan.recompute_tokens > 0 and plan.de_tokens == plan.loaded(r)
    assert DualPathRecompute().path(r, engine("prefill", 50_000), de) == "de"  # no fit: DualPath's choice
