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

This module holds the paper's policies and dualjax's plan policies; the load-or-recompute baselines of
other systems (llm-d, Mooncake, SGLang HiCache) and `dualpath-deadline` are in `field_policies.py`.
Every built-in is in `POLICIES` by name.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import math
import numbers
import os
import traceback

from dualjax.core.fastinit import direct_init
from dualjax.core.streams import stream


@direct_init  # a faster __init__, the same frozen dataclass (dualjax/core/fastinit.py)
@dataclasses.dataclass(frozen=True, slots=True)
class Plan:
    """How one request's hit prefix (its `hit_tokens`, whole blocks) reaches its prefill: the DE reads
    the first `de_tokens` and relays them to the PE layer by layer, the PE reads the hit tokens after
    those, and the last `recompute_tokens` are not loaded: the PE computes them with the miss tokens.
    Both are whole blocks. "pe" is `Plan()`, "de" is `Plan(de_tokens=request.hit_tokens)`.

    `deadline_s` (None: none) bounds the storage read, in seconds after the request is placed: the
    blocks not delivered by then are abandoned and the PE recomputes them as a tail with the miss
    tokens (layerwise reads by one side only: a split plan takes no deadline; Basic ignores it)."""

    de_tokens: int = 0
    recompute_tokens: int = 0
    deadline_s: float | None = None

    def show(self) -> str:
        """The plan as a policy author wrote it: without `deadline_s` when it has none."""
        tail = "" if self.deadline_s is None else f", deadline_s={self.deadline_s!r}"
        return f"Plan(de_tokens={self.de_tokens!r}, recompute_tokens={self.recompute_tokens!r}{tail})"

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
        if self.deadline_s is not None:
            d = self.deadline_s
            if not isinstance(d, numbers.Real) or isinstance(d, bool) or not d >= 0:
                return f"deadline_s={d!r} is not None or a number of seconds >= 0"
            if self.de_tokens and self.pe_tokens(request):
                return "a deadline bounds a read by one side: a split plan (both sides read) takes none"
        return None

    def label(self, request) -> str:
        """The request table's `path`: pe or de when one side reads every loaded block, else split."""
        if self.de_tokens == 0:
            return "pe"
        return "de" if self.pe_tokens(request) == 0 else "split"


_PE = Plan()  # every "pe" choice's plan (a Plan is immutable)


def as_plan(choice, request, policy) -> tuple[Plan, str]:
    """(plan, path label) of what `policy.path` returned for `request`; PolicyError (one line, naming the
    policy and the request) for anything but "pe", "de" or a Plan that fits the request."""
    if choice == "pe":
        return _PE, "pe"
    if choice == "de":
        return Plan(de_tokens=request.hit_tokens), "de"
    if not isinstance(choice, Plan):
        raise PolicyError(f"policy {policy.name!r} chose path {choice!r} for request {request.id}; "
                          f"a path is 'pe', 'de' or a Plan")
    if (why := choice.problem(request)) is not None:
        raise PolicyError(f"policy {policy.name!r} chose {choice.show()} for request {request.id}: {why}")
    return choice, choice.label(request)


def _where(e: BaseException) -> str:
    """`file:line` of the innermost frame of `e`'s traceback: where the author's code failed."""
    frames = traceback.extract_tb(e.__traceback__)
    return f" at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno}" if frames else ""


def _failed(policy, what: str, request, e: Exception) -> "PolicyError":
    return PolicyError(f"policy {getattr(policy, 'name', type(policy).__name__)!r} raised {type(e).__name__}"
                       f"{_where(e)} in {what} for request {request.id} (agent {request.agent}, turn "
                       f"{request.turn}): {e}".replace("\n", " "))


def decide(policy, request, pe, de) -> tuple[Plan, str]:
    """(plan, path label) of `policy.path(request, pe, de)`: the scheduler's one call of a policy's
    `path`. Whatever the policy raises, or answers that is not a path, becomes a PolicyError: one line
    naming the policy, the request and the fault (the raised exception is its `__cause__`, so a
    traceback still shows the author's line)."""
    try:
        choice = policy.path(request, pe, de)
    except Exception as e:  # noqa: BLE001 - an author's bug, reported as such
        raise _failed(policy, "path", request, e) from e
    return as_plan(choice, request, policy)


