"""The forms `--store` takes: a directory moves blocks by the store's POSIX back end; a kvstore URL or
JSON spec moves them through TensorStore; every form gives the tokens of a run without a store."""

import json

import pytest

from dualjax.runtime.cluster.runner import run_embedded
from dualjax.runtime.store import open_store, run_location
from dualjax.runtime.verify import tokens_of
from tests.dualjax.runtime.test_runtime import BASE


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    cfg = BASE.replace(out=str(tmp_path_factory.mktemp("ref") / "reference"), use_store=False)
    run_embedded(cfg, progress=False)
    return tokens_of(cfg.out)


@pytest.mark.parametrize("form", ["file-url", "json-spec", "memory"])
def test_kvstore_store_gives_reference_tokens(tmp_path, reference, form):
    store, gb = {"file-url": (f"file://{tmp_path}/kv", None),
                 "json-spec": (json.dumps({"driver": "file", "path": f"{tmp_path}/kv"}), None),
                 "memory": ("memory://", 1.0)}[form]
    cfg = BASE.replace(out=str(tmp_path / "run"), store=store, store_gb=gb)
    report = run_embedded(cfg, progress=False)
    assert tokens_of(cfg.out) == reference
    assert report["hit_rate"] > 0.3  # later turns read their prefix from the kvstore


@pytest.mark.parametrize("store,backend", [("{dir}/kv", "PosixBackend"), ("file://{dir}/kv", "TensorStoreBackend")])
def test_a_directory_is_posix_a_url_tensorstore(tmp_path, store, backend):
    cfg = BASE.replace(out=str(tmp_path / "run"), store=store.format(dir=tmp_path))
    with open_store(cfg) as opened:
        assert type(opened.files).__name__ == backend
        assert run_location(cfg).directory == str(tmp_path / "kv")  # its budget from that disk
