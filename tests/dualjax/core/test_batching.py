"""Intra-engine batching on hand-worked cases: the compute quota bounds the batch's predicted
attention-layer time, a * n * (c + n/2) per row of n new tokens over c cached. No MPI, no JAX."""

import pytest

from dualjax.core.batching import AttentionFit, Work, pack

# 100 new tokens over 0 cached: attention 1e-6*100*50 = 0.005 s; the whole row 0.005 + 1e-4*100 = 0.015 s
FIT = AttentionFit(a=1e-6, b=1e-4, c=0.0)


def test_fit_recovers_the_model():
    samples = [(c, n, FIT.predict(c, n)) for c in (0, 512, 2048) for n in (64, 256, 1024)]
    got = AttentionFit.fit(samples)
    assert got.a == pytest.approx(1e-6) and got.b == pytest.approx(1e-4) and got.c == pytest.approx(0, abs=1e-9)


def test_the_quota_bounds_attention_not_the_whole_pass():
    # Alone, 100 new over 0 cached: attention 0.005 s fits a 0.006 s quota though the whole row takes 0.015 s.
    assert FIT.attention(0, 100) == pytest.approx(0.005) and FIT.predict(0, 100) == pytest.approx(0.015)
    assert [(w.key, n) for w, n in pack([Work("a", 0, 100)], FIT, quota_s=0.006, max_chunk=4096)] == [("a", 100)]


def test_whole_requests_are_packed_fifo_within_the_quota():
    q = [Work("a", 0, 100), Work("b", 0, 100), Work("c", 0, 100)]
    # a: 0.005 s; a + b: 2 * 0.005 = 0.010 s; any chunk of c pads to 100 tokens: 3 * 0.005 > 0.011.
    assert [(w.key, n) for w, n in pack(q, FIT, quota_s=0.011, max_chunk=4096)] == [("a", 100), ("b", 100)]


def test_padded_batch_attention_decides_the_chunk():
    # y1, y2: 64 tokens over 1000 cached, 1e-6*64*1032 = 0.066048 s each: 2 rows = 0.1321 s.
    # x (0 cached, 1024 new) pads to 1000 cached: 3 * 1e-6 * m * (1000 + m/2) <= 0.3 needs
    # m^2/2 + 1000 m <= 1e5: m = 95 (99,512.5); 96 gives 100,608.
    q = [Work("y1", 1000, 64), Work("y2", 1000, 64), Work("x", 0, 1024)]
    assert [(w.key, n) for w, n in pack(q, FIT, quota_s=0.3, max_chunk=4096)] == [("y1", 64), ("y2", 64), ("x", 95)]
    # Alone, x's first chunk solves 1e-6 * n^2 / 2 <= 0.3, n^2 <= 600,000: n = 774 (599,076); 775^2 = 600,625.
    assert [n for _, n in pack([Work("x", 0, 1024)], FIT, quota_s=0.3, max_chunk=4096)] == [774]


def test_ragged_batch_sums_each_rows_attention():
    # a: 0.005 s; b (100 over 1000 cached): 1e-6*100*1050 = 0.105 s; together 0.110 s. c (0 cached) then
    # gets m with 0.110 + 1e-6 * m^2 / 2 <= 0.2, m^2 <= 180,000: m = 424 (179,776); 425^2 = 180,625.
    q = [Work("a", 0, 100), Work("b", 1000, 100), Work("c", 0, 1000)]
    got = pack(q, FIT, quota_s=0.2, max_chunk=4096, padded=False)
    assert [(w.key, n) for w, n in got] == [("a", 100), ("b", 100), ("c", 424)]


def test_the_overflowing_request_is_chunked_by_binary_search():
    # 1000 tokens over 1000 cached: attention 1e-6*1000*1500 = 1.5 s > 0.3. The chunk n needs
    # 5e-7 n^2 + 1e-3 n <= 0.3: n = 264 (0.29885 s); 265 would take 0.30011 s.
    (w, n), = pack([Work("x", 1000, 1000)], FIT, quota_s=0.3, max_chunk=4096)
    assert n == 264 and FIT.attention(1000, n) <= 0.3 < FIT.attention(1000, n + 1)


def test_progress_and_chunk_cap():
    tiny_quota = pack([Work("x", 10**6, 500)], FIT, quota_s=1e-9, max_chunk=4096)
    assert [(w.key, n) for w, n in tiny_quota] == [("x", 16)]  # always some progress
    capped = pack([Work("x", 0, 5000)], FIT, quota_s=100.0, max_chunk=2048)
    assert [n for _, n in capped] == [2048]


def test_without_an_attention_term_the_quota_does_not_bind():
    # a = 0: a fit of linear work and overhead only predicts no attention time, so even a 1 ns quota takes
    # every request, each up to the chunk cap (the two rows as packed take 2.148 s and 0.2 s in all).
    linear = AttentionFit(a=0.0, b=1e-3, c=0.1)
    q = [Work("a", 0, 5000), Work("b", 10**6, 100)]
    assert linear.attention(10**6, 100) == 0.0
    for padded in (True, False):
        got = pack(q, linear, quota_s=1e-9, max_chunk=2048, padded=padded)
        assert [(w.key, n) for w, n in got] == [("a", 2048), ("b", 100)]
