"""Load-or-recompute rules from the field (docs/policies.md, "Baselines from the field"): llm-d's, Mooncake's
and SGLang HiCache's, and `dualpath-deadline`, DualPath's side with a read deadline. Each is a `Policy`
(dualjax/core/policies.py) built into the registry: `--policy NAME[:arg=value,...]` names it.

Most are a `LoadOrRecompute`: a reading side, and `loaded`, how many hit tokens that side loads; the
PE recomputes the rest."""

from __future__ import annotations

import math

from dualjax.core.policies import POLICIES, DualPath, Plan, Policy, load_prefix

SIDES = ("pe", "de", "dualpath")
_DUALPATH = DualPath()


def _with_deadline(request, side: str, seconds: float) -> Plan:
    """`side` reads every hit block, under a read deadline of `seconds` (`Plan.deadline_s`)."""
    return Plan(de_tokens=request.hit_tokens if side == "de" else 0, deadline_s=seconds)


def _readable(reader, seconds: float) -> float:
    """Tokens `reader`'s storage NIC delivers for a new read within `seconds`, behind its queue."""
    R = reader.read_tokens_per_s
    if not R or not math.isfinite(R):
        return math.inf
    return seconds * R - reader.read_q_tokens


class LoadOrRecompute(Policy):
    """A rule from another system: `side` ("pe", the default: the engine that prefills reads, as in
    those systems; "de"; or "dualpath", DualPath's choice, the shorter read queue) reads the first
    `loaded(request, pe, de, side)` hit tokens, rounded down to a block; the PE recomputes the rest."""

    side = "pe"

    def __init__(self, side: str | None = None):
        if side is not None:
            self.side = side
        if self.side not in SIDES:
            raise ValueError(f"side={self.side!r}: one of {', '.join(SIDES)}")

    def path(self, request, pe, de):
        side = _DUALPATH.path(request, pe, de) if self.side == "dualpath" else self.side
        return load_prefix(request, side, self.loaded(request, pe, de, side))

    def loaded(self, request, pe, de, side: str) -> int:
        """Hit tokens `side` ("pe" or "de") loads: `request.hit_tokens` for all, 0 to recompute them all."""
        raise NotImplementedError


class LlmdPull(LoadOrRecompute):
    """llm-d's cost-aware pull-or-recompute (llm-d-router issues 2273, 2443): load the H hit tokens only
    when t0 + H * beta + setup < T_recompute * (1 + L / B), beta = 1 / R the reading node's storage
    NIC, T_recompute the PE's idle time to compute them (`prefill_s(0, prompt) - prefill_s(H, miss)`, or
    H / prefill_tokens_per_s without a fit), L the PE's queued tokens and B `batch_tokens`: R_eff =
    R_peak / (1 + L / B), half the rate when a full batch is in flight. Else recompute them all.
    `read_queue=True` adds the reading NIC's queue to the pull, q / R."""
    name, side = "llmd-pull", "dualpath"

    def __init__(self, t0_s: float = 0.0, setup_s: float = 0.0, batch_tokens: int = 8192,
                 read_queue: bool = False, side: str | None = None):
        super().__init__(side)
        self.t0_s, self.setup_s, self.batch_tokens, self.read_queue = t0_s, setup_s, batch_tokens, read_queue

    def loaded(self, request, pe, de, side):
        hit = request.hit_tokens
        reader, rate = pe if side == "pe" else de, pe.prefill_tokens_per_s
        R = reader.read_tokens_per_s
        if not hit or not R or not rate or not math.isfinite(R):
            return hit
        pull = self.t0_s + hit / R + self.setup_s + (reader.read_q_tokens / R if self.read_queue else 0.0)
        fit = pe.prefill_s
        idle = fit(0, request.prompt_tokens) - fit(hit, request.miss_tokens) if fit else hit / rate
        return hit if pull < idle * (1 + pe.tokens / self.batch_tokens) else 0


class HitRatio(LoadOrRecompute):
    """Mooncake's cache-aware threshold (Conductor, arXiv 2407.00079 §6, Algorithm 1): load the prefix
    when it is a large enough share of the prompt, `hit_tokens / prompt_tokens >= threshold`; else
    recompute it all. No cost model."""
    name = "hit-ratio"

    def __init__(self, threshold: float = 0.5, side: str | None = None):
        super().__init__(side)
        self.threshold = threshold

    def loaded(self, request, pe, de, side):
        return request.hit_tokens if request.hit_tokens >= self.threshold * request.prompt_tokens else 0


