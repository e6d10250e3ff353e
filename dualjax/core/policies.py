"""Read-path policies: which side reads a request's hit blocks (and, optionally, which engines).

A policy decides over plain snapshots (`RequestView`, `EngineView`), so the same object runs in
the real runtime, in the simulator and in a notebook. To write one, subclass `Policy` and
implement `path`; override `engines` to take over engine choice too:

    class Greedy(Policy):
        name = "greedy"
        def path(self, request, pe, de):
            return "de" if de.read_q_tokens < pe.read_q_tokens else "pe"

`path` may also return a `Plan`: the hit blocks split between the two sides at a block boundary,
and a tail of them recomputed instead of loaded (docs/policies.md).
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import numbers

from dualjax.core.streams import stream


def direct_init(cls):
    """Give frozen dataclass `cls` (with slots) an `__init__` that sets each slot through its descriptor:
    the generated one goes through `object.__setattr__`, which costs ~70 % more, and a paper-scale
    simulation builds millions of these snapshots. Fields with a plain default or none only (no
    factories, no `__post_init__`)."""
    fields = dataclasses.fields(cls)
    if (any(f.default_factory is not dataclasses.MISSING or not f.init for f in fields)
            or hasattr(cls, "__post_init__") or "__slots__" not in cls.__dict__):
        raise TypeError(f"direct_init supports slotted plain fields only, not {cls.__name__}'s")
    ns = {f"_{f.name}": f.default for f in fields if f.default is not dataclasses.MISSING}
    ns |= {f"_set_{f.name}": getattr(cls, f.name).__set__ for f in fields}
    args = ", ".join(f.name if f.default is dataclasses.MISSING else f"{f.name}=_{f.name}" for f in fields)
    sets = "; ".join(f"_set_{f.name}(self, {f.name})" for f in fields)
    exec(f"def __init__(self, {args}):\n    {sets}\n", ns)
    cls.__init__ = ns["__init__"]
    return cls


@direct_init
@dataclasses.dataclass(frozen=True, slots=True)
class Plan:
    """How one request's hit prefix (its `hit_tokens`, whole blocks) reaches its prefill: the DE reads
    the first `de_tokens` and relays them to the PE layer by layer, the PE reads the hit tokens after
    those, and the last `recompute_tokens` are not loaded: the PE computes them with the miss tokens.
    Both are whole blocks. "pe" is `Plan()`, "de" is `Plan(de_tokens=request.hit_tokens)`."""

    de_tokens: int = 0
    recompute_tokens: int = 0

    def loaded(self, request) -> int:
        """Hit tokens loaded from storage, by either side."""
        return request.hit_tokens - self.recompute_tokens

    def pe_tokens(self, request) -> int:
        """Hit tokens the PE reads itself."""
        return request.hit_tokens - self.recompute_tokens - self.de_tokens

    def problem(self, request) -> str | None:
        """Why this plan does not fit `request`, or None."""
        T = request.block_tokens
        for name in ("de_tokens", "recompute_tokens"):
            v = getattr(self, name)
            if not isinstance(v, numbers.Integral) or v < 0 or v % T:
                return f"{name}={v!r} is not a whole number of {T}-token blocks"
        if self.de_tokens + self.recompute_tokens > request.hit_tokens:
            return (f"de_tokens={self.de_tokens} + recompute_tokens={self.recompute_tokens} exceed the request's "
                    f"{request.hit_tokens} hit tokens")
        return None

    def label(self, request) -> str:
        """The request table's `path`: pe or de when one side reads every loaded block, else split."""
        if self.de_tokens == 0:
            return "pe"
        return "de" if self.pe_tokens(request) == 0 else "split"


_PE = Plan()  # every "pe" choice's plan (a Plan is immutable)


