"""Where a store is: a directory is the POSIX back end's, every URL or JSON spec TensorStore's; the
forms of one kvstore give one spec; a bad location, or a store nobody answers for, is one line that
names it; asking whether a store is there makes none."""

import json

import numpy as np
import pytest
import tensorstore as ts

import kvstore as kv
from tests.kvstore.stores import LAYOUT, blocks, chain, hashes


def test_a_directory_is_posix(tmp_path):
    path = str(tmp_path / "kv")
    where = kv.locate(path)
    assert (where.spec, where.io, where.directory) == (kv.local_spec(path), "posix", path)


@pytest.mark.parametrize("form", ["url", "inline-json", "json-file"])
def test_every_form_of_a_kvstore_gives_one_spec(tmp_path, form):
    path = str(tmp_path / "kv")
    (tmp_path / "spec.json").write_text(json.dumps({"driver": "file", "path": path}))
    text = {"url": f"file://{path}", "inline-json": json.dumps({"driver": "file", "path": path}),
            "json-file": str(tmp_path / "spec.json")}[form]
    where = kv.locate(text)
    assert (where.name, where.io, where.directory) == (text, "tensorstore", path)
    assert where.spec == kv.local_spec(path)  # a directory: its path ends in "/"


def test_an_adapter_names_its_base_driver_and_has_no_directory():
    where = kv.locate("file:///shared/kv|ocdbt:")
    assert sorted(where.drivers()) == ["file", "ocdbt"] and where.directory is None


@pytest.fixture
def memory_path():
    """A path of its own in the process's one memory store, emptied afterwards: a later test's
    `memory://` store (at the root) finds nothing of this one's."""
    where = kv.locate("memory://location-test/")
    yield where.name
    ts.KvStore.open(where.spec, context=where.context).result().delete_range(ts.KvStore.KeyRange()).result()


def test_memory_stores_of_a_process_are_one(memory_path):
    first, second = kv.locate(memory_path), kv.locate(memory_path)
    assert first.directory is None and kv.locate("file:///kv/").context is None
    ids = chain(2)
    with kv.BlockStore(first.spec, LAYOUT, io=first.io, context=first.context) as a, \
            kv.BlockStore(second.spec, LAYOUT, io=second.io, context=second.context) as b:
        a.put(ids, blocks(2))
        got = [r.result() for r in b.get(hashes(ids))]
    assert np.array_equal(np.stack(got), blocks(2))


@pytest.mark.parametrize("text,why", [
    ("foo://kv", 'unsupported URL scheme "foo"'),
    ('{"driver": "nope"}', '"nope" is not a registered KvStore driver'),
    ('{"driver": "file"}', "a file kvstore needs a path"),
    ("{bad", "not JSON"),
    ("{dir}/none.json", "cannot read the kvstore spec file: No such file or directory"),
])
def test_a_bad_location_is_one_line_naming_it(tmp_path, text, why):
    text = text.replace("{dir}", str(tmp_path))
    with pytest.raises(kv.StoreError) as e:
        kv.locate(text)
    message = str(e.value)
    assert message.startswith(f"{text}: ") and why in message and "\n" not in message and e.value.cause == "spec"


@pytest.mark.parametrize("form", ["directory", "url"])
def test_asking_whether_a_store_is_there_makes_none(tmp_path, form):
    where = kv.locate(f"file://{tmp_path}/kv" if form == "url" else str(tmp_path / "kv"))
    assert not kv.store_exists(where) and not (tmp_path / "kv").exists()
    kv.BlockStore(where.spec, LAYOUT, io=where.io).close()
    assert kv.store_exists(where)


def test_a_store_nobody_answers_for_is_one_line():
    where = kv.locate("http://127.0.0.1:1/kv")  # a port no one listens on
    with pytest.raises(kv.StoreError) as e:
        kv.store_exists(where)
    assert str(e.value).startswith("cannot reach the store http://127.0.0.1:1/kv: ") and "\n" not in str(e.value)
    assert e.value.cause == "unreachable"