class HiCacheWait(LoadOrRecompute):
    """SGLang HiCache's `wait_complete` prefetch: a prefix of at least `prefetch_threshold` hit tokens
    is loaded whole before the prefill; a shorter one is recomputed (HiCache does not prefetch it)."""
    name = "hicache-wait"

    def __init__(self, prefetch_threshold: int = 256, side: str | None = None):
        super().__init__(side)
        self.prefetch_threshold = prefetch_threshold

    def loaded(self, request, pe, de, side):
        return request.hit_tokens if request.hit_tokens >= self.prefetch_threshold else 0


class HiCacheBestEffort(HiCacheWait):
    """SGLang HiCache's `best_effort` prefetch: the prefill starts when the PE is free, with whatever
    part of the prefix has arrived by then; the rest is recomputed. Predicted here: the whole blocks the
    reading NIC delivers, behind its queue, within the PE's own queue, tokens / prefill_tokens_per_s (an
    idle PE: none). Below `prefetch_threshold` everything is recomputed."""
    name = "hicache-best-effort"

    def loaded(self, request, pe, de, side):
        hit, rate = request.hit_tokens, pe.prefill_tokens_per_s
        if hit < self.prefetch_threshold:
            return 0
        if not rate:
            return hit
        return int(min(hit, _readable(pe if side == "pe" else de, pe.tokens / rate)))


class HiCacheTimeout(HiCacheWait):
    """SGLang HiCache's `timeout` prefetch (its default): the prefill waits for the prefix up to
    `timeout_base_s + timeout_per_ki_token_s * H / 1024` seconds, then recomputes what has not arrived:
    that time is the plan's read deadline (`Plan.deadline_s`), so what arrives is what the storage NIC
    delivers, not a prediction. Below `prefetch_threshold` hit tokens everything is recomputed."""
    name = "hicache-timeout"

    def __init__(self, prefetch_threshold: int = 256, timeout_base_s: float = 1.0,
                 timeout_per_ki_token_s: float = 0.25, side: str | None = None):
        super().__init__(prefetch_threshold, side)
        self.timeout_base_s, self.timeout_per_ki_token_s = timeout_base_s, timeout_per_ki_token_s

    def path(self, request, pe, de):
        got = super().path(request, pe, de)  # the side, or below the threshold every block recomputed
        hit = request.hit_tokens
        if hit < self.prefetch_threshold:
            return got
        return _with_deadline(request, got, self.timeout_base_s + self.timeout_per_ki_token_s * hit / 1024)


def recompute_s(request, pe) -> float | None:
    """Seconds the PE needs to compute `request`'s hit tokens rather than load them, after its own queue:
    `tokens / prefill_tokens_per_s + prefill_s(0, prompt) - prefill_s(H, miss)` (without a fit, H at
    `prefill_tokens_per_s`); None without a rate."""
    rate, fit, hit = pe.prefill_tokens_per_s, pe.prefill_s, request.hit_tokens
    if not rate:
        return None
    extra = fit(0, request.prompt_tokens) - fit(hit, request.miss_tokens) if fit else hit / rate
    return pe.tokens / rate + max(0.0, extra)


class DualPathDeadline(DualPath):
    """DualPath's side, with a read deadline of what recomputing the hit would cost the PE: its own queue
    plus the extra time a pass over the hit as new tokens takes (`recompute_s`), times `factor`, at least
    `min_s`. A read that has not delivered by then would end the request later than computing it: its
    remaining blocks are recomputed. No rate in the PE's view: no deadline (DualPath)."""
    name = "dualpath-deadline"

    def __init__(self, factor: float = 1.0, min_s: float = 0.0):
        self.factor, self.min_s = factor, min_s

    def path(self, request, pe, de):
        side = super().path(request, pe, de)
        s = recompute_s(request, pe)
        if s is None or not request.hit_tokens:
            return side
        return _with_deadline(request, side, max(self.min_s, self.factor * s))


class LlmdSelective(LoadOrRecompute):
    """llm-d's selective KV load (llm-d-router pull request 2833, "1024 + 8"): load when the prefix has
    at least `min_tokens` hit tokens and the PE has fewer than `max_waiting` requests (`seq`); else
    recompute it all."""
    name = "llmd-selective"

    def __init__(self, min_tokens: int = 1024, max_waiting: int = 8, side: str | None = None):
        super().__init__(side)
        self.min_tokens, self.max_waiting = min_tokens, max_waiting

    def loaded(self, request, pe, de, side):
        return request.hit_tokens if request.hit_tokens >= self.min_tokens and pe.seq < self.max_waiting else 0


POLICIES.update({cls.name: cls for cls in (DualPathDeadline, LlmdPull, HitRatio, HiCacheWait, HiCacheBestEffort,
                                           HiCacheTimeout, LlmdSelective)})
