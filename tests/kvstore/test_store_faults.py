"""A store is a cache: failed writes are blocks not cached, a byte budget evicts LRU blocks (never
one being read), and everything that is read is still bit-exact."""

import errno
import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import kvstore as kv
from tests.kvstore.stores import BACKENDS, LAYOUT, ON_DISK, open_store, segment_files


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param


def _data(n, offset=0):
    ids = kv.block_chain(np.arange(offset, offset + n * LAYOUT.block_tokens) % 251, LAYOUT)
    blocks = np.random.default_rng(offset).standard_normal((n, *LAYOUT.full_shape)).astype(np.float32)
    return ids, blocks


def test_slots_derive_from_one_constant_and_segments_align(tmp_path):
    with kv.BlockStore(kv.local_spec(tmp_path / "s"), LAYOUT) as s:
        assert s.array.shape[0] == 1 << kv.SLOT_BITS
        S = s.slots_per_segment
        assert S == kv.segments.segment_slots(LAYOUT) == kv.segments.MAX_SEGMENT_SLOTS  # 32 KiB blocks: 64 per segment
        firsts = [s._next_segment() for _ in range(3)]
        assert all(0 <= x < 1 << kv.SLOT_BITS and x % S == 0 for x in firsts) and firsts[1] == firsts[0] + S
        assert s._writer < 1 << kv.store.WRITER_BITS and kv.store.WRITER_BITS + kv.segments.COUNTER_BITS == 54
    big = kv.BlockLayout(n_layers=64, record_shape=(2, 8, 128), dtype="bfloat16")  # 16 MiB blocks
    assert kv.segments.segment_slots(big) == 4


def test_a_failed_write_is_a_block_not_cached_logged_once_per_cause(tmp_path, backend, monkeypatch, caplog):
    ids, blocks = _data(4)
    with open_store(backend, tmp_path / "s") as s:
        faults = iter([errno.ENOSPC, errno.ENOSPC, errno.EIO])

        def failing(todo):
            raise OSError(next(faults), "injected")

        monkeypatch.setattr(s.files, "write", failing)
        with caplog.at_level(logging.WARNING, logger="kvstore.store"):
            assert [s.cache(ids[i:i + 1], blocks[i:i + 1]) for i in range(3)] == [0, 0, 0]
        warnings = [r.getMessage() for r in caplog.records]
        assert len(warnings) == 2 and "ENOSPC" in warnings[0] and "EIO" in warnings[1]
        assert s.stats()["write_failures"] == 3 and s.match_prefix([b.hash for b in ids]) == 0
        monkeypatch.undo()
        assert s.cache(ids, blocks) == 4  # the next turn writes them
        np.testing.assert_array_equal(np.stack(s.get_prefix([b.hash for b in ids])), blocks)
        with pytest.raises(ValueError, match="Full Blocks"):  # a bug still raises
            s.cache(ids[:1], blocks[:1, :1])


@pytest.mark.parametrize("on_disk", ON_DISK)
def test_eviction_deletes_segment_files_and_keeps_reads_exact(tmp_path, on_disk):
    ids, blocks = _data(12)
    with open_store(on_disk, tmp_path / "s", capacity_bytes=3 * LAYOUT.block_bytes) as s:
        for i in range(12):
            s.put(ids[i:i + 1], blocks[i:i + 1])
            got = s.get([b.hash for b in ids[:i + 1]])
            for j, r in enumerate(got):
                row = r.result()
                assert row is None or np.array_equal(row, blocks[j])
        assert s.stats()["evicted"] == 9 and s.stats()["bad_blocks"] == 0
        assert [s.contains(b.hash) for b in ids] == [False] * 9 + [True] * 3
    assert len(os.listdir(tmp_path / "s" / "index")) == 3
    assert len(segment_files(tmp_path / "s")) == 3


@pytest.mark.parametrize("on_disk", ON_DISK)
def test_a_block_being_read_by_another_store_on_the_directory_is_not_evicted(tmp_path, on_disk):
    ids, blocks = _data(4)
    reader = open_store(on_disk, tmp_path / "s")
    writer = open_store(on_disk, tmp_path / "s", capacity_bytes=2 * LAYOUT.block_bytes)
    writer.put(ids[:1], blocks[:1])  # two puts: two segments
    writer.put(ids[1:2], blocks[1:2])
    inflight = reader.get([ids[0].hash])  # pinned until result()
    writer.put(ids[2:3], blocks[2:3])  # over budget: the oldest unpinned segment goes, not ids[0]'s
    assert writer.contains(ids[0].hash) and not writer.contains(ids[1].hash)
    np.testing.assert_array_equal(inflight[0].result(), blocks[0])


