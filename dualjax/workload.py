"""Agentic workloads (PAPER.md §6): agents that re-send their whole context every turn.

Turn i of an agent appends A_i new tokens (tool output) to everything so far and generates
exactly G_i tokens; the prompt of turn i+1 is A_1, G_1, ..., A_i, G_i, A_{i+1}, where the G are
the tokens the model really generated. The first round is random tokens, unique per agent, so
no prefix is shared across trajectories; hits come from the agent's own earlier turns.
Lengths are drawn around each preset's means (lognormal, `spread` = sigma), deterministic in the
seed and the agent id.
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class WorkloadSpec:
    name: str
    agents: int
    turns: int
    first_append: int  # tokens of the first round (system prompt + task)
    append: int  # mean appended tokens per later turn
    gen: int  # mean generated tokens per turn
    spread: float = 0.3  # lognormal sigma of append/gen lengths (0: exact means)

    def __post_init__(self):
        for f in ("agents", "turns", "first_append", "append", "gen"):
            if getattr(self, f) < 1:
                raise ValueError(f"workload {self.name!r}: {f} must be >= 1, got {getattr(self, f)}")


PRESETS: dict[str, WorkloadSpec] = {
    # Tests and `dualjax verify`: prompts cross several 64-token blocks within a few turns.
    "agentic-tiny": WorkloadSpec("agentic-tiny", agents=8, turns=6, first_append=150, append=40, gen=10),
    # Demo and CPU benchmarks on the `small` model: long context, short appends, short answers.
    "agentic-small": WorkloadSpec("agentic-small", agents=8, turns=8, first_append=1024, append=96, gen=16),
    # The paper's datasets (PAPER.md §6 table): mean turns, append and generation per turn.
    "paper-32k": WorkloadSpec("paper-32k", agents=64, turns=60, first_append=2048, append=608, gen=148),
    "paper-48k": WorkloadSpec("paper-48k", agents=64, turns=106, first_append=2048, append=474, gen=172),
    "paper-64k": WorkloadSpec("paper-64k", agents=64, turns=157, first_append=2048, append=429, gen=176),
}


def get_workload(name: str, **overrides) -> WorkloadSpec:
    if name not in PRESETS:
        raise KeyError(f"unknown workload {name!r}; presets: {', '.join(PRESETS)}")
    overrides = {k: v for k, v in overrides.items() if v is not None}
    return dataclasses.replace(PRESETS[name], **overrides) if overrides else PRESETS[name]


@dataclasses.dataclass(frozen=True)
class Turn:
    append: np.ndarray  # [A] int32 token ids
    gen_len: int


def _length(rng: np.random.Generator, mean: int, spread: float) -> int:
    if spread == 0:
        return mean
    return max(1, int(round(mean * rng.lognormal(-spread * spread / 2, spread))))


def trajectory(spec: WorkloadSpec, agent: int, vocab: int, seed: int = 0) -> list[Turn]:
    """The turns of one agent: appended token ids and generation lengths."""
    rng = np.random.default_rng([seed, agent])
    turns = []
    for i in range(spec.turns):
        n = spec.first_append if i == 0 else _length(rng, spec.append, spec.spread)
        turns.append(Turn(rng.integers(0, vocab, n, dtype=np.int32), _length(rng, spec.gen, spec.spread)))
    return turns


def max_context(spec: WorkloadSpec, vocab: int, seed: int = 0) -> int:
    """Longest context (prompt + generation) any agent reaches: sizes the decode cache."""
    return max(sum(len(t.append) + t.gen_len for t in trajectory(spec, a, vocab, seed)) for a in range(spec.agents))
