"""Shape buckets: the padded lengths a prefill pass compiles for (pure Python, no JAX).

The runtime pads new-token and prefix lengths to these buckets so a long run compiles a handful of
programs; the simulator and the batching predictor use the same rule to know which shape a pass
computes.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Buckets:
    """Padding buckets: new-token and prefix lengths round up to powers of two from these minima."""

    min_new: int = 256
    min_prefix: int = 512

    def new(self, n: int) -> int:
        return max(self.min_new, 1 << max(n - 1, 0).bit_length())

    def prefix(self, n: int) -> int:
        return 0 if n == 0 else max(self.min_prefix, 1 << (n - 1).bit_length())

    def pass_shape(self, rows: int, cached: int, new: int) -> tuple[int, int, int]:
        """(rows, padded new, padded prefix) a Layerwise pass over rows of at most these lengths computes."""
        return rows, self.new(new), self.prefix(cached)


DEFAULT_BUCKETS = Buckets()
