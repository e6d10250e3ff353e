"""Golden simulator runs: each case of `golden.py` reproduces its blessed fingerprint in `golden.json`
exactly (JCT, events, every request column, the host records, the PE and link summaries). A change that
is meant to be exact (speed, structure) must leave them all; one meant to move results re-blesses them
in the same commit (`python -m tests.dualjax.sim.golden --bless`) and says why in its body."""

import pytest

from tests.dualjax.sim.golden import BLESS, CASES, fingerprint, load, moved

GOLDEN = load()


def test_every_case_is_blessed_with_its_settings():
    # a case added, dropped or edited without a re-bless would otherwise compare against nothing or the
    # fingerprint of other settings
    stale = sorted(k for k in set(CASES) | set(GOLDEN) if GOLDEN.get(k, {}).get("settings") != CASES.get(k))
    assert not stale, f"golden.json differs from the case list for {', '.join(stale)}: run `{BLESS} {' '.join(stale)}`"


@pytest.mark.parametrize("case", list(CASES))
def test_golden_run_is_unmoved(case):
    """The run of `case` gives the fingerprint blessed in golden.json, to the last bit."""
    blessed = GOLDEN.get(case, {}).get("fingerprint", {})
    diff = moved(blessed, fingerprint(CASES[case]))
    if diff:
        pytest.fail(f"golden case {case!r} moved: {'; '.join(diff)}. If the change is meant to move results, "
                    f"run `{BLESS} {case}` and say why in the commit body.", pytrace=False)
