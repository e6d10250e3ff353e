"""Storage NIC model: FIFO read queue accounting, bandwidth cap accuracy, layer-major progress,
miss semantics."""

import time

import numpy as np
import pytest

import kvstore as kv
from tests.kvstore.stores import LAYOUT
from tests.kvstore.stores import blocks as _blocks
from tests.kvstore.stores import chain as _chain


@pytest.mark.parametrize("layer_major", [False, True])
def test_cap_is_met_within_five_percent(filled, layer_major):
    store, ids, blocks = filled
    cap = 40 * LAYOUT.block_bytes  # 40 blocks/s
    nic = kv.StorageNIC("h0", cap_bytes_per_s=cap, batch_bytes=LAYOUT.block_bytes)
    hashes = [b.hash for b in ids] * 3
    t0 = time.perf_counter()
    ticket = nic.read(store, hashes, layer_major=layer_major)
    assert ticket.wait() == 60
    elapsed = time.perf_counter() - t0
    nic.close()
    np.testing.assert_array_equal(ticket.out, np.concatenate([blocks] * 3))
    measured = 60 * LAYOUT.block_bytes / elapsed  # each read arrives after its transfer time at the cap
    assert abs(measured / cap - 1) < 0.05, measured / cap
    assert nic.stats()["bytes_read"] == 60 * LAYOUT.block_bytes
    assert nic.stats()["busy_s"] == pytest.approx(elapsed, rel=0.1)


def test_layer_major_read_makes_layer_zero_ready_early(filled):
    store, ids, blocks = filled
    nic = kv.StorageNIC("h3", cap_bytes_per_s=50 * LAYOUT.block_bytes, batch_bytes=LAYOUT.block_bytes)
    t0 = time.perf_counter()
    ticket = nic.read(store, [b.hash for b in ids], layer_major=True)
    assert ticket.wait_layer(0) == 20
    t_layer0 = time.perf_counter() - t0
    np.testing.assert_array_equal(ticket.out[:, 0], blocks[:, 0])
    ticket.wait()
    t_all = time.perf_counter() - t0
    nic.close()
    assert t_layer0 < 0.6 * t_all  # two layers: layer 0 lands at about half the time


def test_read_queue_counts_outstanding_bytes_and_tokens(filled):
    store, ids, blocks = filled
    nic = kv.StorageNIC("h1", cap_bytes_per_s=20 * LAYOUT.block_bytes, batch_bytes=LAYOUT.block_bytes)
    first = nic.read(store, [b.hash for b in ids[:10]])
    second = nic.read(store, [b.hash for b in ids[:4]])
    q_bytes, q_tokens = nic.read_queue()
    assert 10 * LAYOUT.block_bytes < q_bytes <= 14 * LAYOUT.block_bytes
    assert q_tokens == q_bytes // LAYOUT.block_bytes * LAYOUT.block_tokens
    assert first.wait() == 10
    np.testing.assert_array_equal(first.out, blocks[:10])
    second.wait()
    assert nic.read_queue() == (0, 0)
    nic.close()


@pytest.mark.parametrize("layer_major", [False, True])
def test_missing_block_ends_the_run(filled, layer_major):
    store, ids, _ = filled
    nic = kv.StorageNIC("h2")
    absent = _chain(1, offset=999)[0].hash
    ticket = nic.read(store, [ids[0].hash, ids[1].hash, absent, ids[3].hash], layer_major=layer_major)
    assert ticket.wait() == 2 and nic.read_queue() == (0, 0)
    assert ticket.out.ctypes.data % kv.layout.ALIGN == 0  # allocated page-aligned, as `get` allocates
    nic.close()
    with pytest.raises(RuntimeError, match="h2 is closed"):  # not a read that waits forever
        nic.read(store, [ids[0].hash])
    nic.close()  # closing twice is harmless
    with pytest.raises(ValueError, match="positive"):
        kv.StorageNIC("bad", cap_bytes_per_s=0)


def test_an_uncapped_layer_major_read_of_cold_blocks_goes_block_by_block(tmp_path, monkeypatch):
    """Blocks not in the page cache: an uncapped layer-major read reads whole blocks (long runs the
    disk streams) and still fills the layer-major buffer exactly; warm, or capped, it stays
    layer-major."""
    ids, blocks = _chain(6), _blocks(6)
    submitted = []
    real_submit = kv.reads.RequestReads.submit
    monkeypatch.setattr(kv.reads.RequestReads, "submit",
                        lambda self, b0, b1, layers: submitted.append(len(layers)) or real_submit(self, b0, b1, layers))
    cold = [False]
    real_cached = kv.pagecache.page_cached
    monkeypatch.setattr(kv.posix, "page_cached", lambda fd, offset: not cold[0] and real_cached(fd, offset))
    with kv.BlockStore(kv.local_spec(tmp_path / "store"), LAYOUT) as store:
        store.put(ids, blocks)
        hashes = [b.hash for b in ids]
        for cap, is_cold, whole in ((None, False, False), (None, True, True), (1e12, True, False)):
            cold[0], out = is_cold, np.zeros((LAYOUT.n_layers, 6, *LAYOUT.layer_shape), LAYOUT.np_dtype)
            submitted.clear()
            nic = kv.StorageNIC("h5", cap_bytes_per_s=cap)
            ticket = nic.read(store, hashes, out=out.transpose(1, 0, *range(2, out.ndim)), layer_major=True)
            assert ticket.wait() == 6 and ticket.wait_layer(0) == 6
            nic.close()
            np.testing.assert_array_equal(out.transpose(1, 0, *range(2, out.ndim)), blocks)
            assert set(submitted) == ({LAYOUT.n_layers} if whole else {1}), (cap, is_cold)
