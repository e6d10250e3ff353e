"""Workloads: agents, each a list of turns, and when each agent starts.

Agentic presets (PAPER.md §6): turn i of an agent appends A_i new tokens (tool output) to
everything so far and generates exactly G_i tokens; the prompt of turn i+1 is
A_1, G_1, ..., A_i, G_i, A_{i+1}, where the G are the tokens the model really generated. The
first round is random tokens, unique per agent, so no prefix is shared across trajectories;
hits come from the agent's own earlier turns. Lengths are drawn around each preset's means
(lognormal, `spread` = sigma), deterministic in the seed and the agent id. Tool latency is zero
unless `think_s` is set (an exponential pause before each later turn).

Also: trajectory files (JSONL, `load_trajectories`) and Mooncake traces (`mooncake_trace`).
Offline mode starts every agent at 0; online mode (`aps`) starts them as a Poisson process.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np

from dualjax.core.streams import stream


class WorkloadError(ValueError):
    """A bad workload: unknown preset, bad trajectory or trace line, bad arrival rate."""


@dataclasses.dataclass(frozen=True)
class WorkloadSpec:
    name: str
    agents: int
    turns: int
    first_append: int  # tokens of the first round (system prompt + task)
    append: int  # mean appended tokens per later turn
    gen: int  # mean generated tokens per turn
    spread: float = 0.3  # lognormal sigma of append/gen lengths (0: exact means)
    think_s: float = 0.0  # mean tool/think time before each later turn (0: the paper's zero latency)
    slo_ttft_s: float = 4.0  # online-mode SLO (PAPER.md §6); CPU presets scale it
    slo_tpot_s: float = 0.050

    def __post_init__(self):
        for f in ("agents", "turns", "first_append", "append", "gen"):
            if getattr(self, f) < 1:
                raise WorkloadError(f"workload {self.name!r}: {f} must be >= 1, got {getattr(self, f)}")


PRESETS: dict[str, WorkloadSpec] = {
    # Tests and `dualjax verify`: prompts cross several 64-token blocks within a few turns.
    "agentic-tiny": WorkloadSpec("agentic-tiny", agents=8, turns=6, first_append=150, append=40, gen=10,
                                 slo_ttft_s=4.0, slo_tpot_s=0.25),
    # Demo and CPU benchmarks on the `small` model: long context, short appends, short answers.
    "agentic-small": WorkloadSpec("agentic-small", agents=8, turns=8, first_append=1024, append=96, gen=16,
                                  slo_ttft_s=8.0, slo_tpot_s=0.5),  # CPU: SLO scaled ~10x for TPOT
    # `dualjax bench e2e`: agentic-small with short appends and answers, so storage dominates on CPU;
    # 10 agents x 5 turns (not 8 x 6: same hit bytes) leave storage NICs idle less in the last turns.
    "agentic-e2e": WorkloadSpec("agentic-e2e", agents=10, turns=5, first_append=1024, append=64, gen=8,
                                slo_ttft_s=8.0, slo_tpot_s=0.5),
    # The paper's datasets (PAPER.md §6 table): mean turns, append and generation per turn.
    "paper-32k": WorkloadSpec("paper-32k", agents=64, turns=60, first_append=2048, append=608, gen=148),
    "paper-48k": WorkloadSpec("paper-48k", agents=64, turns=106, first_append=2048, append=474, gen=172),
    "paper-64k": WorkloadSpec("paper-64k", agents=64, turns=157, first_append=2048, append=429, gen=176),
}


def get_workload(name: str, **overrides) -> WorkloadSpec:
    if name not in PRESETS:
        raise WorkloadError(f"unknown workload {name!r}; presets: {', '.join(PRESETS)}")
    overrides = {k: v for k, v in overrides.items() if v is not None}
    return dataclasses.replace(PRESETS[name], **overrides) if overrides else PRESETS[name]


@dataclasses.dataclass(frozen=True)
class Turn:
    append: np.ndarray  # [A] int32 token ids
    gen_len: int


def turn_lengths(spec: WorkloadSpec, agent: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(appended tokens, generated tokens) per turn of one agent: the lengths alone, which is all
    the simulator needs; `trajectory` draws its token ids around exactly these lengths."""
    rng = stream("turn-lengths", seed, agent)
    if spec.spread == 0:
        append, gen = np.full(spec.turns, spec.append), np.full(spec.turns, spec.gen)
    else:
        s = spec.spread
        draw = lambda mean: np.maximum(1, np.round(mean * rng.lognormal(-s * s / 2, s, spec.turns)))  # noqa: E731
        append, gen = draw(spec.append), draw(spec.gen)
    append[0] = spec.first_append
    return append.astype(np.int64), gen.astype(np.int64)


