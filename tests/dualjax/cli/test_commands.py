"""The command line as the documentation writes it: every `dualjax ...` command in README.md and docs/*.md
parses (its subcommands and flags exist; --help exits 0), and every subcommand is listed by its parent's
--help."""

from __future__ import annotations

import glob
import os
import re
import shlex

import pytest

from dualjax.cli.main import BENCHES, build_parser, main

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
DOCS = [os.path.join(ROOT, "README.md"), *sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))]


def documented_commands() -> list[tuple[str, str, bool]]:
    """(file, command, whole) for each `dualjax ...` line of a fenced code block (whole: a command to run as
    written) and each inline `dualjax ...` of the prose (it names a command and some of its flags)."""
    found = []
    for path in DOCS:
        text = open(path).read()
        blocks = re.findall(r"```[a-z]*\n(.*?)```", text, re.S)
        lines = "\n".join(blocks).replace("\\\n", " ").splitlines()
        commands = [(line.split("#")[0].strip(), True) for line in lines if line.strip().startswith("dualjax ")]
        prose = re.sub(r"```.*?```", "", text, flags=re.S).replace("\n", " ")
        commands += [(c, False) for c in re.findall(r"`(dualjax [^`]+)`", prose)]
        found += [(os.path.relpath(path, ROOT), c, whole) for c, whole in commands if not c.split()[1].endswith(":")]
    return sorted(set(found))


# what the docs write for a flag's value, and a value of the right type
PLACEHOLDERS = {"FILE": "f.json", "F": "f.json", "DIR": "d", "N": "2", "A": "1", "T": "zero", "P": "dualpath",
                "M": "tiny"}


def words(command: str) -> list[str] | None:
    """The command's arguments as the parser sees them, optional parts included ([...] and a | b as
    written); None for a synopsis with a placeholder subcommand (`dualjax bench NAME`)."""
    out = []
    for w in shlex.split(command.replace("[", " ").replace("]", " "))[1:]:
        if w in ("|", "...") or "{" in w:
            continue
        if w.isupper() and (not out or not out[-1].startswith("-")):
            return None
        out.append(PLACEHOLDERS.get(w, w))
    return out


COMMANDS = documented_commands()


def test_the_docs_show_commands():
    assert len(COMMANDS) > 40 and {c.split()[1] for _, c, _ in COMMANDS} >= {"run", "sim", "report", "bench", "demo"}


@pytest.mark.parametrize("doc,command,whole", COMMANDS, ids=[c for _, c, _ in COMMANDS])
def test_a_documented_command_parses(doc, command, whole, tmp_path, monkeypatch, capsys):
    argv = words(command)
    if argv is None:
        pytest.skip("a synopsis")
    monkeypatch.chdir(tmp_path)  # output flags make their directories as they are parsed
    if whole and "--help" not in argv:  # every flag exists and takes its value
        _, unknown = build_parser(argv).parse_known_args(argv)
        assert not unknown, f"{doc}: `{command}`: no such flag {unknown}"
    first_flag = next((i for i, w in enumerate(argv) if w.startswith("-")), len(argv))
    path = argv if whole else argv[:first_flag]  # prose: the command, and the flags it names
    with pytest.raises(SystemExit) as e:
        main([*path, "--help"])
    out, err = capsys.readouterr()
    assert e.value.code == 0, f"{doc}: `{command}`: {err}"
    assert all(f in out for f in argv if f.startswith("--")), f"{doc}: `{command}` names a flag its --help lacks"


@pytest.mark.parametrize("parent,children", [(["sim"], ["ablation", "validate"]), (["bench"], list(BENCHES)),
                                             (["workload"], ["stats"])])
