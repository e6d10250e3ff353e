"""Block store invariants on both I/O back ends: stable names, bit-exact round trips, miss
semantics, capacity. The POSIX back end's own mechanics are in test_posix.py."""

import os
import subprocess
import sys
import textwrap
import threading

import ml_dtypes
import numpy as np
import pytest
import tensorstore as ts

import kvstore as kv
from tests.kvstore.stores import (
    BACKENDS,
    LAYOUT,
    ON_DISK,
    blocks,
    chain,
    hashes,
    layer_in_file,
    layout,
    open_store,
    segment_files,
)


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param


@pytest.fixture(params=ON_DISK)
def on_disk(request):
    return request.param


@pytest.fixture
def store(tmp_path, backend):
    with open_store(backend, tmp_path / "store") as s:
        yield s


@pytest.fixture
def disk_store(tmp_path, on_disk):
    with open_store(on_disk, tmp_path / "store") as s:
        yield s


def test_layer_blocks_are_contiguous_slices_of_full_blocks():
    full = blocks(1)[0]
    layers = [full[layer] for layer in range(LAYOUT.n_layers)]
    assert all(x.flags.c_contiguous and x.shape == LAYOUT.layer_shape for x in layers)
    np.testing.assert_array_equal(np.stack(layers), full)
    assert LAYOUT.layer_bytes * LAYOUT.n_layers == LAYOUT.block_bytes == full.nbytes


def test_hashes_are_identical_across_processes():
    code = textwrap.dedent("""
        import numpy as np, kvstore as kv
        layout = kv.BlockLayout(n_layers=2, record_shape=(2, 2, 16), format="gqa:2x2x16:float32")
        print(",".join(b.hash for b in kv.block_chain(np.arange(64 * 3) % 251, layout)))
    """)
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
            for _ in range(2)}
    assert outs == {",".join(hashes(chain(3)))}


def test_hashes_chain_and_depend_on_fingerprint():
    a, b = chain(3), kv.block_chain(np.arange(64 * 3) % 251, layout(hash_seed=1))
    assert [x.parent for x in a] == [kv.ROOT, a[0].hash, a[1].hash]
    assert not {x.hash for x in a} & {x.hash for x in b}
    assert len(kv.block_chain(np.arange(64 * 3 - 1), LAYOUT)) == 2  # partial trailing block: no id
    for bad in ("xyz", "A" * 32, 5):
        with pytest.raises(ValueError, match="malformed block hash"):
            kv.check_hash(bad)


def test_each_kvstore_gets_its_back_end(tmp_path):
    with kv.BlockStore(kv.local_spec(tmp_path / "a"), LAYOUT) as s:
        assert isinstance(s.files, kv.posix.PosixBackend)
    with kv.BlockStore("memory://", LAYOUT) as s:
        assert isinstance(s.files, kv.tsbackend.TensorStoreBackend)
    with pytest.raises(kv.StoreError, match="io='posix' needs a local directory"):
        kv.BlockStore("memory://", LAYOUT, io="posix")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_round_trip_is_bit_exact(tmp_path, backend, dtype):
    lay = layout(dtype=dtype)
    ids, data = chain(4, lay), blocks(4, lay)
    with open_store(backend, tmp_path / "s", lay) as s:
        assert s.put(ids, data) == 4
        got = s.get_prefix(hashes(ids))
    assert len(got) == 4 and all(g.dtype == lay.np_dtype for g in got)
    bits = np.uint16 if dtype == "bfloat16" else np.uint32
    np.testing.assert_array_equal(np.stack(got).view(bits), data.view(bits))
    assert lay.np_dtype == (np.float32 if dtype == "float32" else ml_dtypes.bfloat16)


def test_tensorstore_reads_the_store_as_a_zarr3_array(store):
    """TensorStore's zarr3 driver reads every block of either back end's segments by its shard
    index (the entry after the blocks is ignored): the store is a zarr3 array."""
    ids, data = chain(3), blocks(3)
    store.put(ids, data)
    for b, want in zip(ids, data):
        np.testing.assert_array_equal(store.array[store.entries([b.hash])[0].slot].read().result(), want)


