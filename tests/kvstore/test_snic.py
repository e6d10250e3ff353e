"""Storage NIC model: FIFO read queue accounting, bandwidth cap accuracy, miss semantics."""

import time

import numpy as np
import pytest

import kvstore as kv
from tests.kvstore.test_store import LAYOUT, _blocks, _chain


@pytest.fixture(scope="module")
def filled():
    s = kv.BlockStore("memory://", LAYOUT)
    ids, blocks = _chain(20), _blocks(20)
    s.put(ids, blocks)
    yield s, ids, blocks
    s.close()


def test_cap_is_met_within_five_percent(filled):
    store, ids, _ = filled
    cap = 40 * LAYOUT.block_bytes  # 40 blocks/s
    nic = kv.StorageNIC("h0", cap_bytes_per_s=cap)
    hashes = [b.hash for b in ids] * 3
    t0 = time.perf_counter()
    got = nic.read(store, hashes).result()
    elapsed = time.perf_counter() - t0
    nic.close()
    assert len(got) == 60
    measured = (len(hashes) - 1) * LAYOUT.block_bytes / elapsed  # the first block goes at once
    assert abs(measured / cap - 1) < 0.05, measured / cap
    assert nic.stats()["bytes_read"] == 60 * LAYOUT.block_bytes
    assert nic.stats()["busy_s"] == pytest.approx(elapsed, rel=0.1)


def test_read_queue_counts_outstanding_bytes_and_tokens(filled):
    store, ids, blocks = filled
    nic = kv.StorageNIC("h1", cap_bytes_per_s=20 * LAYOUT.block_bytes)
    first = nic.read(store, [b.hash for b in ids[:10]])
    second = nic.read(store, [b.hash for b in ids[:4]])
    q_bytes, q_tokens = nic.read_queue()
    assert 10 * LAYOUT.block_bytes < q_bytes <= 14 * LAYOUT.block_bytes
    assert q_tokens == q_bytes // LAYOUT.block_bytes * LAYOUT.block_tokens
    np.testing.assert_array_equal(np.stack(first.result()), blocks[:10])
    second.result()
    assert nic.read_queue() == (0, 0)
    nic.close()


def test_missing_block_ends_the_run(filled):
    store, ids, _ = filled
    nic = kv.StorageNIC("h2")
    absent = _chain(1, offset=999)[0].hash
    got = nic.read(store, [ids[0].hash, ids[1].hash, absent, ids[3].hash]).result()
    assert len(got) == 2 and nic.read_queue() == (0, 0)
    nic.close()
    with pytest.raises(ValueError, match="positive"):
        kv.StorageNIC("bad", cap_bytes_per_s=0)
