"""docs/policies.md as tests: a policy unit-tested on hand-built views (the way the reference shows), and
the scheduler's contract with a policy: `path` once per placed request, in FIFO order, with snapshots of
the two chosen engines taken before the request is added to them; `engines` before it, with every PE
and DE; the policy's own state kept between calls."""

from __future__ import annotations

from dualjax.core.policies import Policy, get_policy
from dualjax.core.scheduler import EngineView, RequestView, Scheduler, Thresholds, Waiting


class Hysteresis(Policy):
    """docs/policies.md's example: read on the PE side unless the DE's queue is shorter by a margin."""

    name = "hysteresis"

    def __init__(self, margin_tokens: int = 1_000_000):
        self.margin = margin_tokens

    def path(self, request, pe, de):
        return "de" if de.read_q_tokens + self.margin < pe.read_q_tokens else "pe"


def request(hit=4096, prompt=5000, gen=50, rid=0, agent=0, turn=1):
    return RequestView(id=rid, agent=agent, turn=turn, prompt_tokens=prompt, hit_tokens=hit, gen_len=gen)


def pe(read_q, rank=1):
    return EngineView(rank=rank, role="prefill", node=rank, read_q_tokens=read_q)


def de(read_q, rank=2, free=None):
    return EngineView(rank=rank, role="decode", node=rank, read_q_tokens=read_q, free_tokens=free)


def test_hysteresis_relays_only_past_its_margin():
    p = Hysteresis(margin_tokens=1000)
    assert p.path(request(), pe(read_q=5000), de(read_q=3999)) == "de"  # shorter by more than the margin
    assert p.path(request(), pe(read_q=5000), de(read_q=4000)) == "pe"  # by exactly the margin: stay
    assert p.path(request(), pe(read_q=0), de(read_q=0)) == "pe"


def test_a_zero_margin_is_dualpath_but_for_ties():
    ours, dualpath = Hysteresis(margin_tokens=0), get_policy("dualpath")
    for pe_q, de_q in [(10, 5), (5, 10), (0, 3), (7, 6)]:
        assert ours.path(request(), pe(pe_q), de(de_q)) == dualpath.path(request(), pe(pe_q), de(de_q))


class Recorder(Policy):
    """Keeps what it was called with: state lives on the object between calls."""

    name = "recorder"

    def __init__(self):
        self.paths, self.engine_calls = [], []

    def engines(self, request, pes, des):
        self.engine_calls.append((request.id, [v.rank for v in pes], [v.rank for v in des]))
        return None  # the scheduler's own choice

    def path(self, request, pe, de):
        self.paths.append((request.id, pe.rank, pe.tokens, de.rank, de.tokens, pe.read_q_tokens, de.read_q_tokens))
        return "pe" if len(self.paths) % 2 else "de"


def test_the_scheduler_calls_a_policy_once_per_request_with_snapshots_before_placing_it():
    policy = Recorder()
    sch = Scheduler(policy, Thresholds(alpha_tokens=10**6, beta_tokens=10**6), [pe(0, 1), de(0, 2)])
    waiting = Waiting([request(rid=i, agent=i, turn=0) for i in range(3)])
    decisions = sch.schedule(waiting)
    assert [d.request.id for d in decisions] == [0, 1, 2] and not waiting
    assert [c[0] for c in policy.engine_calls] == [0, 1, 2] and policy.engine_calls[0][1:] == ([1], [2])
    assert [p[0] for p in policy.paths] == [0, 1, 2]
    # request 1 sees request 0 on both engines (5,000 prompt tokens on the PE, 5,050 on the DE) and its
    # 4,096 hit tokens on the PE's node read queue (it was read on the PE side)
    assert policy.paths[0][1:] == (1, 0, 2, 0, 0, 0)
    assert policy.paths[1][1:] == (1, 5000, 2, 5050, 4096, 0)
    assert policy.paths[2][1:] == (1, 10000, 2, 10100, 4096, 4096)  # request 1 went to the DE side
    assert [d.path for d in decisions] == ["pe", "de", "pe"]