def test_either_back_end_reads_what_the_other_wrote(tmp_path):
    ids, data = chain(5), blocks(5)
    for writer, reader in (("posix", "tensorstore"), ("tensorstore", "posix")):
        with open_store(writer, tmp_path / writer) as s:
            s.put(ids[:2], data[:2])
            s.put(ids[2:], data[2:])
        with open_store(reader, tmp_path / writer) as s:
            np.testing.assert_array_equal(np.stack(s.get_prefix(hashes(ids))), data)


def test_a_put_of_more_than_a_segment_writes_several(tmp_path, disk_store, on_disk):
    n = disk_store.slots_per_segment + 6
    ids, data = chain(n), blocks(n)
    assert disk_store.put(ids, data) == n
    assert len(segment_files(tmp_path / "store")) == 2
    with open_store(on_disk, tmp_path / "store") as fresh:
        np.testing.assert_array_equal(np.stack(fresh.get_prefix(hashes(ids))), data)


def test_reopen_restores_index_and_put_twice_is_harmless(tmp_path, on_disk):
    ids, data = chain(3), blocks(3)
    with open_store(on_disk, tmp_path / "s") as s:
        assert s.put(ids, data) == 3 and s.put(ids, data) == 0
    with open_store(on_disk, tmp_path / "s") as s:
        assert s.stats()["blocks"] == 3
        assert s.match_prefix(hashes(ids) + [chain(1, offset=7)[0].hash]) == 3
        np.testing.assert_array_equal(np.stack(s.get_prefix(hashes(ids))), data)


def test_memory_stores_share_bytes_through_one_context():
    ctx = ts.Context()
    ids, data = chain(2), blocks(2)
    with kv.BlockStore("memory://", LAYOUT, context=ctx) as s:
        s.put(ids, data)
    with kv.BlockStore("memory://", LAYOUT, context=ctx) as s:
        np.testing.assert_array_equal(np.stack(s.get_prefix(hashes(ids))), data)


def test_fingerprint_mismatch_and_foreign_directory_refuse(tmp_path, on_disk):
    open_store(on_disk, tmp_path / "s").close()
    other = layout(block_tokens=32)
    with pytest.raises(kv.FingerprintMismatch, match=f"{LAYOUT.fingerprint()}.*{other.fingerprint()}"):
        open_store(on_disk, tmp_path / "s", other)
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "notes.txt").write_text("hello")
    with pytest.raises(kv.StoreError, match="not a dualjax store"):
        open_store(on_disk, tmp_path / "foreign")
    assert (tmp_path / "foreign" / "notes.txt").read_text() == "hello"


def test_bad_blocks_and_ids_are_rejected(store):
    ids = chain(2)
    with pytest.raises(ValueError, match="Full Blocks"):
        store.put(ids[:1], np.zeros((1, 2, 64, 2, 2, 8), np.float32))
    with pytest.raises(ValueError, match="Full Blocks"):
        store.put(ids[:1], np.zeros((1, *LAYOUT.full_shape), np.float16))
    forged = kv.BlockId(ids[1].hash, kv.ROOT, ids[1].tokens)
    with pytest.raises(ValueError, match="does not match"):
        store.put([forged], blocks(1))
    with pytest.raises(ValueError, match="malformed"):
        store.get(["../../etc/passwd"])


