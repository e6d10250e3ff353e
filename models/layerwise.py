"""The layerwise prefill driver of every family: the same `forward_layer` as the fused `prefill`
(`models.inference`), run one layer at a time so a runtime can load layer l+1's records while layer l
computes. Lengths are padded to a few buckets (powers of two) so a long multi-turn run compiles a
handful of programs.
"""

from __future__ import annotations

import collections

import jax
import jax.numpy as jnp
import numpy as np

from models.buckets import DEFAULT_BUCKETS, Buckets
from models.checks import InputError, check_prefix, check_tokens, empty_prefix
from models.inference import forward_jit, forward_layer
from models.layers import embed, head
from models.padding import host_padded
from models.params import Params


@jax.jit
def rows_at(x, index):
    """x [B, T, ...] at token index[b] of each row b: [B, ...] (one program per padded shape)."""
    return x[jnp.arange(x.shape[0]), index]


_layer_jit = jax.jit(forward_layer, static_argnums=3)

_embed_jit = jax.jit(embed)
_head_jit = jax.jit(head, static_argnums=1)


class Layerwise:
    """One prefill driven a layer at a time (the runtime's form of `prefill`), for any family.

    Usage: `lw = Layerwise(params, cfg, tokens, prefix_len)`; for each layer l in order,
    `kv_l = lw.layer(l, prefix_kv_l)` with prefix_kv_l [B, S, *record] (S >= max prefix_len);
    then `lw.logits()`. Each call is asynchronous (JAX dispatch), so the caller can load the next
    layer's records while this one computes. Results equal `prefill` up to float rounding of fusion.
    Raises InputError for bad tokens, prefixes or layer order.
    """

    def _check_prefix(self, prefix_kv, lengths):
        """Checked (prefix [1, B, S, *record], lengths [B]) of one layer; raises InputError."""
        return check_prefix(prefix_kv, lengths, self.cfg, self.B, self.T, 1)

    def __init__(self, params: Params, cfg, tokens, prefix_len=None, buckets: Buckets = DEFAULT_BUCKETS):
        tokens = check_tokens(tokens, cfg)
        self.params, self.cfg, self.B, self.T = params, cfg, *tokens.shape
        lengths = np.zeros(self.B, np.int32) if prefix_len is None else np.asarray(prefix_len, np.int32)
        _, self.prefix_len = self._check_prefix(empty_prefix(cfg, 1, self.B, int(lengths.max(initial=0))), lengths)
        self.Tb, self.Sb = buckets.new(self.T), buckets.prefix(int(lengths.max(initial=0)))
        self.positions = jnp.asarray(self.prefix_len[:, None] + np.arange(self.Tb)[None, :])
        self.x = _embed_jit(params, jax.device_put(host_padded(tokens, 1, self.Tb)))
        self.next_layer = 0
        self._handed: np.ndarray | None = None  # the last `prefix_buffer`, until a layer takes it
        # Device copies of the prefix KV of the last two layers: the one computing and the one
        # before it (still in flight). Older ones are dropped, so the device holds ~2 layers.
        self.held: collections.deque = collections.deque(maxlen=2)

    def layer(self, layer: int, prefix_kv):
        """Run `layer` over its prefix records [B, S, *record]; returns the new tokens' [B, T, *record]."""
        return self.layer_padded(layer, prefix_kv)[:, :self.T]

    def layer_padded(self, layer: int, prefix_kv):
        """`layer` without the final cut: [B, Tb, *record], padded to the new-token bucket, so that a new
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
        self.x, kv = _layer_jit(self.x, self.params["layers"][layer], self.positions, self.cfg, prefix_kv,
                                 jnp.asarray(self.prefix_len))
        self.next_layer += 1
        return kv

    def prefix_buffer(self) -> np.ndarray:
        """A zeroed host array [B, Sb, *record] (the prefix bucket) for the caller to fill with the
        next layer's prefix KV and pass to `layer_padded`, which then takes it without a copy: a
        caller that assembles a prefix anyway (several rows, earlier chunks) saves one. It belongs
        to the pass from then on; the caller must not touch it again."""
        self._handed = host_padded(empty_prefix(self.cfg, 1, self.B)[0], 1, self.Sb)
        return self._handed

    def _head_after_last(self, what: str):
        """The head over the last layer's output [B, Tb, V]; raises InputError before it."""
        if self.next_layer != self.cfg.n_layers:
            raise InputError(f"Layerwise.{what}() after {self.next_layer} of {self.cfg.n_layers} layers")
        self.held.clear()
        return _head_jit(self.params, self.cfg, self.x)

    def logits(self):
        """Logits [B, T, V] float32 after the last layer."""
        return self._head_after_last("logits")[:, :self.T]

    def compile_rest(self) -> None:
        """Compile the programs the rest of this pass runs, for a warm-up: its layers (one program per
        distinct layer of parameters) over a prefix of this pass's bucket without running them (a
        pass over a long prefix costs seconds to run), then the head and `logits_at`'s pick, which
        run once. Leaves the pass where it was."""
        prefix = jnp.asarray(empty_prefix(self.cfg, 1, self.B, self.Sb)[0])
        lengths, seen = jnp.asarray(self.prefix_len), set()
        for lp in self.params["layers"][self.next_layer:]:
            if (sig := _signature(lp)) not in seen:
                seen.add(sig)
                _layer_jit.lower(self.x, lp, self.positions, self.cfg, prefix, lengths).compile()
        # the head and the pick run (once, cheap beside the layers): compiled for the very arrays they get
        np.asarray(rows_at(_head_jit(self.params, self.cfg, self.x), jnp.asarray(np.zeros(self.B, np.int32))))

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
