"""Fixtures the storage NIC's tests share."""

import pytest

from tests.kvstore.stores import blocks, chain, open_store


@pytest.fixture(scope="module", params=["posix", "memory"])
def filled(request, tmp_path_factory):
    """A store of 20 blocks read through each back end's read tasks."""
    s = open_store(request.param, tmp_path_factory.mktemp("store"))
    ids, data = chain(20), blocks(20)
    s.put(ids, data)
    yield s, ids, data
    s.close()
