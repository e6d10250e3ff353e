"""Block store invariants: stable names, bit-exact round trips, miss semantics, capacity, faults."""

import errno
import fcntl
import os
import subprocess
import sys
import textwrap
import threading

import ml_dtypes
import numpy as np
import pytest
import xxhash

import kvstore as kv


def _layout(**kw):
    return kv.BlockLayout(**{"n_layers": 2, "record_shape": (2, 2, 16), "format": "gqa:2x2x16:float32", **kw})


LAYOUT = _layout()


def _blocks(n, layout=LAYOUT, seed=0):
    return np.random.default_rng(seed).standard_normal((n, *layout.full_shape)).astype(layout.np_dtype)


def _chain(n, layout=LAYOUT, offset=0):
    return kv.block_chain(np.arange(offset, offset + n * layout.block_tokens) % 251, layout)


@pytest.fixture
def store(tmp_path):
    with kv.BlockStore(kv.local_spec(tmp_path / "store"), LAYOUT) as s:
        yield s


def test_layer_blocks_are_contiguous_slices_of_full_blocks():
    full = _blocks(1)[0]
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
    assert outs == {",".join(b.hash for b in _chain(3))}


def test_hashes_chain_and_depend_on_fingerprint():
    a, b = _chain(3), kv.block_chain(np.arange(64 * 3) % 251, _layout(hash_seed=1))
    assert [x.parent for x in a] == [kv.ROOT, a[0].hash, a[1].hash]
    assert not {x.hash for x in a} & {x.hash for x in b}
    assert len(kv.block_chain(np.arange(64 * 3 - 1), LAYOUT)) == 2  # partial trailing block: no id
    for bad in ("xyz", "A" * 32, 5):
        with pytest.raises(ValueError, match="malformed block hash"):
            kv.check_hash(bad)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_round_trip_is_bit_exact(tmp_path, dtype):
    layout = _layout(dtype=dtype)
    ids, blocks = _chain(4, layout), _blocks(4, layout)
    with kv.BlockStore("memory://", layout) as s:
        assert s.put(ids, blocks) == 4
        got = s.get_prefix([b.hash for b in ids])
    assert len(got) == 4 and all(g.dtype == layout.np_dtype for g in got)
    np.testing.assert_array_equal(np.stack(got).view(np.uint16 if dtype == "bfloat16" else np.uint32),
                                  blocks.view(np.uint16 if dtype == "bfloat16" else np.uint32))
    assert layout.np_dtype == (np.float32 if dtype == "float32" else ml_dtypes.bfloat16)


def test_one_put_is_one_file_and_each_block_is_a_link_to_it(tmp_path, store):
    ids, blocks = _chain(5), _blocks(5)
    store.put(ids[:3], blocks[:3])
    store.put(ids[3:], blocks[3:])
    data = [f for f in os.listdir(tmp_path / "store" / "data") if f != "zarr.json"]
    assert len(data) == 2 and \
        not [f for d in ("data", "index") for f in os.listdir(tmp_path / "store" / d) if f.endswith(".tmp")]
    links = [os.stat(tmp_path / "store" / "index" / b.hash) for b in ids]
    S, L = store.slots_per_segment, LAYOUT.n_layers
    path, offset = _layer_in_file(tmp_path, store, ids[4].hash)
    assert os.stat(path).st_ino == links[4].st_ino == links[3].st_ino != links[0].st_ino  # the file holds the entry
    assert len({e.st_ino for e in links[:3]}) == 1 and links[0].st_nlink == 4 and links[3].st_nlink == 3
    entry = 7 + 2 * (16 + 24 + 8 * L + 4 * LAYOUT.block_tokens) + 12  # head, 2 x (hash, record), checksum, length
    assert os.path.getsize(path) == S * L * 16 + 2 * LAYOUT.block_bytes + entry
    raw = np.fromfile(path, np.uint8)
    assert offset == S * L * 16 + LAYOUT.layer_bytes  # layer-major: block 3's layer 0, block 4's, block 3's layer 1 ...
    assert _layer_in_file(tmp_path, store, ids[3].hash, 1)[1] == offset + LAYOUT.layer_bytes
    layers = [_layer_in_file(tmp_path, store, ids[4].hash, layer)[1] for layer in range(L)]
    np.testing.assert_array_equal(np.stack([raw[o:o + LAYOUT.layer_bytes] for o in layers]).view(np.float32).reshape(
        LAYOUT.full_shape), blocks[4])
    body = raw[-entry:-12].tobytes()
    assert body[:7] == b"DJIX6" + (2).to_bytes(2, "little") and body[7:23].hex() == ids[3].hash
    tail = raw[-12:].tobytes()
    assert int.from_bytes(tail[:8], "little") == xxhash.xxh3_64_intdigest(body)
    assert int.from_bytes(tail[8:], "little") == entry - 4


