"""`dualjax sim fit` writes only where it is told, and reads its fitted rates against physical figures."""

import json

import pytest

from dualjax.cli import main as cli
from dualjax.sim.fit import THREEFS_CLIENT_PEAK_BYTES_PER_S, physical
from dualjax.sim.profiles import PAPER_FIT, get_hardware


def test_fit_without_json_writes_nothing(capsys):
    """A bare `dualjax sim fit` must not replace the packaged profile that every paper-h800 result reads:
    without --json it is bad input (argparse's usage and one error line naming it), before any simulation."""
    before = open(PAPER_FIT).read()
    with pytest.raises(SystemExit) as exit_:
        cli.main(["sim", "fit"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "required: --json" in err.strip().splitlines()[-1]
    assert open(PAPER_FIT).read() == before


def test_physical_reads_the_packaged_fit_against_its_line_and_3fs():
    """The packaged fit's storage rate per node is its line rate times the fitted efficiency, and its share
    of 3FS's reported client peak is that over 40 GiB/s (worked by hand from the fit file)."""
    fitted = json.load(open(PAPER_FIT))["fitted"]
    hw = get_hardware("paper-h800")
    ph = physical(hw)
    snic = hw.snic_bytes_per_s * fitted["snic_efficiency"]
    assert abs(ph["snic_gbs_per_node"] - snic / 1e9) < 1e-9
    assert abs(ph["snic_over_threefs_peak"] - snic / THREEFS_CLIENT_PEAK_BYTES_PER_S) < 1e-12
    assert ph["compute_fraction_of_bf16_peak"] == fitted["efficiency"]


def test_the_per_trajectory_fit_is_a_named_profile():
    """`paper-h800-157` is paper-h800's machine with the inputs its packaged fit file holds (fitted on
    paper-64k-157): every other input equal, the three fitted ones the file's."""
    import dataclasses

    from dualjax.sim.profiles import FITTED, PAPER_FIT_157, PAPER_H800
    fit = json.load(open(PAPER_FIT_157))
    hw = get_hardware("paper-h800-157")
    assert hw.name == "paper-h800-157" and fit["point"]["workload"] == "paper-64k-157"
    assert {k: getattr(hw, k) for k in FITTED} == fit["fitted"]
    same = {f.name for f in dataclasses.fields(hw)} - set(FITTED) - {"name", "notes"}
    assert all(getattr(hw, k) == getattr(PAPER_H800, k) for k in same)