@pytest.mark.parametrize("on_disk", ON_DISK)
def test_a_segment_pinned_during_the_last_write_is_evicted_when_its_read_ends(tmp_path, on_disk):
    ids, blocks = _data(3)
    reader = open_store(on_disk, tmp_path / "s")
    writer = open_store(on_disk, tmp_path / "s", capacity_bytes=2 * LAYOUT.block_bytes)
    writer.put(ids[:2], blocks[:2])  # one segment
    inflight = reader.get([ids[1].hash])
    writer.put(ids[2:3], blocks[2:3])  # the only older segment is being read: kept, over budget for now
    assert writer.stats()["bytes"] == 3 * LAYOUT.block_bytes and writer.stats()["evicted"] == 0
    np.testing.assert_array_equal(inflight[0].result(), blocks[1])  # the read ends: its segment goes
    assert [writer.contains(b.hash) for b in ids] == [False, False, True]
    assert writer.stats()["bytes"] == LAYOUT.block_bytes and writer.stats()["evicted"] == 2  # whole segments go
    assert len(segment_files(tmp_path / "s")) == 1


@pytest.mark.parametrize("on_disk", ON_DISK)
def test_a_store_that_cannot_be_written_fails_at_open_in_one_short_line(tmp_path, on_disk):
    open_store(on_disk, tmp_path / "s").close()
    shutil.rmtree(tmp_path / "s" / "index")
    (tmp_path / "s" / "index").write_text("not a directory")
    with pytest.raises(kv.StoreError, match="cannot open store") as e:
        open_store(on_disk, tmp_path / "s")
    assert "\n" not in str(e.value) and len(str(e.value)) < 300 and "tensorstore_spec" not in str(e.value)


def _small_filesystem_works(path) -> bool:
    if not shutil.which("unshare"):
        return False
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=64k none {path}"],
                           capture_output=True)
    return probe.returncode == 0


def test_a_full_filesystem_fails_writes_not_the_store(tmp_path):
    """A real ENOSPC: a 256 KiB tmpfs (in a user namespace) holds ~7 blocks of 32 KiB."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if not _small_filesystem_works(mnt):
        pytest.skip("cannot mount a small tmpfs in a user namespace here")
    code = textwrap.dedent(f"""
        import json, numpy as np, kvstore as kv
        layout = kv.BlockLayout(n_layers=2, record_shape=(2, 2, 16), format="gqa:2x2x16:float32")
        ids = kv.block_chain(np.arange(20 * 64) % 251, layout)
        blocks = np.random.default_rng(0).standard_normal((20, *layout.full_shape)).astype(np.float32)
        with kv.BlockStore(kv.local_spec({str(mnt / "s")!r}), layout) as s:
            stored = [s.cache(ids[i:i + 1], blocks[i:i + 1]) for i in range(20)]
            got = s.get_prefix([b.hash for b in ids])
            exact = all(np.array_equal(g, b) for g, b in zip(got, blocks))
            print(json.dumps({{"stored": stored, "read": len(got), "exact": exact, **s.stats()}}))
    """)
    proc = subprocess.run(["unshare", "-rm", "sh", "-c", f'mount -t tmpfs -o size=256k none {mnt} && '
                           f'"{sys.executable}" -c "$0"', code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert 0 < sum(out["stored"]) < 20 and out["write_failures"] == 20 - sum(out["stored"])
    assert out["exact"] and out["read"] == out["stored"].index(0)
    assert proc.stderr.count("KV store write failed (ENOSPC)") == 1  # logged once


def test_temp_files_of_a_killed_writer_are_never_read(tmp_path):
    spec, ids, blocks = kv.local_spec(tmp_path / "s"), *_data(2)
    with kv.BlockStore(spec, LAYOUT) as s:
        s.put(ids, blocks)
    (tmp_path / "s" / "index" / "stray.tmp").write_bytes(b"DJIX6 partial")
    (tmp_path / "s" / "data" / "5.0.0.0.0.0.123-4.tmp").write_bytes(b"partial")
    with kv.BlockStore(spec, LAYOUT) as s:
        assert s.stats()["blocks"] == 2 and s.stats()["bad_blocks"] == 0
        np.testing.assert_array_equal(np.stack(s.get_prefix([b.hash for b in ids])), blocks)
