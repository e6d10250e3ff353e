"""Benchmark helpers: the page cache is dropped and loaded file by file, each file once."""

import os

import pytest

from dualjax.bench.common import _files, drop_page_cache, emit, gbps, load_page_cache, timed
from dualjax.outputs import OutputError
from kvstore.pagecache import page_cached


def test_load_page_cache(tmp_path):
    """What the warm figures of `bench dataplane` read after its cold run: the store reads a block
    whose first page is not cached past the page cache, so without this its files would stay cold."""
    path = tmp_path / "d" / "f.bin"
    path.parent.mkdir()
    path.write_bytes(os.urandom(4 << 20))
    drop_page_cache([str(tmp_path)])
    fd = os.open(path, os.O_RDONLY)
    try:
        if page_cached(fd, 0) and page_cached(fd, (4 << 20) - 4096):
            pytest.skip("this file system keeps the file in the page cache")
        load_page_cache([str(tmp_path)])
        assert page_cached(fd, 0) and page_cached(fd, (4 << 20) - 4096)
    finally:
        os.close(fd)


def test_hard_links_once(tmp_path):
    """A store's index entries are hard links to its segment files: each file is read (or dropped) once."""
    (tmp_path / "data").mkdir()
    (tmp_path / "index").mkdir()
    (tmp_path / "data" / "seg").write_bytes(b"x" * 4096)
    for h in ("a", "b", "c"):
        os.link(tmp_path / "data" / "seg", tmp_path / "index" / h)
    (tmp_path / "other").write_bytes(b"y")
    assert len(_files([str(tmp_path)])) == 2


def test_emit_reports_a_json_file_it_cannot_write_in_one_line(capsys):
    # the result is printed first; the file write then fails (a full disk) as the CLI's one-line error
    with pytest.raises(OutputError, match="cannot write /dev/full"):
        emit({"jct_s": 1.0}, "/dev/full")
    assert '"jct_s": 1.0' in capsys.readouterr().out


def test_gbps_and_timed_by_hand(monkeypatch):
    """3e9 bytes in 1.5 s are 2 GB/s. A call timed while the wall clock reads 10 then 10.25 s and the
    CPU clock 4 then 4.1 s took 0.25 s of wall and 0.1 s of CPU, started at 10, and returns its result."""
    assert gbps(3_000_000_000, 1.5) == 2.0
    wall, cpu = iter([10.0, 10.25]), iter([4.0, 4.1])
    monkeypatch.setattr("time.perf_counter", lambda: next(wall))
    monkeypatch.setattr("time.process_time", lambda: next(cpu))
    t = timed(lambda x, y=0: x + y, 2, y=3)
    assert t.start == 10.0 and t.wall_s == 0.25 and t.cpu_s == pytest.approx(0.1) and t.result == 5
