"""Host buffer invariants: receive buffers are reused only when nothing holds them; host buffers
are page-aligned, so a CPU device takes a layer without a copy; a request's layer-major host buffer
reads, writes and views exactly as the Full Blocks it stands for."""

import jax
import numpy as np
import pytest

import kvstore as kv
import models
from dualjax.runtime.buffers import ALIGN, BufferPool, HostBuffer, RequestKV, aligned_empty
from dualjax.runtime.store import layout_for


def test_pool_reuse_waits_for_views():
    """A pooled buffer is handed out again only once no view of it is left."""
    pool = BufferPool()
    a = pool.take(100_000)
    view = a.view(np.float32).reshape(-1, 4)[:10]  # what a receiver keeps of a delivered message
    del a
    b = pool.take(100_000)
    assert not np.shares_memory(view, b)  # still referenced: not handed out again
    del view
    c = pool.take(90_000)
    assert c.size == 90_000 and pool.hits == 1 and pool.misses == 2


def test_pool_budget():
    """A pool keeps at most its budget; past it, buffers are plain allocations."""
    pool = BufferPool(keep_bytes=1 << 20)
    held = [pool.take(600_000) for _ in range(3)]
    assert pool.pooled <= 1 << 20 and all(h.size == 600_000 for h in held)


def test_pool_aligned_exact_copies(rng):
    """Pooled buffers are page-aligned and a pooled copy is exact."""
    pool = BufferPool()
    a = rng.standard_normal((3, 5, 7)).astype(np.float32)
    c = pool.copy(a)
    assert c.ctypes.data % ALIGN == 0 and np.array_equal(c, a) and c.dtype == a.dtype and not np.shares_memory(a, c)
    assert all(pool.take(n).ctypes.data % ALIGN == 0 for n in (1, 100_000, 3 << 20))
    assert pool.copy(a[:0]).shape == (0, 5, 7)


def test_layer_to_cpu_device_uncopied():
    """A layer of a request buffer is aligned, so a CPU device takes it without a copy."""
    lay = layout_for(models.get_config("small"))  # layer bytes a multiple of 64: every layer stays aligned
    rkv = RequestKV(lay, 3 * lay.block_tokens)
    assert rkv.by_layer.ctypes.data % ALIGN == 0 and not rkv.by_layer.any()
    layer = rkv.layer(1, 2 * lay.block_tokens)
    assert layer.ctypes.data % 64 == 0
    if jax.default_backend() == "cpu":
        assert np.shares_memory(np.asarray(jax.device_put(layer)), layer)
    assert aligned_empty(10).ctypes.data % ALIGN == 0


@pytest.fixture
def tiny_layout():
    return layout_for(models.get_config("tiny"))


def test_request_kv_reuses_memory():
    """A host buffer's memory is reused request to request (a storage read into fresh memory faults
    every page in); the reused memory's padding past the last token reads as a fresh buffer's."""
    lay = layout_for(models.get_config("small"))
    host, n = HostBuffer("PE", 64 << 20), 2 * lay.block_tokens - 5  # a partial last block
    first = RequestKV(lay, n, host.pool)
    first.by_layer[...] = 1  # a finished request's KV
    addr = first.by_layer.ctypes.data
    del first
    second = RequestKV(lay, n, host.pool)
    assert second.by_layer.ctypes.data == addr and host.pool.hits == 1
    assert second.by_layer.ctypes.data % ALIGN == 0
    assert not second.by_layer[:, -1, n - lay.block_tokens:].any() and second.by_layer[:, 0].all()
    assert RequestKV(lay, 0, host.pool).blocks.shape[0] == 0


def test_request_kv_views(tiny_layout, rng):
    """Layer-major views read and write exactly as the Full Blocks they stand for."""
    lay, nb = tiny_layout, 3
    blocks = rng.standard_normal((nb, *lay.full_shape)).astype(lay.np_dtype)
    rkv = RequestKV(lay, nb * lay.block_tokens - 5)  # a partial last block
    rkv.blocks[...] = blocks
    seq = np.swapaxes(blocks, 0, 1).reshape(lay.n_layers, -1, *lay.record_shape)  # reference: the old gather
    assert np.array_equal(rkv.sequence(), seq[:, :rkv.n_tokens])
    for layer in range(lay.n_layers):
        assert np.array_equal(rkv.layer(layer, 70), seq[layer, :70])
        view = rkv.layer_view(layer, 2)
        assert np.array_equal(view, blocks[:2, layer]) and view.flags.c_contiguous
    new = rng.standard_normal((40, *lay.record_shape)).astype(lay.np_dtype)
    rkv.write(1, 50, new)  # spans a block boundary
    seq[1, 50:90] = new
    assert np.array_equal(rkv.sequence(), seq[:, :rkv.n_tokens])
    with pytest.raises(ValueError, match="past the request"):
        rkv.write(0, rkv.n_tokens - 1, new)


def test_store_reads_into_request_kv(tmp_path, tiny_layout, rng):
    """Storage reads, block- or layer-major, land bit-exact in the layer-major buffer."""
    lay = tiny_layout
    store = kv.BlockStore(kv.local_spec(str(tmp_path)), lay)
    ids = kv.block_chain(np.arange(4 * lay.block_tokens) % 200, lay)
    blocks = rng.standard_normal((len(ids), *lay.full_shape)).astype(lay.np_dtype)
    store.put(ids, blocks)
    nic = kv.StorageNIC("t")
    for layer_major in (False, True):
        rkv = RequestKV(lay, len(ids) * lay.block_tokens)
        assert nic.read(store, [b.hash for b in ids], out=rkv.blocks, layer_major=layer_major).wait() == len(ids)
        assert np.array_equal(rkv.blocks, blocks)
    nic.close()
