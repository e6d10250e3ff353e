"""Named random streams: every seeded draw in dualjax comes from `stream(name, seed, *keys)`.

Each consumer has its own stream id, so no two consumers ever share a sequence by accident (as
`[seed, 7]` for arrivals once equalled agent 7's length stream); all ranks and all runs that use the
same seed draw the same numbers.
"""

from __future__ import annotations

import numpy as np

STREAMS = ("turn-lengths", "turn-tokens", "arrivals", "think-time", "simulator", "trajectory-file",
           "trace-blocks", "random-policy", "trace-jitter", "session-blocks", "session-sample")


def stream(name: str, seed: int, *keys: int) -> np.random.Generator:
    """The generator of stream `name` for `seed` and optional integer keys (agent, turn, ...)."""
    if name not in STREAMS:
        raise KeyError(f"unknown random stream {name!r}; streams: {', '.join(STREAMS)}")
    return np.random.default_rng([seed, STREAMS.index(name) + 1, *keys])
