"""PE intra-engine batching (docs/paper.md §7): pack requests FIFO into one prefill pass while the
predicted time of one attention layer over the batch stays within a compute quota; the request that
would overflow is chunked, its chunk size found by binary search. The quota bounds attention only (the
term that grows with each row's context and differs between data-parallel attention GPUs), per layer:
a fit predicts the whole forward's attention, so `pack` divides it by the layers it covers. The
linear layers' time, per token and shared by the expert-parallel step, is left out of it. Without
intra-engine scheduling (quota None: the ablation's naive step) a pass takes every ready request. Passes
here run rows padded to a common shape (no ragged attention on CPU), so the attention time is that
of the padded batch; the simulator packs with the same rule, padded or ragged (GPU) passes. A fit
without an attention term (a = 0) predicts no attention time: the quota then never binds and a pass
takes every ready request, each up to the chunk cap. Pure Python: no MPI, no JAX.
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class AttentionFit:
    """Predicted seconds to prefill `new` tokens over `cached` ones on one engine:
    a * new * (cached + new / 2) + b * new + c (attention, then linear work, then overhead)."""

    a: float
    b: float
    c: float

    def predict(self, cached: int, new: int) -> float:
        """The whole pass: attention, linear work and overhead."""
        return self.attention(cached, new) + self.b * new + self.c

    def attention(self, cached: int, new: int) -> float:
        """The attention layers' share, the time the compute quota bounds (docs/paper.md §7); 0 when a = 0."""
        return self.a * new * (cached + new / 2)

    @classmethod
    def fit(cls, samples: list[tuple[int, int, float]]) -> "AttentionFit":
        """Non-negative least squares over (cached, new, seconds) samples (a time never falls as work grows)."""
        x = np.array([[n * (c + n / 2), n, 1.0] for c, n, _ in samples])
        y = np.array([s for _, _, s in samples])
        import scipy.optimize  # here: ~0.6 s of import that only a PE's start-up profile needs
        coef, _ = scipy.optimize.nnls(x, y)
        return cls(*map(float, coef))


@dataclasses.dataclass
class Work:
    """A request's remaining prefill: `cached` tokens are already prefix, `remaining` still to compute."""

    key: object
    cached: int
    remaining: int


def pack(queue: list[Work], fit, quota_s: float | None, max_chunk: int, min_chunk: int = 16, padded: bool = True,
         layers: int = 1):
    """[(work, tokens)] for the next pass, FIFO, with the predicted time of one attention layer over the
    batch within `quota_s` (None: no quota, every request up to `max_chunk` tokens). `fit` has
    `attention(cached, new) -> seconds` over `layers` attention layers (an `AttentionFit` of whole passes,
    the simulator's `Costs`): one layer takes that over `layers`. Padded passes (here: no ragged
    attention on CPU) run rows padded to the longest prefix and chunk, so B rows are predicted to take
    B * attention(max cached, max new); ragged ones (GPUs, in the simulator) the sum of each row's. A
    request that does not fit whole gets the largest chunk that does (binary search) and closes the
    batch; a first request of which not one token fits gets `min_chunk`, so every pass progresses. Where
    the fit predicts no attention time (a = 0) every request fits: only `max_chunk` bounds the pass."""
    if quota_s is None:
        return [(w, min(w.remaining, max_chunk)) for w in queue]
    quota_s *= layers  # the quota of one layer, against the fit's attention over all of them
    attention = fit.attention
    batch: list[tuple[Work, int]] = []
    spent = 0.0  # ragged: predicted attention seconds of the rows already in the batch

    def cost(c, n):
        if not padded:
            return spent + attention(c, n)
        return (len(batch) + 1) * attention(max([c] + [w.cached for w, _ in batch]),
                                            max([n] + [k for _, k in batch]))
    for w in queue:
        n = w.remaining if w.remaining < max_chunk else max_chunk  # min(): a builtin call costs more
        if padded:
            fits = cost(w.cached, n) <= quota_s
        else:
            own = attention(w.cached, n)
            fits = spent + own <= quota_s
        if fits:
            batch.append((w, n))
            if not padded:
                spent += own
            continue
        lo, hi = 0, n
        while lo < hi:  # largest chunk whose predicted batch attention time still fits
            mid = (lo + hi + 1) // 2
            if cost(w.cached, mid) <= quota_s:
                lo = mid
            else:
                hi = mid - 1
        if lo:
            batch.append((w, lo))
        elif not batch:
            batch.append((w, min(n, min_chunk)))
        break
    return batch


def fit_memory(plan: list, budget_bytes: float, bytes_per_token: float, layers_held: int, n_layers: int) -> list:
    """The head of a packed `plan` ([(work, tokens)]) whose KV fits a PE's device memory: each row holds
    its prefix and new tokens' KV for `layers_held` of the model's `n_layers` layers (layerwise: one or
    two, loaded, used and freed layer by layer). The first row always stays, so every pass progresses."""
    per_token = bytes_per_token * layers_held / n_layers
    held, kept = 0.0, []
    for w, n in plan:
        held += (w.cached + n) * per_token
        if kept and held > budget_bytes:
            break
        kept.append((w, n))
    return kept


def fit_free(plan: list, free_bytes: float, need) -> list:
    """The head of a packed `plan` ([(work, tokens)]) whose further memory, `need(work)` bytes per row
    (0 for a row that holds its memory already), fits `free_bytes`: a Basic batch about to be loaded.
    Empty when not even its first row fits: the batch waits until memory is released."""
    kept, used = [], 0.0
    for w, n in plan:
        used += need(w)
        if used > free_bytes:
            break
        kept.append((w, n))
    return kept