def trajectory(spec: WorkloadSpec, agent: int, vocab: int, seed: int = 0) -> list[Turn]:
    """The turns of one agent: appended token ids and generation lengths."""
    append, gen = turn_lengths(spec, agent, seed)
    rng = stream("turn-tokens", seed, agent)
    return [Turn(rng.integers(0, vocab, int(n), dtype=np.int32), int(g)) for n, g in zip(append, gen)]


@dataclasses.dataclass(frozen=True)
class Agent:
    start: float  # seconds after the run starts
    turns: list[Turn]
    think_s: float = 0.0


def start_times(agents: int, seed: int = 0, aps: float | None = None) -> np.ndarray:
    """When each agent starts: all at 0 (offline) or Poisson arrivals at `aps` agents/s (online)."""
    if aps is None:
        return np.zeros(agents)
    if aps <= 0:
        raise WorkloadError(f"--aps must be positive, got {aps}")
    return np.cumsum(stream("arrivals", seed).exponential(1.0 / aps, agents))


def agents_for(spec: WorkloadSpec, vocab: int, seed: int = 0, aps: float | None = None) -> list[Agent]:
    """The agents of a preset: all at t=0 (offline) or Poisson arrivals at `aps` agents/s (online)."""
    return [Agent(float(t), trajectory(spec, a, vocab, seed), spec.think_s)
            for a, t in enumerate(start_times(spec.agents, seed, aps))]


def load_trajectories(path: str, vocab: int, seed: int = 0) -> list[Agent]:
    """Agents from a JSONL file, one agent per line:

        {"start": 0.0, "turns": [{"append": [ids...]} | {"append_len": 300}, "gen": 20}, ...]}

    `start` (seconds, default 0) and `think_s` are optional; `append_len` draws random ids
    (seeded by the line number). A bad line raises WorkloadError with its line number and reason.
    """
    agents = []
    with open(path) as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                agents.append(_agent_from_json(json.loads(line), vocab, stream("trajectory-file", seed, n)))
            except (ValueError, KeyError, TypeError) as e:
                raise WorkloadError(f"{path}:{n}: {e}") from None
    if not agents:
        raise WorkloadError(f"{path}: no agents")
    return agents


def _agent_from_json(d: dict, vocab: int, rng) -> Agent:
    if not isinstance(d, dict) or not isinstance(d.get("turns"), list) or not d["turns"]:
        raise ValueError("expected an object with a non-empty list 'turns'")
    turns = []
    for i, t in enumerate(d["turns"]):
        if "append" in t:
            ids = np.asarray(t["append"])
            if ids.ndim != 1 or ids.size == 0 or not np.issubdtype(ids.dtype, np.integer):
                raise ValueError(f"turn {i}: 'append' must be a non-empty list of token ids")
            if ids.min() < 0 or ids.max() >= vocab:
                raise ValueError(f"turn {i}: token id {int(ids.max() if ids.max() >= vocab else ids.min())} "
                                 f"outside the vocabulary [0, {vocab})")
        elif isinstance(t.get("append_len"), int) and t["append_len"] > 0:
            ids = rng.integers(0, vocab, t["append_len"])
        else:
            raise ValueError(f"turn {i}: needs 'append' (ids) or a positive integer 'append_len'")
        gen = t.get("gen")
        if not isinstance(gen, int) or gen < 1:
            raise ValueError(f"turn {i}: 'gen' must be an integer >= 1, got {gen!r}")
        turns.append(Turn(ids.astype(np.int32), gen))
    start, think = float(d.get("start", 0.0)), float(d.get("think_s", 0.0))
    if start < 0 or think < 0:
        raise ValueError("'start' and 'think_s' must be >= 0")
    return Agent(start, turns, think)


