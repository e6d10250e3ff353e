"""The token-count rules the runtime and the simulator share (`dualjax.core.lengths`), against
figures worked out by hand."""

import numpy as np

from dualjax.core.lengths import at_block, decode_capacity, hit_tokens, kv_blocks, longest_context, max_hit_blocks
from models.buckets import Buckets


def test_hit_tokens_by_hand():
    """4-token blocks. A first turn (context 0) hits nothing. After a turn of 9 tokens (prompt +
    generation) 8 have KV: two full blocks, 8 tokens, when the prompt is longer than 8; a 9-token
    context also gives 8 (the 9th token, the last generated, has no KV), and a context of 8 only 4.
    A prompt of 8 tokens computes its last one: at most 1 block (4 tokens) whatever the context.
    Without a store: 0."""
    T = 4
    assert hit_tokens(0, 5, T) == 0
    assert hit_tokens(9, 12, T) == 8
    assert hit_tokens(8, 12, T) == 4
    assert hit_tokens(13, 8, T) == 4  # capped by the prompt: (8 - 1) // 4 = 1 block
    assert hit_tokens(9, 12, T, use_store=False) == 0
    assert max_hit_blocks(8, T) == 1 and max_hit_blocks(9, T) == 2


def test_at_block_ints_and_arrays_agree():
    """A recorded hit rounds down to whole blocks with one prompt token computed; NumPy arrays give
    element by element what ints give: hits 0, 7, 8, 9, 30 of prompts 10, 10, 9, 20, 20, 4-token
    blocks -> 0, 4, 8 (capped at 8, prompt 9), 8, 16 (capped at 19)."""
    hit, prompt = [0, 7, 8, 9, 30], [10, 10, 9, 20, 20]
    want = [0, 4, 8, 8, 16]
    assert [at_block(h, p, 4) for h, p in zip(hit, prompt)] == want
    assert at_block(np.array(hit), np.array(prompt), 4).tolist() == want
    ctx = np.array([0, 9, 8, 13])
    assert hit_tokens(ctx, np.array([5, 12, 12, 8]), 4).tolist() == [0, 8, 4, 4]


def test_decode_capacity_by_hand():
    """The longest context + 1 padded to its prefix bucket (powers of two from 512), at most the
    model's context: 1,000 -> 1,024; 1,023 -> 1,024; 1,024 -> 2,048; 5,000 -> 8,192, capped at 6,000."""
    b = Buckets()
    assert decode_capacity(1000, 4096, b) == 1024
    assert decode_capacity(1023, 4096, b) == 1024
    assert decode_capacity(1024, 4096, b) == 2048
    assert decode_capacity(5000, 6000, b) == 6000
    assert decode_capacity(10, 4096, b) == 512


def test_longest_context_by_hand():
    """Agents (appends 10, 3 and gens 2, 1) and (append 4, gen 4): contexts 16 and 8, the longest 16."""
    assert longest_context([(np.array([10, 3]), np.array([2, 1])), (np.array([4]), np.array([4]))]) == 16


def test_kv_blocks_by_hand():
    """A turn of 9 tokens (prompt + generation) leaves 8 with KV: 2 full 4-token blocks; 8 tokens leave
    7: 1 block; 1 token leaves none."""
    assert kv_blocks(9, 4) == 2 and kv_blocks(8, 4) == 1 and kv_blocks(1, 4) == 0
