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

import numpy as np


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
        return "pe" if np.random.default_rng([self.seed, request.agent, request.turn]).random() < 0.5 else "de"


class DualPath(Policy):
    """DualPath: read on the side whose node has the shorter storage read queue (ties: PE)."""
    name = "dualpath"

    def path(self, request, pe, de) -> str:
        return "pe" if pe.read_q_tokens <= de.read_q_tokens else "de"


POLICIES = {cls.name: cls for cls in (Basic, PeOnly, DeOnly, RoundRobin, Random, DualPath)}


def get_policy(policy) -> Policy:
    """A Policy object from a name (or the object itself). Raises KeyError listing the names."""
    if isinstance(policy, Policy):
        return policy
    if policy not in POLICIES:
        raise KeyError(f"unknown policy {policy!r}; policies: {', '.join(POLICIES)}")
    return POLICIES[policy]()
