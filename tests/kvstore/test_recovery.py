"""A store whose own metadata is damaged opens anyway: rebuilt from what is known (its blocks still
hit) or set aside beside a fresh store, said in one log line and counted once as `recovered`.
Damage to the segments themselves is never wrong bytes: every read is exact or a miss. Each case
on every back end (the damage done through a TensorStore kvstore on the same spec)."""

import json
import logging
import os

import numpy as np
import pytest
import tensorstore as ts

import kvstore as kv
from tests.kvstore.stores import BACKENDS, LAYOUT, blocks, chain, hashes, layout, spec


@pytest.fixture(params=BACKENDS)
def world(request, tmp_path):
    """(open(layout) -> a BlockStore, the raw kvstore under it): every store and the raw kvstore
    share one context, so `memory://` is one store for all of them."""
    where, io = spec(request.param, tmp_path / "store")
    ctx = ts.Context({"file_io_locking": {"mode": "none"}})
    raw = ts.KvStore.open(where, context=ctx).result()
    return (lambda lay=LAYOUT: kv.BlockStore(where, lay, io=io, context=ctx)), raw


def _filled(open_store, n=5):
    ids, data = chain(n), blocks(n)
    with open_store() as s:
        s.put(ids[:2], data[:2])
        s.put(ids[2:], data[2:])
    return ids, data


def _reopen(open_store, caplog, lay=LAYOUT):
    """A store opened on the damaged one, and the store's log lines of that open."""
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="kvstore.store"):
        store = open_store(lay)
    return store, [r.getMessage() for r in caplog.records]


def _value(raw, key) -> bytes:
    return raw.read(key).result().value


ARRAY_FAULTS = {
    "cut short": lambda v: v[:10],
    "missing": lambda v: None,
    "garbled": lambda v: b"\x00garbage" + v[9:],
    "another array": lambda v: json.dumps(dict(json.loads(v), shape=[7, 2, 64, 2, 2, 16])).encode(),
}


@pytest.mark.parametrize("fault", sorted(ARRAY_FAULTS))
def test_damaged_array_metadata_is_rebuilt_and_the_blocks_still_hit(world, caplog, fault):
    open_store, raw = world
    ids, data = _filled(open_store)
    good = _value(raw, "data/zarr.json")
    raw.write("data/zarr.json", ARRAY_FAULTS[fault](good)).result()
    store, lines = _reopen(open_store, caplog)
    with store:
        assert len(lines) == 1 and "data/zarr.json" in lines[0] and "rebuilt from the manifest" in lines[0]
        assert json.loads(_value(raw, "data/zarr.json")) == json.loads(good)
        np.testing.assert_array_equal(np.stack(store.get_prefix(hashes(ids))), data)
        np.testing.assert_array_equal(store.array[store.entries([ids[4].hash])[0].slot].read().result(), data[4])
        assert store.stats()["recovered"] == 1 and store.stats()["recovered"] == 1
    store, lines = _reopen(open_store, caplog)  # sound now: nothing to say, nothing more to count
    with store:
        assert not lines and store.stats()["recovered"] == 0


MANIFEST_FAULTS = {
    "cut short": lambda v: v[:20],
    "missing": lambda v: None,
    "garbled": lambda v: b"{\"format\": 7}",
    "bad segment_slots": lambda v: json.dumps(dict(json.loads(v), segment_slots=3)).encode(),
}


@pytest.mark.parametrize("fault", sorted(MANIFEST_FAULTS))
def test_a_damaged_manifest_is_rebuilt_when_the_blocks_are_this_layouts(world, caplog, fault):
    open_store, raw = world
    ids, data = _filled(open_store)
    good = _value(raw, kv.MANIFEST)
    raw.write(kv.MANIFEST, MANIFEST_FAULTS[fault](good)).result()
    store, lines = _reopen(open_store, caplog)
    with store:
        assert len(lines) == 1 and f"{kv.MANIFEST} " in lines[0] and "rebuilt from this layout" in lines[0]
        assert json.loads(_value(raw, kv.MANIFEST)) == json.loads(good)
        np.testing.assert_array_equal(np.stack(store.get_prefix(hashes(ids))), data)
        assert store.stats()["recovered"] == 1


def test_a_damaged_manifest_over_another_layouts_blocks_sets_them_aside(world, caplog):
    open_store, raw = world
    ids, data = _filled(open_store)
    raw.write(kv.MANIFEST, _value(raw, kv.MANIFEST)[:20]).result()
    other = layout(hash_seed=1)
    store, lines = _reopen(open_store, caplog, other)
    with store:
        assert len(lines) == 1 and "set them aside in damaged/" in lines[0] and "a fresh store" in lines[0]
        assert store.stats()["blocks"] == 0 and store.stats()["recovered"] == 1
        ids2, data2 = chain(2, other), blocks(2, other)
        assert store.put(ids2, data2) == 2
        np.testing.assert_array_equal(np.stack(store.get_prefix(hashes(ids2))), data2)
    aside = [k.decode() for k in raw.list().result() if k.startswith(b"damaged/")]
    assert {k.split("/")[2] for k in aside} == {kv.MANIFEST, "index", "data"}
    assert sum(k.endswith(ids[4].hash) for k in aside) == 1  # the old blocks, kept for a look
    with pytest.raises(kv.FingerprintMismatch):  # the fresh store is the other layout's
        open_store()


def test_a_recovery_is_counted_once_by_the_first_store_that_reports(world, caplog):
    """A run's hosts open the store after the command's own check opened (and repaired) it: the
    count reaches the report through the first store whose stats are asked for, whichever it is."""
    open_store, raw = world
    _filled(open_store)
    raw.write("data/zarr.json", b"{").result()
    repairer, lines = _reopen(open_store, caplog)
    hosts = [open_store(), open_store()]
    assert len(lines) == 1
    assert [s.stats()["recovered"] for s in hosts] == [1, 0] and repairer.stats()["recovered"] == 0
    for s in (repairer, *hosts):
        s.close()


def test_a_directory_that_is_not_a_store_is_never_set_aside(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "index").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("keep me")
    with pytest.raises(kv.StoreError, match="is not a dualjax store"):
        kv.BlockStore(kv.local_spec(tmp_path / "mine"), LAYOUT)
    assert sorted(os.listdir(tmp_path / "mine")) == ["index", "thesis.tex"]


SEGMENT_FAULTS = {  # (where in the segment file, from its start or its end) -> bytes flipped there
    "shard index": (0, 16),
    "entry": (-40, 8),
    "blocks": (LAYOUT.n_layers * 64 * 16 + 100, 8),
}


@pytest.mark.parametrize("fault", sorted(SEGMENT_FAULTS))
def test_damage_inside_a_segment_is_exact_bytes_or_a_miss(world, fault):
    open_store, raw = world
    ids, data = _filled(open_store)
    with open_store() as s:
        key = "data/" + kv.segments.segment_key(LAYOUT, s.entries([ids[2].hash])[0].slot // s.slots_per_segment)
    value = bytearray(_value(raw, key))
    at, n = SEGMENT_FAULTS[fault]
    value[at:at + n if at + n else None] = bytes(b ^ 0x5A for b in value[at:at + n if at + n else None])
    raw.write(key, bytes(value)).result()
    with open_store() as s:
        got = s.get_prefix(hashes(ids))
        assert len(got) >= 2 and all(np.array_equal(g, d) for g, d in zip(got, data))
        assert len(got) == 5 or s.stats()["bad_blocks"] >= 1
        if fault == "blocks":
            assert len(got) == 2  # the checksums catch it on every back end
        assert s.stats()["recovered"] == 0  # the store's own metadata is sound
