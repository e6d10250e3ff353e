"""Data-plane invariants: receive buffers are reused only when nothing holds them; host buffers are
page-aligned, so a CPU device takes a layer without a copy; a request's layer-major host buffer
reads, writes and views exactly as the Full Blocks it stands for; the benchmarks' keys."""

import os

import jax
import numpy as np
import pytest

import kvstore as kv
import models
from dualjax.runtime.buffers import ALIGN, BufferPool, HostBuffer, RequestKV, aligned_empty
from dualjax.runtime.store import layout_for


def test_pool_reuses_a_buffer_only_after_every_view_is_gone():
    pool = BufferPool()
    a = pool.take(100_000)
    view = a.view(np.float32).reshape(-1, 4)[:10]  # what a receiver keeps of a delivered message
    del a
    b = pool.take(100_000)
    assert not np.shares_memory(view, b)  # still referenced: not handed out again
    del view
    c = pool.take(90_000)
    assert c.size == 90_000 and pool.hits == 1 and pool.misses == 2


def test_pool_keeps_at_most_its_budget():
    pool = BufferPool(keep_bytes=1 << 20)
    held = [pool.take(600_000) for _ in range(3)]
    assert pool.pooled <= 1 << 20 and all(h.size == 600_000 for h in held)


def test_pool_buffers_are_page_aligned_and_copies_exact(rng):
    pool = BufferPool()
    a = rng.standard_normal((3, 5, 7)).astype(np.float32)
    c = pool.copy(a)
    assert c.ctypes.data % ALIGN == 0 and np.array_equal(c, a) and c.dtype == a.dtype and not np.shares_memory(a, c)
    assert all(pool.take(n).ctypes.data % ALIGN == 0 for n in (1, 100_000, 3 << 20))
    assert pool.copy(a[:0]).shape == (0, 5, 7)


def test_a_layer_of_a_request_buffer_goes_to_a_cpu_device_uncopied():
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


def test_a_request_buffer_reuses_a_finished_requests_memory_and_zeroes_its_padding():
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


def test_request_kv_views_match_the_full_blocks(tiny_layout, rng):
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


def test_store_reads_land_bit_exact_in_the_layer_major_buffer(tmp_path, tiny_layout, rng):
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


@pytest.mark.slow
def test_dataplane_benchmark_quick(tmp_path):
    """The keys other tools read, the bound beside each path, and a spent budget stops each run's trials
    after `MIN_TRIALS` (embedded, cold, and under mpiexec, where both ranks follow rank 0's clock)."""
    from dualjax.bench import dataplane
    result = dataplane.main(["--quick", "--budget-s", "0", "--json", str(tmp_path / "dp.json"),
                             "--plot", str(tmp_path / "dp.png")])
    assert [result[run]["trials"] for run in ("embedded", "embedded_cold", "mpi")] == [dataplane.MIN_TRIALS] * 3
    assert (tmp_path / "dp.png").stat().st_size > 0
    assert {"pe_vs_raw", "de_vs_raw", "raw_read_gbps", "pe_vs_raw_parallel", "de_vs_raw_parallel",
            "stages"} <= set(result)
    assert {"store_read", "device"} <= set(result["stages"]["pe"]) and "relay" in result["stages"]["de"]
    assert result["stages"]["de"]["bound_s"] >= result["stages"]["pe"]["bound_s"] > 0  # the DE path adds the relay
    assert 0 < result["de_vs_bound"] <= 1.25  # no path beats the bound its own stages set (a little noise allowed)
    for run in ("embedded", "mpi"):  # the first layer reaches the computation before the whole path is through
        for path in ("pe", "de"):
            assert 0 < result[run]["stages"][path]["first_layer_s"] < result[run]["stage_s"][path]
    assert 0 < result["pe_vs_raw"] and 0 < result["de_vs_raw"]
    assert result["embedded"]["store_fresh_vs_raw"] > 0 and "store_fresh_vs_raw" not in result["embedded_cold"]
    cold = result["embedded_cold"]  # the same run from the disk: every figure, its own raw reads
    assert cold["raw_read_gbps"] > 0 and cold["pe_vs_raw"] > 0 and cold["de_vs_raw"] > 0