def test_every_subcommand_is_listed_by_its_parent(parent, children, capsys):
    with pytest.raises(SystemExit) as e:
        main([*parent, "--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0 and all(re.search(rf"^\s+{c}\s", out, re.M) for c in children), out


def test_log_level_goes_before_or_after_the_subcommand(capsys):
    for argv in (["--log-level", "info", "workload", "stats", "agentic-tiny"],
                 ["workload", "stats", "agentic-tiny", "--log-level", "DEBUG"]):
        assert main(argv) == 0
    with pytest.raises(SystemExit) as e:
        main(["workload", "stats", "agentic-tiny", "--log-level", "loud"])
    assert e.value.code == 2 and "--log-level: invalid choice" in capsys.readouterr().err


def test_bad_input_leaves_no_output_directory(tmp_path, capsys):
    out = tmp_path / "runs" / "sim"
    argv = ["sim", "--hardware", "no-such-profile", "--cluster", "1p1d", "--workload", "agentic-tiny",
            "--out", str(out)]
    assert main(argv) == 2
    assert "no-such-profile" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()
    with pytest.raises(SystemExit):  # a bad flag after --out: argparse exits once --out was made
        main(["sim", "--out", str(out), "--agents", "many"])
    assert not (tmp_path / "runs").exists()
    (tmp_path / "kept").mkdir()
    assert main(argv[:-1] + [str(tmp_path / "kept")]) == 2
    assert (tmp_path / "kept").is_dir()  # a directory that was there before stays


QUIET = [["demo"], ["run"], ["verify"], ["calibrate"], ["sim"], *(["bench", b] for b in BENCHES)]


@pytest.mark.parametrize("argv", QUIET, ids=" ".join)
def test_every_command_that_shows_progress_takes_quiet(argv, capsys):
    """One flag turns progress off wherever there is progress to turn off."""
    with pytest.raises(SystemExit) as e:
        main([*argv, "--help"])
    assert e.value.code == 0 and "--quiet" in capsys.readouterr().out


def test_quiet_keeps_a_commands_progress_lines_off_and_log_level_still_decides():
    """A benchmark's or calibration's progress is dualjax's INFO lines (`show_progress`): --quiet keeps them
    off, an explicit --log-level wins over both."""
    import logging

    from dualjax.bench.common import show_progress
    from dualjax.cli.parsing import set_log_level
    log = logging.getLogger("dualjax")
    try:
        for level, quiet, want in ((None, False, logging.INFO), (None, True, logging.WARNING),
                                   ("DEBUG", True, logging.DEBUG), ("ERROR", False, logging.ERROR)):
            set_log_level(level, quiet)
            show_progress()
            assert log.getEffectiveLevel() == want, (level, quiet)
    finally:
        set_log_level(None)


def test_verify_quiet_drops_the_line_per_run_not_the_comparison(capsys):
    """`verify --quiet` prints no line per run; the mismatch is counted either way."""
    from dualjax.runtime.verify import _compare
    for progress in (True, False):
        result = {"runs": [], "mismatches": []}
        _compare(result, "r", {(0, 0): [1, 2]}, {(0, 0): [1, 3]}, progress=progress)
        assert len(result["mismatches"]) == 1
        assert capsys.readouterr().out == ("verify: r: MISMATCH\n" if progress else "")


@pytest.mark.slow
def test_run_prints_its_summary_line_on_stdout_embedded_and_under_mpiexec_quiet_or_not(tmp_path, capfd):
    """The run's result is one line on stdout however it was launched; --quiet drops progress, not it."""
    import json

    from dualjax.runtime.cluster.runner import summary_line
    for launcher, quiet in ((["--embedded"], ["--quiet"]), ([], ["--quiet"]), ([], [])):
        out = tmp_path / f"{'embedded' if launcher else 'mpiexec'}{'-quiet' if quiet else ''}"
        assert main(["run", *launcher, *quiet, "--agents", "2", "--turns", "2", "--out", str(out)]) == 0
        stdout, stderr = capfd.readouterr()
        line = summary_line(json.load(open(out / "report.json")))  # the line, from the run's report
        assert stdout.splitlines() == [line] and line not in stderr, (launcher, quiet, stdout, stderr[-2000:])


def test_calibrate_measures_a_checkpoint_directory_as_its_preset(tmp_path):
    """`calibrate --model DIR` takes a checkpoint directory, as every other --model does: the shapes it
    measures are its preset's, and its decode step is timed (on the checkpoint's config)."""
    import models
    from dualjax.bench import calibrate
    cfg = models.get_config("tiny")
    ckpt = str(tmp_path / "tiny-ckpt")
    models.save_checkpoint(ckpt, models.init_params(cfg, 0), cfg)
    shapes = [calibrate.table_shapes(m, "agentic-tiny", 2048, 64, agents=2, turns=3, quick=True)
              for m in (ckpt, "tiny")]
    assert shapes[0] == shapes[1] and shapes[0]
    d0, d1 = calibrate.decode_fit(ckpt, 2, repeats=1)
    assert d0 >= 0 and d1 >= 0 and d0 + d1 > 0
