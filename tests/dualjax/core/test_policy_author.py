"""docs/policies.md as tests: a policy unit-tested on hand-built views (the way the reference shows), and
the scheduler's contract with a policy: `path` once per placed request, in FIFO order, with snapshots of
the two chosen engines taken before the request is added to them; `engines` before it, with every PE
and DE; the policy's own state kept between calls."""

from __future__ import annotations

import pytest

from dualjax.core.policies import Policy, get_policy
from dualjax.core.scheduler import EngineView, RequestView, Scheduler, Thresholds, Waiting
from tests.dualjax.core import custom_policy


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


# -- a policy author's mistakes read as such: one line naming the policy, the request and the fault ----

CUSTOM = "tests.dualjax.core.custom_policy"


def one_line(e) -> str:
    text = str(e.value)
    assert "\n" not in text and "Traceback" not in text
    return text


def test_a_policy_that_raises_is_named_with_the_request_and_the_authors_line():
    from dualjax.core.policies import PolicyError, decide
    from tests.dualjax.core.custom_policy import Raises
    with pytest.raises(PolicyError) as e:
        decide(Raises(), request(rid=7, agent=3, turn=2), pe(0), de(0))
    text = one_line(e)
    assert text.startswith("policy 'raises' raised KeyError at custom_policy.py:")
    assert "request 7 (agent 3, turn 2): 3" in text
    line = int(text.split("custom_policy.py:")[1].split()[0])  # the line that raised, for the author
    assert "[request.agent]" in open(custom_policy.__file__).read().splitlines()[line - 1]
    assert isinstance(e.value.__cause__, KeyError)  # the traceback (runtime failure files) keeps the rest


@pytest.mark.parametrize("cls,fault", [
    ("NotAPath", "chose path 'both' for request 0; a path is 'pe', 'de' or a Plan"),
    ("HalfBlock", "chose Plan(de_tokens=32, recompute_tokens=0) for request 0: de_tokens=32 is not a whole "
                  "number of 64-token blocks"),
])
def test_a_wrong_answer_stops_the_scheduler_in_one_line(cls, fault):
    from dualjax.core.policies import PolicyError
    sch = Scheduler(get_policy(f"{CUSTOM}:{cls}"), Thresholds(10**6, 10**6), [pe(0), de(0)])
    with pytest.raises(PolicyError) as e:
        sch.schedule(Waiting([request()]))
    assert one_line(e) == f"policy {get_policy(f'{CUSTOM}:{cls}').name!r} {fault}"


def test_engines_answers_are_checked():
    from dualjax.core.policies import PolicyError, choose_engines

    class Elsewhere(Recorder):
        name = "elsewhere"

        def engines(self, request, pes, des):
            return (2, 1)  # the DE where the PE goes

    with pytest.raises(PolicyError) as e:
        choose_engines(Elsewhere(), request(rid=4), [pe(0)], [de(0)])
    assert one_line(e) == ("policy 'elsewhere' chose engines (2, 1) for request 4; engines answers None or "
                           "(PE rank, DE rank) with a PE of [1] and a DE of [2]")
    assert choose_engines(Recorder(), request(), [pe(0)], [de(0)]) is None


def test_a_constructor_that_needs_arguments_says_how_to_give_them():
    from dualjax.core.policies import PolicyError
    with pytest.raises(PolicyError) as e:
        get_policy(f"{CUSTOM}:NeedsMargin")
    text = one_line(e)
    assert text.startswith(f"policy '{CUSTOM}:NeedsMargin': NeedsMargin(margin_tokens) cannot be built from no "
                           f"arguments (missing a required argument: 'margin_tokens')")
    assert text.endswith("give every constructor argument a default, or pass them as NAME:arg=value,...")
    built = get_policy(f"{CUSTOM}:NeedsMargin:margin_tokens=512")
    assert built.margin == 512 and built.name == "needs-margin:margin_tokens=512"


def test_constructor_arguments_by_name():
    from dualjax.core.field_policies import HiCacheTimeout
    from dualjax.core.policies import PolicyError
    p = get_policy("hicache-timeout:timeout_base_s=2.5,side=dualpath")
    assert (type(p), p.timeout_base_s, p.timeout_per_ki_token_s, p.side) == (HiCacheTimeout, 2.5, 0.25, "dualpath")
    assert p.name == "hicache-timeout:timeout_base_s=2.5,side=dualpath"  # the report tells settings apart
    with pytest.raises(PolicyError) as e:
        get_policy("hit-ratio:treshold=0.9")
    assert "HitRatio(threshold=0.5, side=None) cannot be built from {'treshold': 0.9}" in one_line(e)
    with pytest.raises(PolicyError) as e:
        get_policy("hit-ratio:side=both")
    assert "raised ValueError at field_policies.py:" in one_line(e)
    assert "side='both': one of pe, de, dualpath" in str(e.value)


def test_a_module_that_cannot_be_imported_says_where_modules_are_found(tmp_path, monkeypatch):
    from dualjax.core.policies import PolicyError
    monkeypatch.setenv("PYTHONPATH", "/somewhere/else")
    with pytest.raises(PolicyError) as e:
        get_policy("mypolicies:Hysteresis")
    assert one_line(e) == ("policy 'mypolicies:Hysteresis': cannot import module 'mypolicies': no 'mypolicies' on "
                           "Python's path (PYTHONPATH="
                           "'/somewhere/else'; the dualjax command does not add the working directory): export "
                           "PYTHONPATH=<the directory holding it>")
    (tmp_path / "brokenpolicies.py").write_text("import json\n\nraise RuntimeError('no store configured')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(PolicyError) as e:
        get_policy("brokenpolicies:Any")
    assert one_line(e) == ("policy 'brokenpolicies:Any': importing module 'brokenpolicies' raised RuntimeError at "
                           "brokenpolicies.py:3: no store configured")


@pytest.mark.parametrize("cls,fault", [("Raises", "raised KeyError at custom_policy.py:24 in path for request 0"),
                                       ("NotAPath", "chose path 'both' for request"),
                                       ("HalfBlock", "is not a whole number of 64-token blocks"),
                                       ("NeedsMargin", "cannot be built from no arguments")])
def test_the_simulator_ends_in_one_line_and_exit_code_2(capsys, cls, fault):
    from dualjax.cli import main as cli
    rc = cli.main(["sim", "--cluster", "1p1d", "--model", "tiny", "--workload", "agentic-tiny", "--quiet",
                   "--policy", f"{CUSTOM}:{cls}"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err and err.startswith("dualjax sim: error: policy ") and fault in err
