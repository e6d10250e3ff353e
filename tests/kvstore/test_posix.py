"""The POSIX back end's own mechanics: one file per put with a hard link per block, reads by
`preadv` in checked pieces, cold reads past the page cache, reader threads pinned to CPUs."""

import errno
import fcntl
import os
import threading

import numpy as np
import pytest
import xxhash

import kvstore as kv
from tests.kvstore import stores as st
from tests.kvstore.stores import LAYOUT


@pytest.fixture
def store(tmp_path):
    with kv.BlockStore(kv.local_spec(tmp_path / "store"), LAYOUT) as s:
        yield s


def test_one_put_is_one_file_and_each_block_is_a_link_to_it(tmp_path, store):
    ids, blocks = st.chain(5), st.blocks(5)
    store.put(ids[:3], blocks[:3])
    store.put(ids[3:], blocks[3:])
    data = st.segment_files(tmp_path / "store")
    assert len(data) == 2 and \
        not [f for d in ("data", "index") for f in os.listdir(tmp_path / "store" / d) if f.endswith(".tmp")]
    links = [os.stat(tmp_path / "store" / "index" / b.hash) for b in ids]
    S, L = store.slots_per_segment, LAYOUT.n_layers
    path, offset = st.layer_in_file(tmp_path / "store", store, ids[4].hash)
    assert os.stat(path).st_ino == links[4].st_ino == links[3].st_ino != links[0].st_ino  # the file holds the entry
    assert len({e.st_ino for e in links[:3]}) == 1 and links[0].st_nlink == 4 and links[3].st_nlink == 3
    entry = 7 + 2 * (16 + 24 + 8 * L + 4 * LAYOUT.block_tokens) + 12  # head, 2 x (hash, record), checksum, length
    assert os.path.getsize(path) == S * L * 16 + 2 * LAYOUT.block_bytes + entry
    raw = np.fromfile(path, np.uint8)
    assert offset == S * L * 16 + LAYOUT.layer_bytes  # layer-major: block 3's layer 0, block 4's, block 3's layer 1 ...
    assert st.layer_in_file(tmp_path / "store", store, ids[3].hash, 1)[1] == offset + LAYOUT.layer_bytes
    layers = [st.layer_in_file(tmp_path / "store", store, ids[4].hash, layer)[1] for layer in range(L)]
    np.testing.assert_array_equal(np.stack([raw[o:o + LAYOUT.layer_bytes] for o in layers]).view(np.float32).reshape(
        LAYOUT.full_shape), blocks[4])
    body = raw[-entry:-12].tobytes()
    assert body[:7] == b"DJIX6" + (2).to_bytes(2, "little") and body[7:23].hex() == ids[3].hash
    tail = raw[-12:].tobytes()
    assert int.from_bytes(tail[:8], "little") == xxhash.xxh3_64_intdigest(body)
    assert int.from_bytes(tail[8:], "little") == entry - 4


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
    monkeypatch.setattr(kv.preads.os, "preadv", preadv)
    real_cached = kv.pagecache.page_cached
    monkeypatch.setattr(kv.preads, "page_cached", lambda fd, offset: not cold[0] and real_cached(fd, offset))
    monkeypatch.setattr(kv.preads, "set_direct", lambda fd, on=True: False)  # a file system without O_DIRECT
    advised = []
    monkeypatch.setattr(kv.preads.os, "posix_fadvise", lambda fd, offset, length, advice: advised.append(
        (offset, length, advice)))
    assert LAYOUT.n_layers == 2
    monkeypatch.setattr(kv.preads, "VERIFY_BYTES", 3 * LAYOUT.layer_bytes)
    ids, blocks = st.chain(3), st.blocks(3)
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
    _, first = st.layer_in_file(tmp_path / "store", store, ids[0].hash)
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
    path, offset = st.layer_in_file(tmp_path / "store", store, ids[1].hash, LAYOUT.n_layers - 1)
    with open(path, "r+b") as f:  # in place: same file, same size
        f.seek(offset + 5)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x40]))
    got = get(hashes)
    assert got[1] is None and store.stats()["bad_blocks"] == 1
    np.testing.assert_array_equal(got[0], blocks[0])
    ids, blocks = st.chain(3, offset=1000), st.blocks(3, seed=7)
    store.put(ids, blocks)
    assert len(store.get_prefix([b.hash for b in ids])) == 3  # entries known now
    path, offset = st.layer_in_file(tmp_path / "store", store, ids[1].hash, LAYOUT.n_layers - 1)
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
    layout = st.layout(n_layers=4)  # its Layer Blocks and its segment files' data on 4 KiB boundaries
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
    monkeypatch.setattr(kv.preads.os, "preadv", preadv)
    monkeypatch.setattr(kv.preads, "DIRECT_BYTES", 3 * layout.layer_bytes)  # a call ends inside most blocks
    monkeypatch.setattr(kv.preads, "page_cached", lambda fd, offset: False)  # every read cold (O_DIRECT reads the disk)
    with kv.BlockStore(kv.local_spec(tmp_path / "store"), layout) as store:
        ids, blocks = st.chain(3, layout), st.blocks(3, layout)
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

        path, offset = st.layer_in_file(tmp_path / "store", store, ids[1].hash, layout.n_layers - 1)
        with open(path, "r+b") as f:  # a byte of block 1's last Layer Block, on the disk
            f.seek(offset + 5)
            byte = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte[0] ^ 0x40]))  # in the page cache: an O_DIRECT read writes it back first
        calls.clear()
        got = [r.result() for r in store.get(hashes)]
        assert got[1] is None and store.stats()["bad_blocks"] == 1 and calls
        np.testing.assert_array_equal(got[0], blocks[0])

        ids, blocks = st.chain(3, layout, offset=1000), st.blocks(3, layout, seed=7)
        store.put(ids, blocks)
        assert len(store.get_prefix([b.hash for b in ids])) == 3  # entries known now
        path, offset = st.layer_in_file(tmp_path / "store", store, ids[1].hash, layout.n_layers - 1)
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
    layout = st.layout(n_layers=4)
    lb, blocks = layout.layer_bytes, st.blocks(3, layout)
    path = tmp_path / "seg"
    blocks.swapaxes(0, 1).tofile(path)  # Layer Block l of block k at (3 l + k) * lb
    members = tuple(f"{k:032x}" for k in range(3))
    entries = [kv.Entry(k, np.array([xxhash.xxh3_64_intdigest(blocks[k, layer]) for layer in range(4)], "<u8"),
                        members, k) for k in range(3)]

    def read(sel=slice(0, 4), verify=3 * lb):
        monkeypatch.setattr(kv.preads, "VERIFY_BYTES", verify)
        out = np.zeros_like(blocks)
        failed = kv.preads.pread_rows(lambda seg: str(path), layout, 4, 0, out, [0, 1, 2], entries, sel)
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
    monkeypatch.setattr(kv.preads.os, "preadv", preadv)
    failed, out = read()  # layers 0 and 1 of the three blocks, then layer 2's call fails: every block has one there
    assert calls == [0, 3 * lb, 6 * lb]
    assert failed == {k: f"{path}: Input/output error" for k in range(3)}
    assert np.array_equal(out[:, :2], blocks[:, :2])


