"""The layerwise prefill driver of the DeepSeek family: `models.Layerwise` for a `DeepSeekConfig`.

Same contract as the dense `models.prefill.Layerwise`: layer l's prefix records [B, S, *record] go
in, the new tokens' records [B, T, *record] come out, each call dispatched asynchronously, and the
same `forward_layer` as the fused `models.deepseek.prefill`, so the two agree.
"""

from __future__ import annotations

import functools

import jax

from models import deepseek
from models.prefill import Layerwise


@functools.partial(jax.jit, static_argnums=3)
def _layer_jit(x, lp, positions, cfg, prefix_kv, prefix_len):
    return deepseek.forward_layer(x, lp, positions, cfg, prefix_kv, prefix_len)


_embed_jit = jax.jit(deepseek.embed)
_head_jit = jax.jit(deepseek.head, static_argnums=1)


class DeepSeekLayerwise(Layerwise):
    """One prefill driven a layer at a time: `lw.layer(l, prefix_records_l)` for l = 0..L-1, then
    `lw.logits()` (or `logits_at`). Raises InputError for bad tokens, prefixes or layer order. The
    dense driver's code, with this family's programs and record checks."""

    _embed, _layer, _head = staticmethod(_embed_jit), staticmethod(_layer_jit), staticmethod(_head_jit)

    def _check_prefix(self, prefix_kv, lengths):
        return deepseek.check_records(prefix_kv, lengths, self.cfg, self.B, self.T, 1)
