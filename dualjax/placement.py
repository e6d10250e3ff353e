"""Where a request goes: the seam the scheduler (and its path policies) plug into.

Until the adaptive scheduler lands, `FlagPlacement` assigns engines round-robin and takes the
read path from a flag: always the PE side, always the DE side, or a seeded coin per (agent, turn)
so the choice is reproducible across runs.
"""

from __future__ import annotations

import numpy as np

from dualjax.config import ClusterSpec
from dualjax.messages import Request


class FlagPlacement:
    def __init__(self, cluster: ClusterSpec, path: str, seed: int = 0):
        self.cluster, self.path, self.seed = cluster, path, seed
        self._n = 0

    def place(self, request: Request, hit_blocks: int) -> tuple[int, int, str]:
        """(PE rank, DE rank, read path "pe" | "de") for `request`."""
        pe = self.cluster.prefill_ranks[self._n % self.cluster.prefill]
        de = self.cluster.decode_ranks[self._n % self.cluster.decode]
        self._n += 1
        path = self.path
        if path == "random":
            path = "pe" if np.random.default_rng([self.seed, request.agent, request.turn]).random() < 0.5 else "de"
        return pe, de, path
