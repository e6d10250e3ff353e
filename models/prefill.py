"""Public prefill API: input checks, shape buckets, and the layerwise driver.

`prefill` runs all layers in one jitted program; `Layerwise` runs the same `forward_layer` one
layer at a time so a runtime can load layer l+1's KV while layer l computes. Lengths are padded
to a few buckets (powers of two) so a long multi-turn run compiles a handful of programs.
"""

from __future__ import annotations

import collections
import functools

import jax
import jax.numpy as jnp
import numpy as np

from models.buckets import DEFAULT_BUCKETS, Buckets
from models.config import ModelConfig
from models.model import embed, forward_jit, forward_layer, head
from models.params import Params

HOST_ALIGN = 64  # bytes: XLA's CPU client aliases a host array aligned to this instead of copying it


class InputError(ValueError):
    """Bad input to a model function: the message says which argument and what was expected."""




def check_tokens(tokens, cfg: ModelConfig, name: str = "tokens") -> np.ndarray:
    tokens = np.asarray(tokens)
    if tokens.ndim != 2 or not np.issubdtype(tokens.dtype, np.integer):
        raise InputError(f"{name} must be an integer array [B, T], got {tokens.dtype} {tokens.shape}")
    if tokens.size and (tokens.min() < 0 or tokens.max() >= cfg.vocab):
        bad = tokens[(tokens < 0) | (tokens >= cfg.vocab)][0]
        raise InputError(f"{name} holds id {bad} outside the vocabulary [0, {cfg.vocab}) of {cfg.name!r}")
    return tokens.astype(np.int32)


def check_prefix(prefix_kv, prefix_len, cfg: ModelConfig, batch: int, new: int, layers: int):
    """Validate a cached prefix [layers, B, S, 2, K, H] and its per-row lengths; returns (kv, lengths)."""
    if prefix_kv is None:
        prefix_kv = np.zeros((layers, batch, 0, 2, cfg.n_kv_heads, cfg.head_dim), cfg.jnp_dtype)
    want = (layers, batch, None, 2, cfg.n_kv_heads, cfg.head_dim)
    shape = tuple(prefix_kv.shape)
    if len(shape) != 6 or any(w is not None and w != s for w, s in zip(want, shape)):
        raise InputError(f"prefix_kv has shape {shape}, expected [L={layers}, B={batch}, S, 2, "
                         f"K={cfg.n_kv_heads}, H={cfg.head_dim}] for {cfg.name!r}")
    if prefix_kv.dtype != cfg.jnp_dtype:
        raise InputError(f"prefix_kv has dtype {prefix_kv.dtype}, expected {cfg.dtype} for {cfg.name!r}")
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


def host_padded(a, axis: int, size: int, dtype=None) -> np.ndarray:
    """`a` copied (as `dtype`, default its own) into a new host array zero-padded (or cut) along
    `axis` to `size`, aligned to `HOST_ALIGN` bytes so that `jax.device_put` takes it as it is on
    the CPU (XLA's CPU client aliases an aligned host array; an unaligned one it copies again) and
    transfers it elsewhere. Padding on the host compiles nothing, where an eager `jnp.pad` or
    slice compiles a program for every new unpadded length (0.2-0.5 s a pass on CPU for `small`:
    every agent turn has a new length)."""
    a = np.asarray(a)
    dtype = a.dtype if dtype is None else np.dtype(dtype)
    shape = (*a.shape[:axis], size, *a.shape[axis + 1:])
    owner = np.empty(int(np.prod(shape)) * dtype.itemsize + HOST_ALIGN, np.uint8)
    start = -owner.ctypes.data % HOST_ALIGN
    out = owner[start:start + owner.size - HOST_ALIGN].view(dtype).reshape(shape)
    n = min(a.shape[axis], size)
    out[(slice(None),) * axis + (slice(0, n),)] = a[(slice(None),) * axis + (slice(0, n),)]
    out[(slice(None),) * axis + (slice(n, None),)] = 0
    return out


@jax.jit
def rows_at(x, index):
    """x [B, T, ...] at token index[b] of each row b: [B, ...] (one program per padded shape)."""
    return x[jnp.arange(x.shape[0]), index]


