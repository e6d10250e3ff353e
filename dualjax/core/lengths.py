"""Token counts the runtime and the simulator derive by one rule each: a turn's hit tokens and a
decode slot's capacity (plain Python and NumPy; the callers pass what they know).

Hits. The store holds whole blocks of `block_tokens` tokens, and a request always computes at least
one prompt token (its first output token comes from the last prompt position), so a request hits
at most `(prompt - 1) // block_tokens` blocks (`max_hit_blocks`). A turn of a synthetic agent or a
trajectory file hits every full block of the agent's previous context that has KV: after a turn of
`context` tokens (its prompt and its generation) the last generated token was never fed back, so
`context - 1` tokens have KV (`kv_blocks`, `hit_tokens`). A recorded session's hits come from
another source, its hash ids (`dualjax.core.sessions`), and take the same rounding (`at_block`). The
runtime asks its store how many of the leading `max_hit_blocks` blocks it holds; the simulator,
`dualjax workload stats`, the runtime's warm start and the report's trace hit rate take `hit_tokens`
or `at_block`, and the simulator counts the blocks a DE writes back with `kv_blocks`.

Decode capacity. A decode slot holds the workload's longest context (prompt + generation) plus one
token, padded to its prefix bucket (`models.buckets`) and capped at the model's context
(`max_seq_len`): `decode_capacity` (`dualjax.runtime.decode_host.decode_capacity` sizes the cache
by it, the simulator its decode steps and DE memory).
"""

from __future__ import annotations

import numpy as np


def max_hit_blocks(prompt, block_tokens: int):
    """The most leading blocks a prompt of `prompt` tokens can hit: one token is always computed."""
    return (prompt - 1) // block_tokens


def at_block(hit, prompt, block_tokens: int):
    """`hit` tokens of a `prompt`-token prompt that have KV somewhere (a store, a trace's hash ids) as
    whole hit blocks: min(hit, prompt - 1) rounded down to a multiple of `block_tokens`, at least 0.
    Ints give an int; NumPy arrays (element-wise) an array."""
    if isinstance(hit, np.ndarray) or isinstance(prompt, np.ndarray):
        return np.maximum(np.minimum(hit, prompt - 1), 0) // block_tokens * block_tokens
    return max(min(hit, prompt - 1), 0) // block_tokens * block_tokens


def kv_blocks(context, block_tokens: int):
    """Full blocks with KV once a turn of `context` tokens (its prompt and generation) has decoded: the
    last generated token is never fed back, so `context - 1` tokens have KV (the decode host writes
    each block to the store as it fills)."""
    return (context - 1) // block_tokens


def hit_tokens(context, prompt, block_tokens: int, use_store: bool = True):
    """Hit tokens of a turn whose agent's previous context (the last turn's prompt and generation) is
    `context` tokens (0 for a first turn) and whose prompt is `prompt` tokens: every full block of the
    `context - 1` tokens with KV, at most `max_hit_blocks(prompt)` blocks; 0 without a store. Ints or
    NumPy arrays, as `at_block`."""
    return at_block(context - 1, prompt, block_tokens) if use_store else 0


def longest_context(lengths) -> int:
    """The longest context (prompt + generation) of agents given as (append, gen) lengths per turn, each
    turn's prompt the agent's previous context plus its append."""
    return max(int(append.sum() + gen.sum()) for append, gen in lengths)


def decode_capacity(longest: int, max_seq_len: int, buckets) -> int:
    """Tokens per decode slot for a workload whose longest context is `longest` tokens: `longest + 1`
    padded to `buckets.prefix` (`models.buckets.DEFAULT_BUCKETS`), at most the model's `max_seq_len`."""
    return min(buckets.prefix(longest + 1), max_seq_len)
