"""Checks of what callers hand the model functions, for every family: token ids, a cached prefix of
records and its per-row lengths. Each failure is one InputError naming the argument and what was
expected."""

from __future__ import annotations

import numpy as np


class InputError(ValueError):
    """Bad input to a model function: the message says which argument and what was expected."""


def check_tokens(tokens, cfg, name: str = "tokens") -> np.ndarray:
    """tokens as an int32 array [B, T] of ids in cfg's vocabulary."""
    tokens = np.asarray(tokens)
    if tokens.ndim != 2 or not np.issubdtype(tokens.dtype, np.integer):
        raise InputError(f"{name} must be an integer array [B, T], got {tokens.dtype} {tokens.shape}")
    if tokens.size and (tokens.min() < 0 or tokens.max() >= cfg.vocab):
        bad = tokens[(tokens < 0) | (tokens >= cfg.vocab)][0]
        raise InputError(f"{name} holds id {bad} outside the vocabulary [0, {cfg.vocab}) of {cfg.name!r}")
    return tokens.astype(np.int32)


def empty_prefix(cfg, layers: int, batch: int, length: int = 0) -> np.ndarray:
    """Zero records [layers, batch, length, *record] (an empty prefix when length is 0)."""
    return np.zeros((layers, batch, length, *cfg.kv_record_shape), cfg.kv_np_dtype)


def check_prefix(prefix_kv, prefix_len, cfg, batch: int, new: int, layers: int):
    """Validate a cached prefix [layers, B, S, *record] (None: no prefix) and its per-row lengths;
    returns (records, lengths)."""
    if prefix_kv is None:
        prefix_kv = empty_prefix(cfg, layers, batch)
    shape, record = tuple(prefix_kv.shape), tuple(cfg.kv_record_shape)
    if len(shape) != 3 + len(record) or shape[:2] != (layers, batch) or shape[3:] != record:
        raise InputError(f"prefix_kv has shape {shape}, expected [L={layers}, B={batch}, S, *{record}] for "
                         f"{cfg.name!r} ({cfg.kv_format})")
    if prefix_kv.dtype != cfg.kv_np_dtype:
        raise InputError(f"prefix_kv has dtype {prefix_kv.dtype}, expected {cfg.kv_dtype} for {cfg.name!r}")
    return prefix_kv, check_prefix_len(prefix_len, batch, shape[2], new, cfg)


def check_prefix_len(prefix_len, batch: int, S: int, new: int, cfg) -> np.ndarray:
    """Per-row prefix lengths [B] int32 (default all S), checked against S and the model's max_seq_len."""
    lengths = np.full((batch,), S, np.int32) if prefix_len is None else np.asarray(prefix_len, np.int32)
    if lengths.shape != (batch,) or lengths.min(initial=0) < 0 or lengths.max(initial=0) > S:
        raise InputError(f"prefix_len must be [B={batch}] values in [0, {S}], got {lengths.tolist()}")
    if lengths.max(initial=0) + new > cfg.max_seq_len:
        raise InputError(f"sequence of {lengths.max() + new} tokens exceeds max_seq_len={cfg.max_seq_len} "
                         f"of {cfg.name!r}")
    return lengths
