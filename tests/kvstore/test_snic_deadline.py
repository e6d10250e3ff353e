"""A storage NIC read with a deadline: it delivers the whole blocks its emulated link carries by then, the
rest are abandoned (nothing written into the buffer after the ticket is done, no pin left, nothing marked
bad: the store reads them all afterwards), and the link frees at the deadline."""

import time

import numpy as np
import pytest

import kvstore as kv
from tests.kvstore.stores import LAYOUT

RATE = 40  # blocks/s: 25 ms a block, 20 blocks in 0.5 s


def _nic(name):
    return kv.StorageNIC(name, cap_bytes_per_s=RATE * LAYOUT.block_bytes, batch_bytes=LAYOUT.block_bytes)


def _intact(store, ids, blocks):
    """No pin left by the read, and every block still reads back as written."""
    assert not store._view.pins
    got = [r.result() for r in store.get([b.hash for b in ids])]
    assert all(g is not None for g in got)
    np.testing.assert_array_equal(np.stack(got), blocks)


@pytest.mark.parametrize("after_s,want", [
    (-1.0, (0, 0)),    # fired before the read started: nothing read
    (0.26, (9, 10)),   # during it: 0.26 s x 40 blocks/s = 10.4, 10 whole blocks (9 if the host lagged)
    (5.0, (20, 20)),   # after its end (0.5 s): all of it
])
def test_a_block_major_read_keeps_what_came_by_its_deadline(filled, after_s, want):
    store, ids, blocks = filled
    nic = _nic("d0")
    out = LAYOUT.empty(20)
    out[:] = 0
    t0 = nic.clock()
    ticket = nic.read(store, [b.hash for b in ids], out=out, deadline=t0 + after_s)
    valid = ticket.wait()
    assert want[0] <= valid <= want[1]
    assert (ticket.dropped > 0) == (valid < 20)
    np.testing.assert_array_equal(out[:valid], blocks[:valid])
    snapshot = out.copy()
    time.sleep(0.1)  # nothing writes into the buffer once the ticket is done
    np.testing.assert_array_equal(out, snapshot)
    assert nic.read_queue() == (0, 0)  # the scheduler gets the abandoned tokens back
    assert nic.stats()["bytes_read"] == valid * LAYOUT.block_bytes
    if 0 < after_s < 0.5:  # the link frees at the deadline: a next read of 4 blocks, issued at t0 + 0.36 s,
        ti = nic.clock()   # takes its own 0.1 s, not the rest of the abandoned read's 0.5 s as well
        t = nic.read(store, [b.hash for b in ids[:4]])
        assert t.wait() == 4
        assert nic.clock() - ti == pytest.approx(0.1, abs=0.04)
    nic.close()
    _intact(store, ids, blocks)


def test_a_read_with_a_deadline_goes_block_major(filled):
    # asked layer-major, it reads whole blocks in prefix order: 0.15 s x 40 blocks/s = 6 blocks kept
    store, ids, blocks = filled
    nic = _nic("d1")
    ticket = nic.read(store, [b.hash for b in ids], layer_major=True, deadline=nic.clock() + 0.15)
    assert 5 <= ticket.wait_layer(0) <= 6  # layer 0 ready only when the read is cut: a prefix of whole blocks
    assert 5 <= ticket.wait() <= 6
    np.testing.assert_array_equal(ticket.out[:ticket.valid], blocks[:ticket.valid])
    nic.close()
    assert nic.read_queue() == (0, 0)
    _intact(store, ids, blocks)


def test_an_uncapped_read_past_its_deadline_reads_nothing(filled):
    store, ids, blocks = filled
    nic = kv.StorageNIC("d2")
    ticket = nic.read(store, [b.hash for b in ids], deadline=nic.clock() - 1.0)
    assert ticket.wait() == 0
    assert nic.stats()["bytes_read"] == 0
    nic.close()
    _intact(store, ids, blocks)