def test_a_put_whose_links_fail_leaves_nothing_behind(tmp_path, store, monkeypatch):
    """os.link failing after some links were made (index directory full, no hard links): the put
    fails, its links are taken back and its segment files removed, so no space leaks."""
    ids, blocks = st.chain(3), st.blocks(3)
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
    assert not st.segment_files(tmp_path / "store")
    monkeypatch.setattr(os, "link", real)
    assert store.put(ids, blocks) == 3 and store.get_prefix([b.hash for b in ids])


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs a platform that pins threads and two CPUs")
def test_reader_threads_are_spread_over_the_cpus_and_released_when_they_end(store):
    """Each store's reader threads are pinned, each to one CPU, a pool's two to different ones, and a
    closed store's readers give their CPUs back."""
    allowed = os.sched_getaffinity(0)
    before = sum(kv.preads._pinned.values())
    with kv.BlockStore(kv.local_spec(store.files.root + "-2"), LAYOUT) as other:
        for s in (store, other):  # two tasks that wait for each other run on both of a pool's threads
            both = threading.Barrier(2, timeout=10)
            futs = [s.files._reader_pool.submit(lambda: (both.wait(), os.sched_getaffinity(0))[1]) for _ in range(2)]
            cpus = [f.result() for f in futs]
            assert all(len(c) == 1 and c <= allowed for c in cpus) and cpus[0] != cpus[1], cpus
        assert sum(kv.preads._pinned.values()) == before + 4, dict(kv.preads._pinned)
        assert os.sched_getaffinity(0) == allowed  # the caller's own thread is left alone
    import gc
    gc.collect()
    assert sum(kv.preads._pinned.values()) == before + 2, dict(kv.preads._pinned)