def test_dataplane_bound_is_the_slowest_stage_or_the_stages_cpu_over_the_cores():
    from dualjax.bench.dataplane import _bound
    run = {"store_read": (0.05, 0.08), "relay": (0.06, 0.05), "h2d": (0.001, 0.001), "de": (0.1, 0.2)}
    assert _bound(run, "pe", cores=2) == pytest.approx(0.05)  # the store read alone: its CPU fits two cores
    assert _bound(run, "pe", cores=1) == pytest.approx(0.081)  # one core: the stages' CPU seconds in a row
    assert _bound(run, "de", cores=2) == pytest.approx(0.0655)  # the relay is slower, but the CPU (0.131 s) binds
    assert _bound(run, "de", cores=8) == pytest.approx(0.06)  # enough cores: the slowest stage


def test_kvstore_benchmark_quick(tmp_path):
    """The keys other tools read, the checksum floor beside the raw read (the same bytes, checked),
    and a spent budget stops each phase's trials after two."""
    from dualjax.bench import kvstore
    result = kvstore.main(["--quick", "--budget-s", "0", "--dir", str(tmp_path), "--json", str(tmp_path / "kv.json")])
    assert result["read_trials"] == result["read_cold_trials"] == result["write_trials"] == 2
    assert {"read_vs_raw", "write_vs_raw", "cap_measured_mbps", "cap_target_mbps", "raw_checked_vs_raw",
            "read_vs_raw_checked", "read_layer_major_nic_vs_raw", "read_layer_major_nic_cold_vs_raw"} <= set(result)
    assert result["raw_read_checked_gbps"] > 0 and result["read_vs_raw_checked"] > 0
    assert result["read_layer_major_nic_cold_gbps"] > 0
    assert result["qwen2.5-32b"]["read_layer_major_nic_cold_vs_raw"] > 0
    direct = result["raw_read_cold_direct_gbps"]  # the raw O_DIRECT read, where the file system has it
    assert (direct is None) == (result["read_cold_vs_raw_direct"] is None) and (direct is None or direct > 0)
    assert result["cap_target_mbps"] == 100.0


@pytest.mark.slow
def test_relay_benchmark_quick(tmp_path):
    """The keys other tools read; its baseline (a plain Send) ran in the same job, every run received
    into one pool, reusing its buffers, and each control lane's p99 rests on enough pings to be a
    percentile rather than the maximum of a few."""
    from dualjax.bench import relay
    result = relay.main(["--quick", "--json", str(tmp_path / "relay.json")])
    assert {"relay_vs_raw", "control_p99_ms_priority", "control_p99_ms_fifo", "raw_gbps"} <= set(result)
    assert result["raw_gbps"] > 0 and result["relay_vs_raw"] > 0 and result["relay_vs_raw_fresh_pool"] > 0
    assert result["pool_reuses"] > 10 * result["pool_buffers"] > 0, result  # one pool served every run
    # the second yardstick lands in as many buffers as the relay's pool had after its warm-up
    assert 1 <= result["raw_same_buffers"] <= result["pool_buffers"] and result["relay_vs_raw_same_buffers"] > 0
    assert min(result["control_messages"]) >= 100 * relay.LATENCY_ROUNDS, result["control_messages"]
    rounds = result["control_p99_ms_priority_rounds"], result["control_p99_ms_fifo_rounds"]
    assert len(rounds[0]) == len(rounds[1]) == relay.LATENCY_ROUNDS


