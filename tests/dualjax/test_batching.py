"""Intra-engine batching on hand-worked cases. No MPI, no JAX."""

import pytest

from dualjax.core.batching import AttentionFit, Work, pack

FIT = AttentionFit(a=1e-6, b=1e-4, c=0.0)  # 100 new tokens over 0 cached: 1e-6*100*50 + 1e-2 = 0.015 s


def test_fit_recovers_the_model():
    samples = [(c, n, FIT.predict(c, n)) for c in (0, 512, 2048) for n in (64, 256, 1024)]
    got = AttentionFit.fit(samples)
    assert got.a == pytest.approx(1e-6) and got.b == pytest.approx(1e-4) and got.c == pytest.approx(0, abs=1e-9)


def test_whole_requests_are_packed_fifo_within_the_quota():
    q = [Work("a", 0, 100), Work("b", 0, 100), Work("c", 0, 100)]
    # a: 0.015 s; a + b: 2 * 0.015 = 0.030 s; any chunk of c pads to 100 tokens: 3 * 0.015 > 0.031.
    assert [(w.key, n) for w, n in pack(q, FIT, quota_s=0.031, max_chunk=4096)] == [("a", 100), ("b", 100)]


def test_padded_batch_cost_decides_the_chunk():
    # y1, y2: 64 tokens over 1000 cached, 1e-6*64*1032 + 6.4e-3 = 0.072448 s each: 2 rows = 0.1449 s.
    # x (0 cached, 1024 new) pads to 1000 cached: 3 * fit(1000, m) <= 0.3 needs fit(1000, m) <= 0.1,
    # i.e. 5e-7 m^2 + 1.1e-3 m <= 0.1: m = 87 (0.09948 s); 88 takes 0.10067 s.
    q = [Work("y1", 1000, 64), Work("y2", 1000, 64), Work("x", 0, 1024)]
    assert [(w.key, n) for w, n in pack(q, FIT, quota_s=0.3, max_chunk=4096)] == [("y1", 64), ("y2", 64), ("x", 87)]
    # Alone, x's first chunk solves 5e-7 n^2 + 1e-4 n <= 0.3: n = 681 (0.29998 s); 682 takes 0.30076 s.
    assert [n for _, n in pack([Work("x", 0, 1024)], FIT, quota_s=0.3, max_chunk=4096)] == [681]


def test_the_overflowing_request_is_chunked_by_binary_search():
    # 1000 tokens over 1000 cached: 1e-6*1000*1500 + 0.1 = 1.6 s > 0.3. The chunk n needs
    # 5e-7 n^2 + 1.1e-3 n <= 0.3: n = 245 (0.29950 s); 246 would take 0.30086 s.
    (w, n), = pack([Work("x", 1000, 1000)], FIT, quota_s=0.3, max_chunk=4096)
    assert n == 245 and FIT.predict(1000, n) <= 0.3 < FIT.predict(1000, n + 1)


def test_progress_and_chunk_cap():
    tiny_quota = pack([Work("x", 10**6, 500)], FIT, quota_s=1e-9, max_chunk=4096)
    assert [(w.key, n) for w, n in tiny_quota] == [("x", 16)]  # always some progress
    capped = pack([Work("x", 0, 5000)], FIT, quota_s=100.0, max_chunk=2048)
    assert [n for _, n in capped] == [2048]