def _pad(a, axis: int, size: int):
    if a.shape[axis] == size:
        return a
    widths = [(0, 0)] * a.ndim
    widths[axis] = (0, size - a.shape[axis])
    return jnp.pad(a, widths)


def prefill(params: Params, cfg: ModelConfig, tokens, prefix_kv=None, prefix_len=None,
            buckets: Buckets = DEFAULT_BUCKETS):
    """Prefill new tokens [B, T] over a cached prefix [L, B, S, 2, K, H] (None or S = 0: no prefix).

    Returns (logits [B, T, V] float32, kv [L, B, T, 2, K, H]) for the new tokens only.
    Raises InputError for ids outside the vocabulary, a misshaped prefix, or a sequence past
    `cfg.max_seq_len`.
    """
    tokens = check_tokens(tokens, cfg)
    B, T = tokens.shape
    prefix_kv, lengths = check_prefix(prefix_kv, prefix_len, cfg, B, T, cfg.n_layers)
    Tb, Sb = buckets.new(T), buckets.prefix(int(lengths.max(initial=0)))
    logits, kv = forward_jit(params, cfg, _pad(jnp.asarray(tokens), 1, Tb),
                              _pad(jnp.asarray(prefix_kv)[:, :, :Sb], 2, Sb), jnp.asarray(lengths))
    return logits[:, :T], kv[:, :, :T]


@functools.partial(jax.jit, static_argnums=3)
def _layer_jit(x, lp, positions, cfg, prefix_kv, prefix_len):
    return forward_layer(x, lp, positions, cfg, prefix_kv, prefix_len)


_embed_jit = jax.jit(embed)
_head_jit = jax.jit(head, static_argnums=1)


