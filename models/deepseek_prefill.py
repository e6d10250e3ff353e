"""The layerwise prefill driver of the DeepSeek family: `models.Layerwise` for a `DeepSeekConfig`.

Same contract as the dense `models.prefill.Layerwise`: layer l's prefix records [B, S, *record] go
in, the new tokens' records [B, T, *record] come out, each call dispatched asynchronously, and the
same `forward_layer` as the fused `models.deepseek.prefill`, so the two agree.
"""

from __future__ import annotations

import collections
import functools

import jax
import jax.numpy as jnp
import numpy as np

from models import deepseek
from models.buckets import DEFAULT_BUCKETS, Buckets
from models.deepseek_config import DeepSeekConfig
from models.params import Params
from models.prefill import InputError, check_tokens, host_padded, rows_at


@functools.partial(jax.jit, static_argnums=3)
def _layer_jit(x, lp, positions, cfg, prefix_kv, prefix_len):
    return deepseek.forward_layer(x, lp, positions, cfg, prefix_kv, prefix_len)


_embed_jit = jax.jit(deepseek.embed)
_head_jit = jax.jit(deepseek.head, static_argnums=1)


class DeepSeekLayerwise:
    """One prefill driven a layer at a time: `lw.layer(l, prefix_records_l)` for l = 0..L-1, then
    `lw.logits()`. Raises InputError for bad tokens, prefixes or layer order."""

    def __init__(self, params: Params, cfg: DeepSeekConfig, tokens, prefix_len=None,
                 buckets: Buckets = DEFAULT_BUCKETS):
        tokens = check_tokens(tokens, cfg)
        self.params, self.cfg, self.B, self.T = params, cfg, *tokens.shape
        lengths = np.zeros(self.B, np.int32) if prefix_len is None else np.asarray(prefix_len, np.int32)
        _, self.prefix_len = deepseek.check_records(
            deepseek.empty_kv(cfg, 1, self.B, int(lengths.max(initial=0))), lengths, cfg, self.B, self.T, 1)
        self.Tb, self.Sb = buckets.new(self.T), buckets.prefix(int(lengths.max(initial=0)))
        self.positions = jnp.asarray(self.prefix_len[:, None] + np.arange(self.Tb)[None, :])
        self.x = _embed_jit(params, jnp.asarray(host_padded(tokens, 1, self.Tb)))
        self.next_layer = 0
        self.held: collections.deque = collections.deque(maxlen=2)  # the prefixes of the last two layers

    def layer(self, layer: int, prefix_kv):
        """Run `layer` over its prefix records [B, S, *record]; returns the new tokens' [B, T, *record]."""
        return self.layer_padded(layer, prefix_kv)[:, :self.T]

    def layer_padded(self, layer: int, prefix_kv):
        """`layer` without the final cut: [B, Tb, *record] (see `models.prefill.Layerwise.layer_padded`)."""
        if layer != self.next_layer:
            raise InputError(f"Layerwise expects layer {self.next_layer} next, got {layer}")
        deepseek.check_records(prefix_kv[None], self.prefix_len, self.cfg, self.B, self.T, 1)
        # a copy, padded on the host: the caller may reuse its host buffer while this layer computes
        prefix_kv = jnp.asarray(host_padded(prefix_kv, 1, self.Sb))
        self.held.append(prefix_kv)
        self.x, kv = _layer_jit(self.x, self.params["layers"][layer], self.positions, self.cfg, prefix_kv,
                                jnp.asarray(self.prefix_len))
        self.next_layer += 1
        return kv

    def logits(self):
        """Logits [B, T, V] float32 after the last layer."""
        if self.next_layer != self.cfg.n_layers:
            raise InputError(f"Layerwise.logits() after {self.next_layer} of {self.cfg.n_layers} layers")
        self.held.clear()
        return _head_jit(self.params, self.cfg, self.x)[:, :self.T]

    def logits_at(self, index):
        """Logits [B, V] float32 of token index[b] of each row, after the last layer."""
        if self.next_layer != self.cfg.n_layers:
            raise InputError(f"Layerwise.logits_at() after {self.next_layer} of {self.cfg.n_layers} layers")
        self.held.clear()
        return rows_at(_head_jit(self.params, self.cfg, self.x), jnp.asarray(index, jnp.int32))