def test_tensorstore_reads_a_segment_despite_its_entry(tmp_path, store):
    """The zarr3 driver reads a segment file by its shard index and ignores the entry after the
    blocks: the path for non-file kvstores and for buffers whose Layer Blocks are not contiguous."""
    ids, blocks = _chain(3), _blocks(3)
    store.put(ids, blocks)
    for b, want in zip(ids, blocks):
        np.testing.assert_array_equal(store.array[store.entries([b.hash])[0][0]].read().result(), want)


def test_a_put_of_more_than_a_segment_writes_several(tmp_path, store):
    n = store.slots_per_segment + 6
    ids, blocks = _chain(n), _blocks(n)
    assert store.put(ids, blocks) == n
    assert len([f for f in os.listdir(tmp_path / "store" / "data") if f != "zarr.json"]) == 2
    fresh = kv.BlockStore(kv.local_spec(tmp_path / "store"), LAYOUT)
    np.testing.assert_array_equal(np.stack(fresh.get_prefix([b.hash for b in ids])), blocks)
    fresh.close()


def test_reopen_restores_index_and_put_twice_is_harmless(tmp_path):
    spec = kv.local_spec(tmp_path / "s")
    ids, blocks = _chain(3), _blocks(3)
    with kv.BlockStore(spec, LAYOUT) as s:
        assert s.put(ids, blocks) == 3 and s.put(ids, blocks) == 0
    with kv.BlockStore(spec, LAYOUT) as s:
        assert s.stats()["blocks"] == 3
        assert s.match_prefix([b.hash for b in ids] + [_chain(1, offset=7)[0].hash]) == 3
        np.testing.assert_array_equal(np.stack(s.get_prefix([b.hash for b in ids])), blocks)


def test_fingerprint_mismatch_and_foreign_directory_refuse(tmp_path):
    spec = kv.local_spec(tmp_path / "s")
    kv.BlockStore(spec, LAYOUT).close()
    other = _layout(block_tokens=32)
    with pytest.raises(kv.FingerprintMismatch, match=f"{LAYOUT.fingerprint()}.*{other.fingerprint()}"):
        kv.BlockStore(spec, other)
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "notes.txt").write_text("hello")
    with pytest.raises(kv.StoreError, match="not a dualjax store"):
        kv.BlockStore(kv.local_spec(tmp_path / "foreign"), LAYOUT)


def test_bad_blocks_and_ids_are_rejected(store):
    ids = _chain(2)
    with pytest.raises(ValueError, match="Full Blocks"):
        store.put(ids[:1], np.zeros((1, 2, 64, 2, 2, 8), np.float32))
    with pytest.raises(ValueError, match="Full Blocks"):
        store.put(ids[:1], np.zeros((1, *LAYOUT.full_shape), np.float16))
    forged = kv.BlockId(ids[1].hash, kv.ROOT, ids[1].tokens)
    with pytest.raises(ValueError, match="does not match"):
        store.put([forged], _blocks(1))
    with pytest.raises(ValueError, match="malformed"):
        store.get(["../../etc/passwd"])


