"""Read-path policies: which side reads a request's hit blocks (and, optionally, which engines).

A policy decides over plain snapshots (`RequestView`, `EngineView`), so the same object runs in
the real runtime, in the simulator and in a notebook. To write one, subclass `Policy` and
implement `path`; override `engines` to take over engine choice too:

    class Greedy(Policy):
        name = "greedy"
        def path(self, request, pe, de):
            return "de" if de.read_q_tokens < pe.read_q_tokens else "pe"
"""

from __future__ import annotations

import importlib

from dualjax.core.streams import stream


class Policy:
    name = "policy"
    layerwise = True  # False: load the whole prefix before computing (the Basic baseline)

    def path(self, request, pe, de) -> str:
        """"pe" or "de" for `request` placed on engines `pe` and `de` (EngineView snapshots)."""
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


POLICIES = {cls.name: cls for cls in (Basic, PeOnly, DeOnly, RoundRobin, Random, DualPath)}


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