def choose_engines(policy, request, pes, des) -> tuple[int, int] | None:
    """`policy.engines(request, pes, des)` checked: None, or a (PE rank, DE rank) pair of the engines
    shown; anything else, or an exception, is a PolicyError naming the policy and the request."""
    try:
        got = policy.engines(request, pes, des)
    except Exception as e:  # noqa: BLE001
        raise _failed(policy, "engines", request, e) from e
    if got is None:
        return None
    ok_pe, ok_de = {v.rank for v in pes}, {v.rank for v in des}
    if not (isinstance(got, (tuple, list)) and len(got) == 2 and got[0] in ok_pe and got[1] in ok_de):
        raise PolicyError(f"policy {policy.name!r} chose engines {got!r} for request {request.id}; engines "
                          f"answers None or (PE rank, DE rank) with a PE of {sorted(ok_pe)} and a DE of "
                          f"{sorted(ok_de)}")
    return got[0], got[1]


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


def load_prefix(request, side: str, loaded: int) -> str | Plan:
    """`side` reads the first `loaded` hit tokens (rounded down to a block), the PE recomputes the rest;
    just `side` when that is every hit token."""
    T = request.block_tokens
    loaded = max(0, min(request.hit_tokens, int(loaded) // T * T))
    if loaded == request.hit_tokens:
        return side
    return Plan(de_tokens=loaded if side == "de" else 0, recompute_tokens=request.hit_tokens - loaded)


def recompute_tail(request, pe, reader) -> int:
    """Hit tokens (a whole-block tail) to recompute rather than load, when `reader` reads the rest.

    The tail r that ends the request soonest, its end taken as the later of the two waits it has:
    loading the rest behind the queue of `reader`'s storage NIC, (q + H - r) / R (q: the hit tokens
    queued on that node's NIC before it, R: that NIC's rate; nothing to wait for when r = H), and
    computing on the PE, its own queue first, tokens / prefill_tokens_per_s, then one pass over
    (H - r cached, miss + r new) by its packing fit; ties: the shorter tail. Loading falls and computing
    grows with r, so the candidates are where they cross (bisection) and r = H. That tail is kept when
    it costs the PE no more time than it saves the NIC, fit(H - r, miss + r) - fit(H, miss) <= r / R,
    or when the NIC is the bottleneck whatever the PE does: the reads queued ahead of this one alone
    outlast the PE's queue and a pass over the whole prompt, q / R > tokens / rate + fit(0, prompt).
    Otherwise the PE time it takes would delay the requests after it for less than it gains: 0. A
    recomputed tail is charged to the PE's tokens, so the next request sees the PE busier. 0 when a
    view lacks a rate or a fit."""
    hit, T, miss = request.hit_tokens, request.block_tokens, request.miss_tokens
    R, rate, fit = reader.read_tokens_per_s, pe.prefill_tokens_per_s, pe.prefill_s
    if not hit or not R or not rate or fit is None or not math.isfinite(R):
        return 0
    busy, q = pe.tokens / rate, reader.read_q_tokens

    def end(r: int) -> float:
        load = (q + hit - r) / R if r < hit else 0.0
        return max(load, busy + fit(hit - r, miss + r))

    def load_later(b: int) -> bool:
        return (q + hit - b * T) / R > busy + fit(hit - b * T, miss + b * T)

    if not load_later(0):
        return 0
    lo, hi = 0, hit // T  # load_later(lo); the crossing is at or before hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if load_later(mid) else (lo, mid)
    r = min((0, lo * T, hi * T, hit), key=lambda r: (end(r), r))
    if fit(hit - r, miss + r) - fit(hit, miss) <= r / R or q / R > busy + fit(0, request.prompt_tokens):
        return r
    return 0


class DualPathRecompute(DualPath):
    """DualPath's side, then the tail of the hit prefix recomputed where that ends the request sooner
    than loading it, by the queues it waits in: the chosen side's storage read queue and the PE's own
    queue, unless it costs the PE more than it saves the NIC while the NIC is not the bottleneck
    (`recompute_tail`)."""
    name = "dualpath-recompute"

    def path(self, request, pe, de):
        side = super().path(request, pe, de)
        return load_prefix(request, side, request.hit_tokens - recompute_tail(request, pe, pe if side == "pe" else de))


# every built-in by name (`--policy NAME`); dualjax/core/field_policies.py adds the load-or-recompute
# baselines of other systems to it (dualjax/core/__init__.py imports it)
POLICIES = {cls.name: cls for cls in (Basic, PeOnly, DeOnly, RoundRobin, Random, DualPath, DualPathSplit,
                                      DualPathRecompute)}


class PolicyError(ValueError, KeyError):
    """A policy that cannot be found or built, or that raised or answered wrongly for a request: bad
    input, reported in one line (`dualjax.cli.errors`)."""

    def __str__(self) -> str:
        return self.args[0]


def split_ref(ref: str) -> tuple[str, dict]:
    """(`name` or `pkg.module:ClassName`, constructor arguments) of a policy reference with arguments,
    `NAME:arg=value,arg=value` (values are Python literals, else strings)."""
    base, _, args = ref.rpartition(":")
    if "=" not in args or not base:
        return ref, {}
    kwargs = {}
    for item in args.split(","):
        key, eq, value = (s.strip() for s in item.partition("="))
        if not eq or not key.isidentifier():
            raise PolicyError(f"policy {ref!r}: {item.strip()!r} is not arg=value")
        try:
            kwargs[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            kwargs[key] = value
    return base, kwargs


def policy_class(ref: str) -> type[Policy]:
    """The Policy class named by a built-in name or `pkg.module:ClassName` (importable on every host,
    so the same class runs embedded, under mpiexec and in the simulator), arguments aside. Raises
    PolicyError."""
    ref = split_ref(ref)[0]
    if ref in POLICIES:
        return POLICIES[ref]
    if ":" not in ref:
        raise PolicyError(f"unknown policy {ref!r}; policies: {', '.join(POLICIES)}, or pkg.module:ClassName")
    module, _, name = ref.partition(":")
    try:
        cls = getattr(importlib.import_module(module), name)
    except ModuleNotFoundError as e:
        if e.name is None or not (module == e.name or module.startswith(e.name + ".")):  # its own import
            raise PolicyError(f"policy {ref!r}: importing module {module!r} failed{_where(e)}: {e}") from e
        raise PolicyError(f"policy {ref!r}: cannot import module {module!r}: no {e.name!r} on Python's path "
                          f"(PYTHONPATH={os.environ.get('PYTHONPATH', '')!r}; the dualjax command does not add "
                          f"the working directory): export PYTHONPATH=<the directory holding it>") from None
    except AttributeError:
        raise PolicyError(f"policy {ref!r}: module {module!r} has no {name!r}") from None
    except Exception as e:  # noqa: BLE001 - the module itself raised on import
        raise PolicyError(f"policy {ref!r}: importing module {module!r} raised {type(e).__name__}"
                          f"{_where(e)}: {e}") from e
    if not (isinstance(cls, type) and issubclass(cls, Policy)):
        raise PolicyError(f"policy {ref!r}: {name!r} is not a subclass of dualjax.core.policies.Policy")
    return cls


def get_policy(policy) -> Policy:
    """A Policy object from a name or `pkg.module:ClassName`, either with constructor arguments as
    `REF:arg=value,...` (or the object itself). A constructor that needs arguments the reference does
    not give, refuses them or raises is a PolicyError in one line."""
    if isinstance(policy, Policy):
        return policy
    cls, (_, kwargs) = policy_class(policy), split_ref(policy)
    try:
        inspect.signature(cls).bind(**kwargs)
    except TypeError as e:
        params = ", ".join(p.name if p.default is p.empty else f"{p.name}={p.default!r}"
                           for p in inspect.signature(cls).parameters.values())
        raise PolicyError(f"policy {policy!r}: {cls.__name__}({params}) cannot be built from {kwargs or 'no arguments'}"
                          f" ({e}); give every constructor argument a default, or pass them as "
                          f"NAME:arg=value,...") from None
    try:
        obj = cls(**kwargs)
    except Exception as e:  # noqa: BLE001
        raise PolicyError(f"policy {policy!r}: {cls.__name__}(**{kwargs}) raised {type(e).__name__}{_where(e)}: "
                          f"{e}") from e
    if kwargs:  # reports and tables tell the settings apart
        try:
            obj.name = f"{cls.name}:{','.join(f'{k}={v}' for k, v in kwargs.items())}"
        except AttributeError:
            pass
    return obj


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