class Layerwise:
    """One prefill driven a layer at a time (the runtime's form of `prefill`).

    Usage: `lw = Layerwise(params, cfg, tokens, prefix_len)`; for each layer l in order,
    `kv_l = lw.layer(l, prefix_kv_l)` with prefix_kv_l [B, S, 2, K, H] (S >= max prefix_len);
    then `lw.logits()`. Each call is asynchronous (JAX dispatch), so the caller can load the next
    layer's KV while this one computes. Results equal `prefill` up to float rounding of fusion.
    """

    # the programs of one pass, and how a prefix is checked: what another model family replaces
    _embed, _layer, _head = staticmethod(_embed_jit), staticmethod(_layer_jit), staticmethod(_head_jit)

    def _check_prefix(self, prefix_kv, lengths):
        """Checked (prefix [1, B, S, *record], lengths [B]) of one layer; raises InputError."""
        return check_prefix(prefix_kv, lengths, self.cfg, self.B, self.T, 1)

    def _no_prefix(self, S: int) -> np.ndarray:
        """A zero prefix [1, B, S, *record] of one layer, in the cache record's dtype."""
        return np.zeros((1, self.B, S, *self.cfg.kv_record_shape), self.cfg.kv_dtype)

    def __init__(self, params: Params, cfg: ModelConfig, tokens, prefix_len=None,
                 buckets: Buckets = DEFAULT_BUCKETS):
        tokens = check_tokens(tokens, cfg)
        self.params, self.cfg, self.B, self.T = params, cfg, *tokens.shape
        lengths = np.zeros(self.B, np.int32) if prefix_len is None else np.asarray(prefix_len, np.int32)
        _, self.prefix_len = self._check_prefix(self._no_prefix(int(lengths.max(initial=0))), lengths)
        self.Tb, self.Sb = buckets.new(self.T), buckets.prefix(int(lengths.max(initial=0)))
        self.positions = jnp.asarray(self.prefix_len[:, None] + np.arange(self.Tb)[None, :])
        self.x = self._embed(params, jax.device_put(host_padded(tokens, 1, self.Tb)))
        self.next_layer = 0
        self._handed: np.ndarray | None = None  # the last `prefix_buffer`, until a layer takes it
        # Device copies of the prefix KV of the last two layers: the one computing and the one
        # before it (still in flight). Older ones are dropped, so the device holds ~2 layers.
        self.held: collections.deque = collections.deque(maxlen=2)

    def layer(self, layer: int, prefix_kv):
        """Run `layer` over its prefix KV [B, S, 2, K, H]; returns the new tokens' KV [B, T, 2, K, H]."""
        return self.layer_padded(layer, prefix_kv)[:, :self.T]

    def layer_padded(self, layer: int, prefix_kv):
        """`layer` without the final cut: [B, Tb, 2, K, H], padded to the new-token bucket, so that a new
        unpadded length compiles nothing (the runtime's form: it cuts each row on the host)."""
        if layer != self.next_layer:
            raise InputError(f"Layerwise expects layer {self.next_layer} next, got {layer}")
        self._check_prefix(prefix_kv[None], self.prefix_len)
        if prefix_kv is self._handed:  # filled by the caller in this pass's own buffer: taken as it is
            self._handed = None
        else:  # a copy: a host buffer the caller reuses (a PE buffer) must not change under a
            # computation still running; padded on the host, so no shape but the bucket's reaches
            # the device. The one copy: device_put aliases it on the CPU (jnp.asarray would copy it again)
            prefix_kv = host_padded(prefix_kv, 1, self.Sb)
        prefix_kv = jax.device_put(prefix_kv)
        self.held.append(prefix_kv)
        self.x, kv = self._layer(self.x, self.params["layers"][layer], self.positions, self.cfg, prefix_kv,
                                 jnp.asarray(self.prefix_len))
        self.next_layer += 1
        return kv

    def prefix_buffer(self) -> np.ndarray:
        """A zeroed host array [B, Sb, *record] (the prefix bucket) for the caller to fill with the
        next layer's prefix KV and pass to `layer_padded`, which then takes it without a copy: a
        caller that assembles a prefix anyway (several rows, earlier chunks) saves one. It belongs
        to the pass from then on; the caller must not touch it again."""
        self._handed = host_padded(self._no_prefix(0)[0], 1, self.Sb)
        return self._handed

    def _head_after_last(self, what: str):
        """The head over the last layer's output [B, Tb, V]; raises InputError before it."""
        if self.next_layer != self.cfg.n_layers:
            raise InputError(f"Layerwise.{what}() after {self.next_layer} of {self.cfg.n_layers} layers")
        self.held.clear()
        return self._head(self.params, self.cfg, self.x)

    def logits(self):
        """Logits [B, T, V] float32 after the last layer."""
        return self._head_after_last("logits")[:, :self.T]

    def compile_rest(self) -> None:
        """Compile the programs the rest of this pass runs, for a warm-up: its layers (one program per
        distinct layer of parameters) over a prefix of this pass's bucket without running them (a
        pass over a long prefix costs seconds to run), then the head and `logits_at`'s pick, which
        run once. Leaves the pass where it was."""
        prefix = jnp.asarray(self._no_prefix(self.Sb)[0])
        lengths, seen = jnp.asarray(self.prefix_len), set()
        for lp in self.params["layers"][self.next_layer:]:
            if (sig := _signature(lp)) not in seen:
                seen.add(sig)
                self._layer.lower(self.x, lp, self.positions, self.cfg, prefix, lengths).compile()
        # the head and the pick run (once, cheap beside the layers): compiled for the very arrays they get
        np.asarray(rows_at(self._head(self.params, self.cfg, self.x), jnp.asarray(np.zeros(self.B, np.int32))))

    def logits_at(self, index):
        """Logits [B, V] float32 of token index[b] of each row, after the last layer (no program per
        unpadded length)."""
        return rows_at(self._head_after_last("logits_at"), jnp.asarray(index, jnp.int32))


def _signature(tree) -> tuple:
    """What a jitted program depends on of a pytree of arrays: its structure, shapes, dtypes, shardings."""
    leaves, treedef = jax.tree.flatten(tree)
    return treedef, tuple((a.shape, a.dtype, getattr(a, "sharding", None)) for a in leaves)


def compile_counts() -> dict[str, int]:
    """Programs compiled so far per jitted entry point (shape buckets keep these small)."""
    return {"prefill": forward_jit._cache_size(), "layer": _layer_jit._cache_size(),
            "embed": _embed_jit._cache_size(), "head": _head_jit._cache_size()}