MOONCAKE_BLOCK = 512


def mooncake_trace(path: str, vocab: int, limit: int | None = None, time_scale: float = 1.0,
                   length_scale: float = 1.0, seed: int = 0) -> list[Agent]:
    """Requests of a Mooncake trace (`../shared/traces/`), each a one-turn agent.

    Each 512-token `hash_id` maps to deterministic token ids (seeded by the id), so requests that
    share leading hash ids share their prefix tokens and hence KV blocks. Arrivals are spread
    uniformly inside each timestamp tick (the traces are quantised to ~3 s). `length_scale`
    shrinks every block (and output) for small machines; `time_scale` compresses time.
    """
    rows = []
    with open(path) as f:
        for n, line in enumerate(f, start=1):
            if limit is not None and len(rows) >= limit:
                break
            try:
                r = json.loads(line)
                rows.append((float(r["timestamp"]) / 1e3, int(r["input_length"]), int(r["output_length"]),
                             [int(h) for h in r["hash_ids"]]))
            except (ValueError, KeyError, TypeError) as e:
                raise WorkloadError(f"{path}:{n}: not a Mooncake trace record: {e}") from None
    ticks = sorted({t for t, *_ in rows})
    tick = min(np.diff(ticks)) if len(ticks) > 1 else 0.0
    rng = stream("trace-jitter", seed)
    block = max(1, int(round(MOONCAKE_BLOCK * length_scale)))
    agents = []
    for t, n_in, n_out, hashes in rows:
        last = n_in - MOONCAKE_BLOCK * (len(hashes) - 1)
        ids = [stream("trace-blocks", seed, h).integers(0, vocab, block) for h in hashes]
        ids[-1] = ids[-1][:max(1, int(round(last * length_scale)))]
        start = (t + rng.uniform(0, tick)) * time_scale
        agents.append(Agent(start, [Turn(np.concatenate(ids).astype(np.int32),
                                         max(1, int(round(n_out * length_scale))))]))
    return sorted(agents, key=lambda a: a.start)


def slo_for(name: str) -> tuple[float, float]:
    """(TTFT, TPOT) SLO in seconds: the preset's, else the paper's 4 s and 50 ms."""
    spec = PRESETS.get(name)
    return (spec.slo_ttft_s, spec.slo_tpot_s) if spec else (4.0, 0.050)


def load_workload(name: str, vocab: int, seed: int = 0, agents: int | None = None, turns: int | None = None,
                  aps: float | None = None) -> list[Agent]:
    """A preset name, a trajectory file (*.jsonl) or `mooncake:PATH[:LIMIT]`."""
    if name.startswith("mooncake:"):
        parts = name.split(":")
        return mooncake_trace(parts[1], vocab, limit=int(parts[2]) if len(parts) > 2 else agents, seed=seed,
                              length_scale=float(parts[3]) if len(parts) > 3 else 1.0)
    if name.endswith(".jsonl"):
        return load_trajectories(name, vocab, seed)
    return agents_for(get_workload(name, agents=agents, turns=turns), vocab, seed, aps)


def max_context(agents: list[Agent]) -> int:
    """Longest context (prompt + generation) any agent reaches: sizes the decode cache."""
    return max(sum(len(t.append) + t.gen_len for t in a.turns) for a in agents)