def as_plan(choice, request, policy) -> tuple[Plan, str]:
    """(plan, path label) of what `policy.path` returned for `request`; ValueError (one line, naming the
    policy) for anything but "pe", "de" or a Plan that fits the request."""
    if choice == "pe":
        return _PE, "pe"
    if choice == "de":
        return Plan(de_tokens=request.hit_tokens), "de"
    if not isinstance(choice, Plan):
        raise ValueError(f"policy {policy.name!r} chose path {choice!r}; a path is 'pe', 'de' or a Plan")
    if (why := choice.problem(request)) is not None:
        raise ValueError(f"policy {policy.name!r} chose {choice} for request {request.id}: {why}")
    return choice, choice.label(request)


class Policy:
    name = "policy"
    layerwise = True  # False: load the whole prefix before computing (the Basic baseline)

    def path(self, request, pe, de) -> "str | Plan":
        """"pe", "de" or a `Plan` for `request` placed on engines `pe` and `de` (EngineView snapshots)."""
        raise NotImplementedError

    def engines(self, request, pes, des) -> tuple[int, int] | None:
        """(PE rank, DE rank) to override the scheduler's choice, or None to keep it."""
        return None

    def __repr__(self) -> str:
        return f"<policy {self.name}>"


class Basic(Policy):
    """The paper's Basic baseline: PE reads everything, no layerwise prefill."""
    name, layerwise = "basic", False

    def path(self, request, pe, de) -> str:
        return "pe"


class PeOnly(Policy):
    """Every hit block is read by the prefill host (layerwise prefill)."""
    name = "pe-only"

    def path(self, request, pe, de) -> str:
        return "pe"


class DeOnly(Policy):
    """Every hit block is read by the decode host and relayed to the prefill host."""
    name = "de-only"

    def path(self, request, pe, de) -> str:
        return "de"


class RoundRobin(Policy):
    """Alternate sides request by request, blind to load."""
    name = "round-robin"

    def __init__(self):
        self._n = 0

    def path(self, request, pe, de) -> str:
        self._n += 1
        return "pe" if self._n % 2 else "de"


class Random(Policy):
    """A seeded coin per (agent, turn): reproducible across runs."""
    name = "random"

    def __init__(self, seed: int = 0):
        self.seed = seed

    def path(self, request, pe, de) -> str:
        return "pe" if stream("random-policy", self.seed, request.agent, request.turn).random() < 0.5 else "de"


class DualPath(Policy):
    """DualPath: read on the side whose node has the shorter storage read queue (ties: PE)."""
    name = "dualpath"

    def path(self, request, pe, de) -> str:
        return "pe" if pe.read_q_tokens <= de.read_q_tokens else "de"


def _blocks(tokens: float, block: int) -> int:
    """`tokens` rounded to the nearest whole block."""
    return int(round(tokens / block)) * block


class DualPathSplit(Policy):
    """Split every request's hit blocks so that both nodes' storage read queues finish together: the DE
    reads x of the H hit tokens with (q_pe + H - x) / R_pe = (q_de + x) / R_de (q: the read queues, R:
    the nodes' read rates), rounded to a block boundary and kept within [0, H]."""
    name = "dualpath-split"

    def path(self, request, pe, de) -> Plan:
        hit = request.hit_tokens
        rp, rd = pe.read_tokens_per_s, de.read_tokens_per_s
        if not (rp and rd and math.isfinite(rp) and math.isfinite(rd)):  # unknown or unlimited rates: equal
            rp = rd = 1.0
        x = (rd * (pe.read_q_tokens + hit) - rp * de.read_q_tokens) / (rp + rd)
        return Plan(de_tokens=min(hit, max(0, _blocks(x, request.block_tokens))))


