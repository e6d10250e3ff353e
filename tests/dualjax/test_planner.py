"""The P/D window of docs/paper.md §8 on the paper's worked example and hand-worked cases."""

from fractions import Fraction

import pytest

from dualjax.cli import main as cli
from dualjax.core.planner import HardwareError, pd_window


def test_paper_worked_example():
    # g = 8, s = 1, B*s = 50 GB/s (400 Gbit/s), M = 500 GB/s -> 1/7 <= P/D <= 7/2.
    w = pd_window(8, 1, 400, 500)
    assert (w.min_p_over_d, w.max_p_over_d) == (Fraction(1, 7), Fraction(7, 2))
    assert w.binding_min == "PE CNIC writes" and w.binding == ["DE CNIC writes", "DE DRAM"]  # a tie


def test_dram_binds_when_it_is_scarce():
    # M = 300: (300/50 - 3)/2 = 3/2 < (8-1)/2.
    w = pd_window(8, 1, 400, 300)
    assert w.max_p_over_d == Fraction(3, 2) and w.binding == ["DE DRAM"]
    # Two storage NICs (s = 2): lower 2/6 = 1/3, DE CNIC writes (8-2)/4 = 3/2, reads (8-4)/2 = 2,
    # DRAM (1000/100 - 3)/2 = 7/2.
    w = pd_window(8, 2, 400, 1000)
    assert (w.min_p_over_d, w.max_p_over_d, w.binding) == (Fraction(1, 3), Fraction(3, 2), ["DE CNIC writes"])


@pytest.mark.parametrize("args,message", [((8, 5, 400, 500), "exceeds g/2"), ((0, 1, 400, 500), "positive"),
                                          ((8, 1, -1, 500), "positive"), ((8, 1, 400, 100), "no feasible")])
def test_invalid_hardware_is_rejected_with_the_reason(args, message):
    with pytest.raises(HardwareError, match=message):
        pd_window(*args)


def test_plan_command_writes_json(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert cli.main(["plan", "--gpus-per-node", "8", "--snic-per-node", "1", "--cnic-gbps", "400", "--dram-gbs",
                     "500", "--json", str(out)]) == 0
    assert "1/7" in capsys.readouterr().out and '"max_p_over_d_fraction": "7/2"' in out.read_text()
    assert cli.main(["plan", "--snic-per-node", "6"]) == 2 and "g/2" in capsys.readouterr().err
