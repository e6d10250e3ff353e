"""A damaged Orbax checkpoint given to `--model` ends the command with one line naming the checkpoint and
what is missing or unreadable, exit code 2, before anything is served: never Orbax's traceback."""

import os
import shutil

import pytest

import models
from dualjax.cli import main as cli


@pytest.fixture(scope="module")
def saved(tiny, tmp_path_factory):
    path = tmp_path_factory.mktemp("saved") / "ckpt"
    models.save_checkpoint(str(path), tiny[1], tiny[0])
    return path


def _run(tmp_path, ckpt, capfd) -> tuple[int, list[str]]:
    capfd.readouterr()
    rc = cli.main(["run", "--embedded", "--quiet", "--agents", "1", "--turns", "1", "--model", str(ckpt),
                   "--out", str(tmp_path / "run"), "--store", str(tmp_path / "store")])
    return rc, capfd.readouterr().err.splitlines()


@pytest.mark.parametrize("removed", ["params/d", "params/ocdbt.process_0/d"])
def test_a_deleted_array_directory_is_named(saved, tmp_path, capfd, removed):
    ckpt = shutil.copytree(saved, tmp_path / "ckpt")
    shutil.rmtree(ckpt / removed)
    rc, err = _run(tmp_path, ckpt, capfd)
    assert rc == 2 and err == [f"dualjax run: error: damaged checkpoint {ckpt}: missing or empty {removed}/ "
                               f"(Orbax's files of its params)"]
    assert not (tmp_path / "run" / "requests.parquet").exists()


def test_an_unreadable_array_file_is_named(saved, tmp_path, capfd):
    """A data file deleted from a whole-looking checkpoint: the restore at start-up names the array."""
    ckpt = shutil.copytree(saved, tmp_path / "ckpt")
    data = ckpt / "params" / "ocdbt.process_0" / "d"
    os.remove(max(data.iterdir(), key=lambda f: f.stat().st_size))
    rc, err = _run(tmp_path, ckpt, capfd)
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith(f"dualjax run: error: damaged checkpoint {ckpt}: its params cannot be read: ")
    assert "Error reading" in err[0]
    assert not (tmp_path / "run" / "requests.parquet").exists()