@pytest.mark.parametrize("fault", ["flip", "truncate", "delete", "delete-entry", "bad-entry"])
def test_corrupt_truncated_or_missing_block_is_a_miss_from_there_on(tmp_path, disk_store, on_disk, fault):
    ids, data = chain(5), blocks(5)
    disk_store.put(ids[:2], data[:2])
    disk_store.put(ids[2:], data[2:])  # one segment of three blocks
    victim = ids[3].hash
    path, offset = layer_in_file(tmp_path / "store", disk_store, victim, LAYOUT.n_layers - 1)
    entry = str(tmp_path / "store" / "index" / victim)
    if fault == "flip":
        raw = bytearray(open(path, "rb").read())
        raw[offset + LAYOUT.layer_bytes // 2] ^= 0x10
        open(path, "wb").write(bytes(raw))
    elif fault == "truncate":
        os.truncate(path, offset + LAYOUT.layer_bytes // 2)
    elif fault == "delete":
        os.remove(path)
    elif fault == "delete-entry":
        os.remove(entry)
    else:  # a new file in its place (writing through a link would garble the segment's shared entry)
        os.remove(entry)
        open(entry, "wb").write(b"DJIX5" + b"\0" * 20)
    fresh = open_store(on_disk, tmp_path / "store")  # no cached entries
    got = fresh.get_prefix(hashes(ids))
    # a deleted segment takes all its blocks; so does a truncated one where the index entries are
    # links to the file (POSIX), whose end, the entry, is gone; copies of the entry (TensorStore)
    # lose only the blocks cut
    lost_segment = fault == "delete" or (fault == "truncate" and on_disk == "posix")
    assert len(got) == (2 if lost_segment else 3)
    np.testing.assert_array_equal(np.stack(got), data[:len(got)])
    assert not fresh.contains(victim) and fresh.contains(ids[1].hash)
    if fault in ("flip", "truncate"):  # a bad block drops its whole segment
        assert not any(fresh.contains(b.hash) for b in ids[2:])
    if fault == "flip" or (fault == "truncate" and on_disk == "tensorstore"):
        assert not os.path.exists(path)  # file included
    if fault == "truncate" and on_disk == "posix":  # its entry lost, every block is a miss and the file is emptied
        assert os.path.getsize(path) == 0 and fresh.stats()["bad_blocks"] == 3
    fresh.close()


def test_a_block_cut_short_under_a_known_entry_is_a_miss(tmp_path, disk_store):
    """A segment truncated after its entry was read: the read itself finds the block short."""
    ids, data = chain(3), blocks(3)
    disk_store.put(ids, data)
    assert len(disk_store.get_prefix(hashes(ids))) == 3  # entries known now
    path, offset = layer_in_file(tmp_path / "store", disk_store, ids[1].hash, LAYOUT.n_layers - 1)
    os.truncate(path, offset + LAYOUT.layer_bytes // 2)  # block 1's last layer cut, block 0 whole
    assert len(disk_store.get_prefix(hashes(ids))) == 1 and disk_store.stats()["bad_blocks"] == 1
    assert not os.path.exists(path) and not any(disk_store.contains(b.hash) for b in ids)


def test_a_get_in_any_order_lands_each_block_in_its_row(store):
    """Reads go in slot order whatever the order asked: a read task of rows [0, 2, 1, 3] here."""
    ids, data = chain(8), blocks(8)
    store.put(ids, data)
    order = [0, 2, 1, 3, 4, 5, 6, 7]
    got = [r.result() for r in store.get([ids[i].hash for i in order])]
    np.testing.assert_array_equal(np.stack(got), data[order])


def test_get_allocates_a_page_aligned_buffer(store):
    """A buffer `get` allocates starts on a page (a kernel copy into one 16 bytes past a page, where
    NumPy's large arrays start, runs at a fraction of its speed on some CPUs)."""
    ids, data = chain(2), blocks(2)
    store.put(ids, data)
    rows = [r.result() for r in store.get(hashes(ids))]
    assert rows[0].ctypes.data % kv.layout.ALIGN == 0 and rows[1].base is rows[0].base
    np.testing.assert_array_equal(np.stack(rows), data)
    assert LAYOUT.empty(3).shape == (3, *LAYOUT.full_shape) and LAYOUT.empty(3).ctypes.data % kv.layout.ALIGN == 0


def test_reads_land_in_a_buffer_whose_layer_blocks_are_strided(store):
    """A buffer viewed [n, L, T, ...] out of [T, n, L, ...] (no Layer Block contiguous) gets
    exactly the blocks, whole or some layers, and nothing else."""
    ids, data = chain(3), blocks(3)
    store.put(ids, data)
    backing = np.zeros((LAYOUT.block_tokens, 3, LAYOUT.n_layers, *LAYOUT.record_shape), np.float32)
    out = backing.transpose(1, 2, 0, 3, 4, 5)
    assert all(r.result() is not None for r in store.get(hashes(ids), out, layers=range(1, 2)))
    np.testing.assert_array_equal(out[:, 1], data[:, 1])
    assert not out[:, 0].any()
    assert all(r.result() is not None for r in store.get(hashes(ids), out))
    np.testing.assert_array_equal(out, data)


def test_failed_put_raises_and_keeps_visible_blocks_intact(tmp_path, disk_store, on_disk):
    ids, data = chain(4), blocks(4)
    disk_store.put(ids[:2], data[:2])
    # Make the next segment's file name a directory, so the write fails.
    slot = (disk_store._writer << kv.segments.COUNTER_BITS) | disk_store._counter
    os.makedirs(tmp_path / "store" / "data" / kv.segments.segment_key(LAYOUT, slot // disk_store.slots_per_segment))
    with pytest.raises(kv.StoreError, match="writing 2 blocks failed") as e:
        disk_store.put(ids[2:], data[2:])
    assert e.value.cause in ("EISDIR", "EEXIST") and disk_store.stats()["write_failures"] == 1
    with open_store(on_disk, tmp_path / "store") as fresh:
        assert fresh.match_prefix(hashes(ids)) == 2
        np.testing.assert_array_equal(np.stack(fresh.get_prefix(hashes(ids))), data[:2])


def test_lru_eviction_respects_budget_and_pins(tmp_path, backend):
    ids, data = chain(6), blocks(6)
    with open_store(backend, tmp_path / "s", capacity_bytes=3 * LAYOUT.block_bytes) as s:
        for i in range(3):  # one block per put: one segment each
            s.put(ids[i:i + 1], data[i:i + 1])
        s.get_prefix([ids[0].hash])  # ids[0] is now most recently used
        s.put(ids[3:4], data[3:4])
        assert [s.contains(b.hash) for b in ids[:4]] == [True, False, True, True]
        with s.pinned([ids[2].hash]):  # least recently used now, but pinned: ids[0] goes instead
            s.put(ids[4:5], data[4:5])
            assert [s.contains(b.hash) for b in ids[:5]] == [False, False, True, True, True]
        assert s.stats()["bytes"] <= 3 * LAYOUT.block_bytes
    with pytest.raises(kv.StoreError, match="smaller than one block"):
        open_store(backend, tmp_path / "t", capacity_bytes=100)


def test_eviction_frees_whole_segments_and_reading_one_block_keeps_its_segment(tmp_path, backend):
    ids, data = chain(6), blocks(6)
    with open_store(backend, tmp_path / "s", capacity_bytes=4 * LAYOUT.block_bytes) as s:
        s.put(ids[0:2], data[0:2])  # segment A
        s.put(ids[2:4], data[2:4])  # segment B
        s.get_prefix([ids[0].hash])  # A is most recently used, ids[1] with it
        s.put(ids[4:5], data[4:5])  # one block over: all of B goes
        assert [s.contains(b.hash) for b in ids[:5]] == [True, True, False, False, True]
        assert s.stats()["bytes"] == 3 * LAYOUT.block_bytes and s.stats()["evicted"] == 2
        assert s.put(ids, data) == 3  # B's blocks and ids[5] return, in segments that fit the budget
        assert s.stats()["bytes"] <= 4 * LAYOUT.block_bytes
        np.testing.assert_array_equal(np.stack(s.get_prefix(hashes(ids[2:]))), data[2:])


def test_a_put_larger_than_the_budget_stores_its_leading_blocks(tmp_path, backend):
    ids, data = chain(5), blocks(5)
    with open_store(backend, tmp_path / "s", capacity_bytes=2 * LAYOUT.block_bytes) as s:
        assert s.put(ids, data) == 2 and s.match_prefix(hashes(ids)) == 2
        assert s.stats()["bytes"] == 2 * LAYOUT.block_bytes


def test_two_processes_write_one_directory_at_once(tmp_path, on_disk):
    spec = kv.local_spec(tmp_path / "s")
    open_store(on_disk, tmp_path / "s").close()
    code = textwrap.dedent(f"""
        import numpy as np, kvstore as kv, sys
        layout = kv.BlockLayout(n_layers=2, record_shape=(2, 2, 16), format="gqa:2x2x16:float32")
        off = int(sys.argv[1])
        ids = kv.block_chain((np.arange(64 * 20) + off) % 251, layout)
        blocks = np.random.default_rng(off).standard_normal((20, *layout.full_shape)).astype(np.float32)
        with kv.BlockStore({spec!r}, layout, io={on_disk!r}) as s:
            for i in range(20):
                s.put(ids[i:i + 1], blocks[i:i + 1])
    """)
    procs = [subprocess.Popen([sys.executable, "-c", code, str(off)]) for off in (0, 100)]
    assert all(p.wait() == 0 for p in procs)
    with open_store(on_disk, tmp_path / "s") as s:
        for off in (0, 100):
            ids = kv.block_chain((np.arange(64 * 20) + off) % 251, LAYOUT)
            want = np.random.default_rng(off).standard_normal((20, *LAYOUT.full_shape)).astype(np.float32)
            np.testing.assert_array_equal(np.stack(s.get_prefix(hashes(ids))), want)


def test_concurrent_readers_and_writer_in_one_process(store):
    ids, data = chain(30), blocks(30)
    errors = []

    def reader():
        for _ in range(20):
            got = store.get_prefix(hashes(ids))
            if any(not np.array_equal(g, w) for g, w in zip(got, data)):
                errors.append("wrong bytes")

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    for i in range(30):
        store.put(ids[i:i + 1], data[i:i + 1])
    for t in threads:
        t.join()
    assert not errors


def test_a_bad_block_is_dropped_with_its_segment_and_rewritten_by_the_next_put(tmp_path, disk_store):
    ids, data = chain(4), blocks(4)
    disk_store.put(ids[:1], data[:1])
    disk_store.put(ids[1:], data[1:])
    path, offset = layer_in_file(tmp_path / "store", disk_store, ids[2].hash)
    raw = bytearray(open(path, "rb").read())
    raw[offset + 10] ^= 0xFF
    open(path, "wb").write(bytes(raw))
    assert len(disk_store.get_prefix(hashes(ids))) == 2
    assert disk_store.stats()["bad_blocks"] == 1 and disk_store.stats()["invalidated"] == 3
    assert [disk_store.contains(b.hash) for b in ids] == [True, False, False, False]
    assert disk_store.put(ids, data) == 3  # only the dropped segment's blocks are written again
    np.testing.assert_array_equal(np.stack(disk_store.get_prefix(hashes(ids))), data)


@pytest.mark.parametrize("version", [1, 3])
def test_a_store_of_another_format_version_is_refused(tmp_path, on_disk, version):
    open_store(on_disk, tmp_path / "s").close()
    manifest = tmp_path / "s" / kv.MANIFEST
    manifest.write_text(manifest.read_text().replace(f'"version": {kv.FORMAT_VERSION}', f'"version": {version}'))
    with pytest.raises(kv.StoreError, match=f"store format version {version} is not this dualjax's version "
                                            f"{kv.FORMAT_VERSION}; use a new store directory or delete the old store"):
        open_store(on_disk, tmp_path / "s")


@pytest.mark.parametrize("n_layers,dtype", [(2, "bfloat16"), (40, "float32")])  # 40 x 64: > IOV_MAX Layer Blocks
def test_reads_land_in_a_layer_major_buffer(tmp_path, on_disk, n_layers, dtype):
    """A buffer laid out [L, n, T, ...] (rows not contiguous, each Layer Block contiguous) gets
    exactly the blocks, whole or a layer at a time, and a truncated segment is still a miss."""
    lay = layout(n_layers=n_layers, record_shape=(1, 1, 4), block_tokens=4, dtype=dtype)
    n = 64
    ids, data = chain(n, lay), blocks(n, lay)
    with open_store(on_disk, tmp_path / "store", lay) as s:
        s.put(ids, data)
        by_layer = np.zeros((n_layers, n, *lay.full_shape[1:]), lay.np_dtype)
        out = np.swapaxes(by_layer, 0, 1)
        assert all(r.result() is not None for r in s.get(hashes(ids), out))
        np.testing.assert_array_equal(out, data)
        out[:] = 0
        for layer in range(n_layers):
            assert all(r.result() is not None for r in s.get(hashes(ids), out, layers=range(layer, layer + 1)))
        np.testing.assert_array_equal(out, data)
        path, offset = layer_in_file(tmp_path / "store", s, ids[-1].hash, n_layers - 1)
        os.truncate(path, offset + lay.layer_bytes // 2)  # entries known: the read finds the cut
        assert [r.result() is not None for r in s.get(hashes(ids), out)] == [True] * (n - 1) + [False]