def recompute_tail(request, pe, reader) -> int:
    """Hit tokens (a whole-block tail) to recompute rather than load, when `reader` reads the rest.

    The tail r that ends the request soonest, its end taken as the later of loading the rest,
    (q + H - r) / R behind `reader`'s queue (nothing to wait for when r = H), and computing it, the PE's
    queued tokens at its prefill rate then one pass over (H - r cached, miss + r new) by its packing fit;
    but none when that tail costs the PE more time than it saves the storage NIC (fit(H - r, miss + r) -
    fit(H, miss) > r / R: it would speed this request at the others' expense). Loading falls and
    computing grows with r, so the candidates are where they cross (bisection) and r = H. 0 when a view
    lacks a rate or a fit."""
    hit, T, miss = request.hit_tokens, request.block_tokens, request.miss_tokens
    R, rate, fit = reader.read_tokens_per_s, pe.prefill_tokens_per_s, pe.prefill_s
    if not hit or not R or not rate or fit is None:
        return 0
    busy = pe.tokens / rate

    def end(r: int) -> float:
        load = (reader.read_q_tokens + hit - r) / R if r < hit else 0.0
        return max(load, busy + fit(hit - r, miss + r))

    def load_later(b: int) -> bool:
        return (reader.read_q_tokens + hit - b * T) / R > busy + fit(hit - b * T, miss + b * T)

    if not load_later(0):
        return 0
    lo, hi = 0, hit // T  # load_later(lo); the crossing is at or before hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if load_later(mid) else (lo, mid)
    r = min((0, lo * T, hi * T, hit), key=lambda r: (end(r), r))
    return r if fit(hit - r, miss + r) - fit(hit, miss) <= r / R else 0


class DualPathRecompute(DualPath):
    """DualPath's side, then the tail of the hit prefix recomputed where that ends the request sooner
    than loading it and costs the PE no more time than it saves the storage NIC (`recompute_tail`)."""
    name = "dualpath-recompute"

    def path(self, request, pe, de):
        side = super().path(request, pe, de)
        r = recompute_tail(request, pe, pe if side == "pe" else de)
        if not r:
            return side
        return Plan(de_tokens=request.hit_tokens - r if side == "de" else 0, recompute_tokens=r)


POLICIES = {cls.name: cls for cls in (Basic, PeOnly, DeOnly, RoundRobin, Random, DualPath, DualPathSplit,
                                      DualPathRecompute)}


class PolicyError(KeyError):
    """An unknown policy name or a `pkg.module:ClassName` reference that does not resolve."""

    def __str__(self) -> str:
        return self.args[0]


def policy_class(ref: str) -> type[Policy]:
    """The Policy class named by a built-in name or `pkg.module:ClassName` (importable on every host,
    so the same class runs embedded, under mpiexec and in the simulator). Raises PolicyError."""
    if ref in POLICIES:
        return POLICIES[ref]
    if ":" not in ref:
        raise PolicyError(f"unknown policy {ref!r}; policies: {', '.join(POLICIES)}, or pkg.module:ClassName")
    module, _, name = ref.partition(":")
    try:
        cls = getattr(importlib.import_module(module), name)
    except ImportError as e:
        raise PolicyError(f"policy {ref!r}: cannot import module {module!r} ({e})") from None
    except AttributeError:
        raise PolicyError(f"policy {ref!r}: module {module!r} has no {name!r}") from None
    if not (isinstance(cls, type) and issubclass(cls, Policy)):
        raise PolicyError(f"policy {ref!r}: {name!r} is not a subclass of dualjax.core.policies.Policy")
    return cls


def get_policy(policy) -> Policy:
    """A Policy object from a name or `pkg.module:ClassName` (or the object itself)."""
    return policy if isinstance(policy, Policy) else policy_class(policy)()


def layerwise_conflict(policy, layerwise: bool | None) -> str | None:
    """Why `layerwise` contradicts `policy` (a name or object), or None: layerwise prefill asked of
    a policy defined without it (Basic)."""
    cls = POLICIES.get(policy) if isinstance(policy, str) else type(policy)
    if layerwise and cls is not None and not cls.layerwise:
        return (f"layerwise=True contradicts policy {cls.name!r}, which is defined without layerwise prefill; "
                f"use pe-only for PE reads with layerwise prefill")
    return None


def layerwise_for(policy: Policy, layerwise: bool | None) -> bool:
    """The one layerwise switch: the setting where given, else the policy's own default."""
    if (why := layerwise_conflict(policy, layerwise)) is not None:
        raise PolicyError(why)
    return policy.layerwise if layerwise is None else layerwise