@pytest.mark.slow
def test_the_relay_keeps_its_speed_where_mpi_copies_only_inside_its_calls(tmp_path, monkeypatch):
    """Without single-copy transfers (MPICH turns CMA off under Yama's ptrace_scope >= 1, the default
    of many distributions) a shared-memory transfer moves only while its ranks are inside MPI calls.
    A progress thread that slept between polls while KV was in flight relayed 1/100 of a plain Send
    (0.04 against 4 GB/s); one that waits inside MPI keeps up with it."""
    from dualjax.bench import relay
    monkeypatch.setenv("MPIR_CVAR_CH4_CMA_ENABLE", "0")
    result = relay.main(["--quick", "--json", str(tmp_path / "relay.json")])
    assert result["waits_inside_mpi"], "the transport did not see its KV stall between polls"
    assert all(result["waits_inside_mpi_ranks"]), "the receiver did not tell its sender"
    assert result["relay_vs_raw"] > 0.25 and result["relay_strided_vs_raw"] > 0.25, result


def test_layerwise_benchmark_measures_interleaved_trials_within_its_budget(tmp_path, monkeypatch):
    """`bench layerwise`'s measurement on a 4-layer tiny model: the keys other tools read, at most
    2.5 layers of prefix KV on the device at once (a pass holding every layer has 4), a spent
    budget stops the trials after two, and the timeline puts each layer's compute after its read
    (and is drawn)."""
    from dualjax.bench import layerwise
    monkeypatch.chdir(tmp_path)  # its store's temp directory goes under the working directory
    cfg = models.get_config("tiny").replace(n_layers=4)
    result = layerwise.measure(cfg, hit_tokens=256, miss=32, trials=5, budget_s=0)
    assert result["trials"] == 2
    assert {"overlap_efficiency", "overlap_efficiency_of_medians", "overlap_ideal", "peak_kv_layers",
            "layerwise_vs_basic"} <= set(result)
    assert result["overlap_ideal"] == cfg.n_layers / (cfg.n_layers + 1)
    assert 0 < result["overlap_efficiency"] and 0 < result["peak_kv_layers"] <= 2.5
    assert result["load_s"] > 0 and result["compute_s"] > 0
    tl = result["timeline"]
    assert len(tl["read_s"]) == len(tl["computed_s"]) == cfg.n_layers
    assert 0 < tl["read_s"][0] and all(a <= b for a, b in zip(tl["read_s"], tl["read_s"][1:]))
    assert all(r < c for r, c in zip(tl["read_s"], tl["computed_s"])) and tl["computed_s"][-1] <= tl["layerwise_s"]
    assert 0 < tl["basic_read_s"] < tl["basic_s"]
    from dualjax.plots import plot_layerwise
    plot_layerwise(str(tmp_path / "lw.png"), {"model": cfg.name, **result, "small_16_layers": result})
    assert (tmp_path / "lw.png").stat().st_size > 0


def test_load_page_cache_makes_a_dropped_file_warm_again(tmp_path):
    """What the warm figures of `bench dataplane` read after its cold run: the store reads a block
    whose first page is not cached past the page cache, so without this its files would stay cold."""
    from dualjax.bench.common import drop_page_cache, load_page_cache
    from kvstore.pagecache import page_cached
    path = tmp_path / "d" / "f.bin"
    path.parent.mkdir()
    path.write_bytes(os.urandom(4 << 20))
    drop_page_cache([str(tmp_path)])
    fd = os.open(path, os.O_RDONLY)
    try:
        if page_cached(fd, 0) and page_cached(fd, (4 << 20) - 4096):
            pytest.skip("this file system keeps the file in the page cache")
        load_page_cache([str(tmp_path)])
        assert page_cached(fd, 0) and page_cached(fd, (4 << 20) - 4096)
    finally:
        os.close(fd)


def test_page_cache_helpers_visit_a_hard_linked_file_once(tmp_path):
    """A store's index entries are hard links to its segment files: each file is read (or dropped) once."""
    from dualjax.bench.common import _files
    (tmp_path / "data").mkdir()
    (tmp_path / "index").mkdir()
    (tmp_path / "data" / "seg").write_bytes(b"x" * 4096)
    for h in ("a", "b", "c"):
        os.link(tmp_path / "data" / "seg", tmp_path / "index" / h)
    (tmp_path / "other").write_bytes(b"y")
    assert len(_files([str(tmp_path)])) == 2