def _layer_in_file(tmp_path, store, h, layer=0, layout=LAYOUT):
    """(segment file, offset of block `h`'s Layer Block `layer` in it): the shard index (S·L
    (offset, length) pairs of <u8) comes first, then the segment's n blocks layer-major (layer 0
    of each in slot order, then layer 1, ...), then its entry."""
    slot, _, (k, n) = store.entries([h])[0]
    S = store.slots_per_segment
    path = tmp_path / "store" / "data" / store.files.segment_key(slot // S)
    return str(path), S * layout.n_layers * 16 + (layer * n + k) * layout.layer_bytes


@pytest.mark.parametrize("fault", ["flip", "truncate", "delete", "delete-entry", "bad-entry"])
def test_corrupt_truncated_or_missing_block_is_a_miss_from_there_on(tmp_path, store, fault):
    ids, blocks = _chain(5), _blocks(5)
    store.put(ids[:2], blocks[:2])
    store.put(ids[2:], blocks[2:])  # one segment of three blocks
    victim = ids[3].hash
    path, offset = _layer_in_file(tmp_path, store, victim, LAYOUT.n_layers - 1)
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
    else:  # a new file in its place (writing through the path would garble the segment's shared entry file)
        os.remove(entry)
        open(entry, "wb").write(b"DJIX5" + b"\0" * 20)
    fresh = kv.BlockStore(kv.local_spec(tmp_path / "store"), LAYOUT)  # no cached entries
    got = fresh.get_prefix([b.hash for b in ids])
    # a deleted segment file takes all its blocks, and so does a truncated one (its entry is at its end)
    assert len(got) == (2 if fault in ("delete", "truncate") else 3)
    np.testing.assert_array_equal(np.stack(got), blocks[:len(got)])
    assert not fresh.contains(victim) and fresh.contains(ids[1].hash)
    if fault == "flip":  # a bad block drops its whole segment, file included
        assert not any(fresh.contains(b.hash) for b in ids[2:]) and not os.path.exists(path)
    if fault == "truncate":  # its entry lost, every block of it is a miss and the file is emptied
        assert not any(fresh.contains(b.hash) for b in ids[2:]) and os.path.getsize(path) == 0
        assert fresh.stats()["bad_blocks"] == 3
    fresh.close()


def test_a_block_cut_short_under_a_known_entry_is_a_miss(tmp_path, store):
    """A segment truncated after its entry was read: the read itself finds the block short."""
    ids, blocks = _chain(3), _blocks(3)
    store.put(ids, blocks)
    assert len(store.get_prefix([b.hash for b in ids])) == 3  # entries known now
    path, offset = _layer_in_file(tmp_path, store, ids[1].hash, LAYOUT.n_layers - 1)
    os.truncate(path, offset + LAYOUT.layer_bytes // 2)  # block 1's last layer cut, block 0 whole
    assert len(store.get_prefix([b.hash for b in ids])) == 1 and store.stats()["bad_blocks"] == 1
    assert not os.path.exists(path) and not any(store.contains(b.hash) for b in ids)


@pytest.mark.parametrize("rows", ["blocks", "layer-major"])
def test_reads_preadv_a_chunk_at_a_time_checked_and_announce_only_cold_runs(tmp_path, store, monkeypatch, rows):
    """Every read is `preadv`s of at most `VERIFY_BYTES`, each a run of adjacent Layer Blocks in the
    file (layer-major: one layer of consecutive blocks), each Layer Block checked as it lands; a
    cold read first tells the kernel about each run, a warm one does not; a corrupted Layer Block
    and a block past a truncated file's end are misses. Into whole-block rows and into a
    layer-major buffer (its rows strided) alike."""
    calls, real, cold = [], os.preadv, [False]

    def preadv(fd, bufs, *a):
        calls.append(sum(memoryview(b).nbytes for b in bufs))
        return real(fd, bufs, *a)
    monkeypatch.setattr(kv.reads.os, "preadv", preadv)
    real_cached = kv.pagecache.page_cached
    monkeypatch.setattr(kv.reads, "page_cached", lambda fd, offset: not cold[0] and real_cached(fd, offset))
    monkeypatch.setattr(kv.reads, "set_direct", lambda fd, on=True: False)  # a file system without O_DIRECT
    advised = []
    monkeypatch.setattr(kv.reads.os, "posix_fadvise", lambda fd, offset, length, advice: advised.append(
        (offset, length, advice)))
    assert LAYOUT.n_layers == 2
    monkeypatch.setattr(kv.reads, "VERIFY_BYTES", 3 * LAYOUT.layer_bytes)
    ids, blocks = _chain(3), _blocks(3)
    store.put(ids, blocks)
    hashes = [b.hash for b in ids]

    def get(hs):  # into rows of whole blocks, or into a layer-major buffer's strided rows
        out = LAYOUT.empty(len(hs)) if rows == "blocks" else \
            np.zeros((LAYOUT.n_layers, len(hs), *LAYOUT.full_shape[1:]), LAYOUT.np_dtype).swapaxes(0, 1)
        return [r.result() for r in store.get(hs, out)]
    np.testing.assert_array_equal(np.stack(get(hashes)), blocks)
    # `get` gives blocks 0-1 to one task, 2 to the other: layer 0 of blocks 0-1 is one call, layer 1's another
    assert sorted(calls) == [LAYOUT.layer_bytes] * 2 + [2 * LAYOUT.layer_bytes] * 2 and not advised  # warm: nothing
    cold[0] = True
    np.testing.assert_array_equal(np.stack(get(hashes)), blocks)
    _, first = _layer_in_file(tmp_path, store, ids[0].hash)
    spans = sorted(advised)  # one per run of consecutive blocks in a read task (`get` gives both threads some)
    assert {a for _, _, a in spans} == {os.POSIX_FADV_WILLNEED} and spans[0][0] == first and \
        all(o + n == next_o for (o, n, _), (next_o, _, _) in zip(spans, spans[1:])) and \
        spans[-1][0] + spans[-1][1] == first + 3 * LAYOUT.block_bytes
    cold[0] = False
    calls.clear()
    advised.clear()
    out = np.zeros_like(blocks)
    assert all(r.result() is not None for r in store.get(hashes, out, layers=range(1, 2)))
    np.testing.assert_array_equal(out[:, 1], blocks[:, 1])
    assert sorted(calls) == [LAYOUT.layer_bytes, 2 * LAYOUT.layer_bytes] and not out[:, 0].any()
    path, offset = _layer_in_file(tmp_path, store, ids[1].hash, LAYOUT.n_layers - 1)
    with open(path, "r+b") as f:  # in place: same file, same size
        f.seek(offset + 5)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x40]))
    got = get(hashes)
    assert got[1] is None and store.stats()["bad_blocks"] == 1
    np.testing.assert_array_equal(got[0], blocks[0])
    ids, blocks = _chain(3, offset=1000), _blocks(3, seed=7)
    store.put(ids, blocks)
    assert len(store.get_prefix([b.hash for b in ids])) == 3  # entries known now
    path, offset = _layer_in_file(tmp_path, store, ids[1].hash, LAYOUT.n_layers - 1)
    os.truncate(path, offset + LAYOUT.layer_bytes // 2)  # block 0's Layer Blocks are whole, 1's last cut, 2's last gone
    got = get([b.hash for b in ids])
    np.testing.assert_array_equal(got[0], blocks[0])
    assert got[1] is None and got[2] is None
    assert not advised  # only cold reads are announced


@pytest.mark.parametrize("ask", ["cachestat", "mincore"])
def test_page_cached_tells_a_cold_page_without_reading_it(tmp_path, monkeypatch, ask):
    """`page_cached` asks the page cache (Linux's `cachestat`, a miss confirmed by `mincore`; or
    `mincore` alone), and asking reads nothing in."""
    path = tmp_path / "f"
    path.write_bytes(os.urandom(1 << 20))
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        if ask == "cachestat" and kv.pagecache._cachestat(fd, 0) is None:
            pytest.skip("no cachestat here (Linux 6.5 on)")
        if ask == "mincore":
            monkeypatch.setattr(kv.pagecache, "_SYS_CACHESTAT", None)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        assert not any(kv.pagecache.page_cached(fd, offset) for offset in (0, 5000, 1 << 19, 1 << 19))
        os.pread(fd, 10, 300_000)
        assert kv.pagecache.page_cached(fd, 300_000) and not kv.pagecache.page_cached(fd, 0)
        if ask == "cachestat":  # it answered alone, and its answer holds
            assert kv.pagecache._cachestat(fd, 300_000 // 4096 * 4096) and kv.pagecache._SYS_CACHESTAT
        assert kv.pagecache.page_cached(fd, 2 << 20)  # past the end: the read will find the file short
    finally:
        os.close(fd)


def test_a_cold_read_bypasses_the_page_cache_checked_and_falls_back_where_refused(tmp_path, monkeypatch):
    """Blocks not in the page cache are read `O_DIRECT` in calls of at most `DIRECT_BYTES`, into a
    block-major or a layer-major buffer, every Layer Block still checked: a byte flipped on the
    disk and a file cut short are misses. A buffer not aligned for it is read through the page
    cache; a call the device refuses all the same (`EINVAL`) is made again through the page cache."""
    probe = os.open(tmp_path / "probe", os.O_RDONLY | os.O_CREAT)
    try:
        if not kv.pagecache.set_direct(probe):
            pytest.skip("no O_DIRECT on this file system")
    finally:
        os.close(probe)
    layout = _layout(n_layers=4)  # its Layer Blocks and its segment files' data on 4 KiB boundaries
    calls, refuse, real_preadv = [], [0], os.preadv

    def preadv(fd, bufs, offset, *a):  # records (bytes asked, bytes read or errno) of each O_DIRECT call
        if not fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            return real_preadv(fd, bufs, offset, *a)
        n = sum(memoryview(b).nbytes for b in bufs)
        try:
            if refuse[0]:
                refuse[0] -= 1
                raise OSError(errno.EINVAL, "Invalid argument (pretended)")
            calls.append((n, real_preadv(fd, bufs, offset, *a)))
        except OSError as e:
            calls.append((n, e.errno))
            raise
        return calls[-1][1]
    monkeypatch.setattr(kv.reads.os, "preadv", preadv)
    monkeypatch.setattr(kv.reads, "DIRECT_BYTES", 3 * layout.layer_bytes)  # a call ends inside most blocks
    monkeypatch.setattr(kv.reads, "page_cached", lambda fd, offset: False)  # every read cold (O_DIRECT reads the disk)
    with kv.BlockStore(kv.local_spec(tmp_path / "store"), layout) as store:
        ids, blocks = _chain(3, layout), _blocks(3, layout)
        store.put(ids, blocks)
        hashes = [b.hash for b in ids]
        np.testing.assert_array_equal(np.stack([r.result() for r in store.get(hashes)]), blocks)
        assert calls and all(n <= 3 * layout.layer_bytes and got == n for n, got in calls)

        calls.clear()  # a layer-major buffer (the runtime's): rows not contiguous, Layer Blocks aligned
        by_layer = kv.layout.aligned_empty(blocks.nbytes).view(layout.np_dtype).reshape(
            layout.n_layers, 3, *layout.layer_shape)
        assert all(r.result() is not None for r in store.get(hashes, by_layer.swapaxes(0, 1)))
        np.testing.assert_array_equal(by_layer.swapaxes(0, 1), blocks)
        assert calls and all(got == n for n, got in calls)

        calls.clear()  # at an odd address: no O_DIRECT call at all
        odd = kv.layout.aligned_empty(blocks.nbytes + 1)[1:].view(layout.np_dtype).reshape(blocks.shape)
        assert all(r.result() is not None for r in store.get(hashes, odd))
        np.testing.assert_array_equal(odd, blocks)
        assert not calls

        calls.clear()
        refuse[0], out = 1, layout.empty(3)  # a device that wants more than 4 KiB alignment: refused once
        assert all(r.result() is not None for r in store.get(hashes, out))
        np.testing.assert_array_equal(out, blocks)
        # two tasks (one per reader thread), four calls each: blocks 0-1 a layer a call, block 2 a
        # Layer Block a call. The refused call, the first, reads the rest of its task through the
        # page cache: 5 O_DIRECT calls, not 8
        assert [got for _, got in calls].count(errno.EINVAL) == 1 and len(calls) == 5

        path, offset = _layer_in_file(tmp_path, store, ids[1].hash, layout.n_layers - 1, layout)
        with open(path, "r+b") as f:  # a byte of block 1's last Layer Block, on the disk
            f.seek(offset + 5)
            byte = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte[0] ^ 0x40]))  # in the page cache: an O_DIRECT read writes it back first
        calls.clear()
        got = [r.result() for r in store.get(hashes)]
        assert got[1] is None and store.stats()["bad_blocks"] == 1 and calls
        np.testing.assert_array_equal(got[0], blocks[0])

        ids, blocks = _chain(3, layout, offset=1000), _blocks(3, layout, seed=7)
        store.put(ids, blocks)
        assert len(store.get_prefix([b.hash for b in ids])) == 3  # entries known now
        path, offset = _layer_in_file(tmp_path, store, ids[1].hash, layout.n_layers - 1, layout)
        os.truncate(path, offset + layout.layer_bytes // 2)
        calls.clear()
        got = [r.result() for r in store.get([b.hash for b in ids])]
        np.testing.assert_array_equal(got[0], blocks[0])
        assert got[1] is None and got[2] is None and calls  # read direct, cut short


def test_pread_rows_says_why_each_block_failed(tmp_path, monkeypatch):
    """`pread_rows` on a hand-made segment file (4 layers of 3 blocks, layer-major): whole blocks and
    some layers of a block, in calls of at most `VERIFY_BYTES`; a checksum mismatch fails its block
    only, a short file every block with a Layer Block past the cut, an I/O error every block with
    a Layer Block in the failing call or after it."""
    layout = _layout(n_layers=4)
    lb, blocks = layout.layer_bytes, _blocks(3, layout)
    path = tmp_path / "seg"
    blocks.swapaxes(0, 1).tofile(path)  # Layer Block l of block k at (3 l + k) * lb
    entries = [(s, [xxhash.xxh3_64_intdigest(blocks[s, layer]) for layer in range(4)], (s, 3)) for s in range(3)]

    def read(sel=slice(0, 4), verify=3 * lb):
        monkeypatch.setattr(kv.reads, "VERIFY_BYTES", verify)
        out = np.zeros_like(blocks)
        failed = kv.reads.pread_rows(lambda seg: str(path), layout, 4, 0, out, [0, 1, 2], entries, sel)
        return failed, out
    failed, out = read()
    assert failed == {} and np.array_equal(out, blocks)
    failed, out = read(slice(1, 3), lb)  # a call per Layer Block
    assert failed == {} and np.array_equal(out[:, 1:3], blocks[:, 1:3]) and not out[:, [0, 3]].any()
    data = bytearray(path.read_bytes())
    data[(3 * 2 + 1) * lb + 7] ^= 0x40  # block 1, layer 2
    path.write_bytes(data)
    failed, out = read()
    assert failed == {1: "checksum mismatch in layer 2"} and np.array_equal(out[[0, 2]], blocks[[0, 2]])
    path.write_bytes(blocks.swapaxes(0, 1).tobytes()[:(3 * 3 + 1) * lb + 100])  # cut in block 1's last layer, 2's gone
    assert read()[0] == {1: f"{path} is truncated", 2: f"{path} is truncated"}
    path.write_bytes(blocks.swapaxes(0, 1).tobytes())
    calls, real = [], os.preadv

    def preadv(fd, bufs, offset, *a):
        if sum(memoryview(b).nbytes for b in bufs) > 1:  # not the page-cache probe
            calls.append(offset)
            if len(calls) == 3:
                raise OSError(5, "Input/output error")
        return real(fd, bufs, offset, *a)
    monkeypatch.setattr(kv.reads.os, "preadv", preadv)
    failed, out = read()  # layers 0 and 1 of the three blocks, then layer 2's call fails: every block has one there
    assert calls == [0, 3 * lb, 6 * lb]
    assert failed == {k: f"{path}: Input/output error" for k in range(3)}
    assert np.array_equal(out[:, :2], blocks[:, :2])


def test_get_allocates_a_page_aligned_buffer(store):
    """A buffer `get` allocates starts on a page (a kernel copy into one 16 bytes past a page, where
    NumPy's large arrays start, runs at a fraction of its speed on some CPUs)."""
    ids, blocks = _chain(2), _blocks(2)
    store.put(ids, blocks)
    rows = [r.result() for r in store.get([b.hash for b in ids])]
    assert rows[0].ctypes.data % kv.layout.ALIGN == 0 and rows[1].base is rows[0].base
    np.testing.assert_array_equal(np.stack(rows), blocks)
    assert LAYOUT.empty(3).shape == (3, *LAYOUT.full_shape) and LAYOUT.empty(3).ctypes.data % kv.layout.ALIGN == 0


def test_failed_put_raises_and_keeps_visible_blocks_intact(tmp_path, store):
    ids, blocks = _chain(4), _blocks(4)
    store.put(ids[:2], blocks[:2])
    # Make the next segment's file name a directory, so the real file write fails (EISDIR).
    slot = (store._writer << kv.store.COUNTER_BITS) | store._counter
    os.makedirs(tmp_path / "store" / "data" / store.files.segment_key(slot // store.slots_per_segment))
    with pytest.raises(kv.StoreError, match="writing 2 blocks failed") as e:
        store.put(ids[2:], blocks[2:])
    assert e.value.cause == "EISDIR" and store.stats()["write_failures"] == 1
    fresh = kv.BlockStore(kv.local_spec(tmp_path / "store"), LAYOUT)
    assert fresh.match_prefix([b.hash for b in ids]) == 2
    np.testing.assert_array_equal(np.stack(fresh.get_prefix([b.hash for b in ids])), blocks[:2])
    fresh.close()


def test_lru_eviction_respects_budget_and_pins():
    ids, blocks = _chain(6), _blocks(6)
    with kv.BlockStore("memory://", LAYOUT, capacity_bytes=3 * LAYOUT.block_bytes) as s:
        for i in range(3):  # one block per put: one segment each
            s.put(ids[i:i + 1], blocks[i:i + 1])
        s.get_prefix([ids[0].hash])  # ids[0] is now most recently used
        s.put(ids[3:4], blocks[3:4])
        assert [s.contains(b.hash) for b in ids[:4]] == [True, False, True, True]
        with s.pinned([ids[2].hash]):  # least recently used now, but pinned: ids[0] goes instead
            s.put(ids[4:5], blocks[4:5])
            assert [s.contains(b.hash) for b in ids[:5]] == [False, False, True, True, True]
        assert s.stats()["bytes"] <= 3 * LAYOUT.block_bytes
    with pytest.raises(kv.StoreError, match="smaller than one block"):
        kv.BlockStore("memory://", LAYOUT, capacity_bytes=100)


def test_eviction_frees_whole_segments_and_reading_one_block_keeps_its_segment():
    ids, blocks = _chain(6), _blocks(6)
    with kv.BlockStore("memory://", LAYOUT, capacity_bytes=4 * LAYOUT.block_bytes) as s:
        s.put(ids[0:2], blocks[0:2])  # segment A
        s.put(ids[2:4], blocks[2:4])  # segment B
        s.get_prefix([ids[0].hash])  # A is most recently used, ids[1] with it
        s.put(ids[4:5], blocks[4:5])  # one block over: all of B goes
        assert [s.contains(b.hash) for b in ids[:5]] == [True, True, False, False, True]
        assert s.stats()["bytes"] == 3 * LAYOUT.block_bytes and s.stats()["evicted"] == 2
        assert s.put(ids, blocks) == 3  # B's blocks and ids[5] return, in segments that fit the budget
        assert s.stats()["bytes"] <= 4 * LAYOUT.block_bytes
        np.testing.assert_array_equal(np.stack(s.get_prefix([b.hash for b in ids[2:]])), blocks[2:])


def test_a_put_larger_than_the_budget_stores_its_leading_blocks():
    ids, blocks = _chain(5), _blocks(5)
    with kv.BlockStore("memory://", LAYOUT, capacity_bytes=2 * LAYOUT.block_bytes) as s:
        assert s.put(ids, blocks) == 2 and s.match_prefix([b.hash for b in ids]) == 2
        assert s.stats()["bytes"] == 2 * LAYOUT.block_bytes


def test_two_processes_write_one_directory_at_once(tmp_path):
    spec = kv.local_spec(tmp_path / "s")
    kv.BlockStore(spec, LAYOUT).close()
    code = textwrap.dedent(f"""
        import numpy as np, kvstore as kv, sys
        layout = kv.BlockLayout(n_layers=2, record_shape=(2, 2, 16), format="gqa:2x2x16:float32")
        off = int(sys.argv[1])
        ids = kv.block_chain((np.arange(64 * 20) + off) % 251, layout)
        blocks = np.random.default_rng(off).standard_normal((20, *layout.full_shape)).astype(np.float32)
        with kv.BlockStore({spec!r}, layout) as s:
            for i in range(20):
                s.put(ids[i:i + 1], blocks[i:i + 1])
    """)
    procs = [subprocess.Popen([sys.executable, "-c", code, str(off)]) for off in (0, 100)]
    assert all(p.wait() == 0 for p in procs)
    with kv.BlockStore(spec, LAYOUT) as s:
        for off in (0, 100):
            ids = kv.block_chain((np.arange(64 * 20) + off) % 251, LAYOUT)
            want = np.random.default_rng(off).standard_normal((20, *LAYOUT.full_shape)).astype(np.float32)
            np.testing.assert_array_equal(np.stack(s.get_prefix([b.hash for b in ids])), want)


def test_concurrent_readers_and_writer_in_one_process(store):
    ids, blocks = _chain(30), _blocks(30)
    errors = []

    def reader():
        for _ in range(20):
            got = store.get_prefix([b.hash for b in ids])
            if any(not np.array_equal(g, w) for g, w in zip(got, blocks)):
                errors.append("wrong bytes")

    threads = [threading.Thread(target=reader) for _ in range(3)]
    for t in threads:
        t.start()
    for i in range(30):
        store.put(ids[i:i + 1], blocks[i:i + 1])
    for t in threads:
        t.join()
    assert not errors


def test_a_bad_block_is_dropped_with_its_segment_and_rewritten_by_the_next_put(tmp_path, store):
    ids, blocks = _chain(4), _blocks(4)
    store.put(ids[:1], blocks[:1])
    store.put(ids[1:], blocks[1:])
    path, offset = _layer_in_file(tmp_path, store, ids[2].hash)
    raw = bytearray(open(path, "rb").read())
    raw[offset + 10] ^= 0xFF
    open(path, "wb").write(bytes(raw))
    assert len(store.get_prefix([b.hash for b in ids])) == 2
    assert store.stats()["bad_blocks"] == 1 and store.stats()["invalidated"] == 3
    assert [store.contains(b.hash) for b in ids] == [True, False, False, False]
    assert store.put(ids, blocks) == 3  # only the dropped segment's blocks are written again
    np.testing.assert_array_equal(np.stack(store.get_prefix([b.hash for b in ids])), blocks)


@pytest.mark.parametrize("version", [1, 3])
def test_a_store_of_another_format_version_is_refused(tmp_path, version):
    spec = kv.local_spec(tmp_path / "s")
    kv.BlockStore(spec, LAYOUT).close()
    manifest = tmp_path / "s" / kv.MANIFEST
    manifest.write_text(manifest.read_text().replace(f'"version": {kv.FORMAT_VERSION}', f'"version": {version}'))
    with pytest.raises(kv.StoreError, match=f"store format version {version} is not this dualjax's version "
                                            f"{kv.FORMAT_VERSION} .*use a new store directory or delete the old store"):
        kv.BlockStore(spec, LAYOUT)


@pytest.mark.parametrize("n_layers,dtype", [(2, "bfloat16"), (40, "float32")])  # 40 x 64: > IOV_MAX Layer Blocks
def test_reads_land_in_a_layer_major_buffer(tmp_path, n_layers, dtype):
    """A buffer laid out [L, n, T, ...] (rows not contiguous, each Layer Block contiguous) gets
    exactly the blocks, whole or a layer at a time, and a truncated segment is still a miss."""
    layout = _layout(n_layers=n_layers, record_shape=(1, 1, 4), block_tokens=4, dtype=dtype)
    n = 64
    ids, blocks = _chain(n, layout), _blocks(n, layout)
    with kv.BlockStore(kv.local_spec(tmp_path / "store"), layout) as s:
        s.put(ids, blocks)
        hashes = [b.hash for b in ids]
        by_layer = np.zeros((n_layers, n, *layout.full_shape[1:]), layout.np_dtype)
        out = np.swapaxes(by_layer, 0, 1)
        assert all(r.result() is not None for r in s.get(hashes, out))
        np.testing.assert_array_equal(out, blocks)
        out[:] = 0
        for layer in range(n_layers):
            assert all(r.result() is not None for r in s.get(hashes, out, layers=range(layer, layer + 1)))
        np.testing.assert_array_equal(out, blocks)
        path, offset = _layer_in_file(tmp_path, s, hashes[-1], n_layers - 1, layout)
        os.truncate(path, offset + layout.layer_bytes // 2)  # entries known: the read finds the cut
        assert [r.result() is not None for r in s.get(hashes, out)] == [True] * (n - 1) + [False]


def test_a_put_whose_links_fail_leaves_nothing_behind(tmp_path, store, monkeypatch):
    """os.link failing after some links were made (index directory full, no hard links): the put
    fails, its links are taken back and its segment files removed, so no space leaks."""
    ids, blocks = _chain(3), _blocks(3)
    real, made = os.link, []

    def link(src, dst):
        if made:
            raise OSError(28, "No space left on device")
        made.append(dst)
        real(src, dst)
    monkeypatch.setattr(os, "link", link)
    with pytest.raises(kv.StoreError):
        store.put(ids, blocks)
    assert made and not os.listdir(tmp_path / "store" / "index")
    assert not [f for f in os.listdir(tmp_path / "store" / "data") if not f.startswith(".") and f != "zarr.json"]
    monkeypatch.setattr(os, "link", real)
    assert store.put(ids, blocks) == 3 and store.get_prefix([b.hash for b in ids])


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs a platform that pins threads and two CPUs")
def test_reader_threads_are_spread_over_the_cpus_and_released_when_they_end(store):
    """Each store's reader threads are pinned, each to one CPU, a pool's two to different ones, and a
    closed store's readers give their CPUs back."""
    from kvstore import files
    allowed = os.sched_getaffinity(0)
    before = sum(files._pinned.values())
    with kv.BlockStore(kv.local_spec(store.files.root + "-2"), LAYOUT) as other:
        for s in (store, other):  # two tasks that wait for each other run on both of a pool's threads
            both = threading.Barrier(2, timeout=10)
            futs = [s.files._reader_pool.submit(lambda: (both.wait(), os.sched_getaffinity(0))[1]) for _ in range(2)]
            cpus = [f.result() for f in futs]
            assert all(len(c) == 1 and c <= allowed for c in cpus) and cpus[0] != cpus[1], cpus
        assert sum(files._pinned.values()) == before + 4, dict(files._pinned)
        assert os.sched_getaffinity(0) == allowed  # the caller's own thread is left alone
    import gc
    gc.collect()
    assert sum(files._pinned.values()) == before + 2, dict(files._pinned)
