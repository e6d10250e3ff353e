"""Read deadlines on plans (docs/policies.md, "Read deadlines"): what a plan with one may be, and
`dualpath-deadline`'s deadline worked out by hand on the views of test_field_policies."""

import pytest

from dualjax.core.policies import Plan, PolicyError, as_plan, get_policy
from tests.dualjax.core.test_field_policies import T, de, pe, req


def test_a_deadline_is_seconds_on_a_read_by_one_side():
    r = req()  # 40 hit blocks
    assert Plan(deadline_s=0).problem(r) is None
    assert Plan(de_tokens=40 * T, deadline_s=2.5).problem(r) is None
    assert Plan(recompute_tokens=8 * T, deadline_s=float("inf")).problem(r) is None
    assert "split" in Plan(de_tokens=8 * T, deadline_s=1.0).problem(r)  # both sides read: refused
    for bad in (-1.0, float("nan"), "1", True):
        assert "deadline_s" in Plan(deadline_s=bad).problem(r)
    with pytest.raises(PolicyError, match="deadline_s=-1"):
        as_plan(Plan(deadline_s=-1), r, get_policy("dualpath"))
    assert as_plan(Plan(de_tokens=40 * T, deadline_s=1.0), r, get_policy("dualpath"))[1] == "de"


def test_dualpath_deadline_is_the_time_the_pe_needs_to_recompute_the_hit():
    # LINEAR: 0.5 ms per new token; computing the 2,560 hit tokens as new costs 0.5 ms x 2,560 = 1.28 s
    p = get_policy("dualpath-deadline")
    assert p.path(req(), pe(), de()) == Plan(deadline_s=pytest.approx(1.28))
    # behind 4,000 queued tokens at 2,000 tokens/s: 2 s more
    assert p.path(req(), pe(tokens=4000), de()) == Plan(deadline_s=pytest.approx(3.28))
    # DualPath's side: the DE's read queue is the shorter, the DE reads every hit block
    assert p.path(req(), pe(q=10), de()) == Plan(de_tokens=40 * T, deadline_s=pytest.approx(1.28))
    assert get_policy("dualpath-deadline:factor=2.0,min_s=5.0").path(req(), pe(), de()).deadline_s == 5.0
    assert get_policy("dualpath-deadline:factor=2.0").path(req(), pe(), de()).deadline_s == pytest.approx(2.56)
    # without a fit: the hit at the PE's rate, 2,560 / 2,000 = 1.28 s; without a rate: DualPath
    assert p.path(req(), pe(fit=None), de()).deadline_s == pytest.approx(1.28)
    nofit = pe(fit=None)
    object.__setattr__(nofit, "prefill_tokens_per_s", None)
    assert p.path(req(), nofit, de()) == "pe"
    assert p.path(req(hit=0), pe(), de()) == "pe"  # nothing to read
