"""Workloads: agents, each a list of turns, and when each agent starts.

Agentic presets (docs/paper.md §9): turn i of an agent appends A_i new tokens (tool output) to
everything so far and generates exactly G_i tokens; the prompt of turn i+1 is
A_1, G_1, ..., A_i, G_i, A_{i+1}, where the G are the tokens the model really generated. The
first round is random tokens, unique per agent, so no prefix is shared across trajectories;
hits come from the agent's own earlier turns. Lengths are drawn around each preset's means
(lognormal, `spread` = sigma), deterministic in the seed and the agent id. Tool latency is zero
unless `think_s` is set (an exponential pause before each later turn). The paper presets read Table 2
two ways (docs/workloads.md): per request with turns truncated at MaxLen (`paper-64k`), or per
trajectory with turn count and turn lengths drawn jointly (`paper-64k-157`, `joint_lengths`); the
hit-rate presets (`hit-65`, ...) are `paper-64k` with longer appends.

Also: trajectory files (JSONL, `load_trajectories`), Mooncake traces (`mooncake_trace`) and recorded
sessions (`dualjax.core.sessions`); `trace_table` gives the two recorded kinds as the simulator
replays them, and `workload_report` what report.json says of a workload (odd records, trace hits).
Offline mode starts every agent at 0; online mode (`aps`) starts them as a Poisson process.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import statistics

import numpy as np

from dualjax.core import sessions
from dualjax.core.lengths import hit_tokens
from dualjax.core.streams import stream

PAPER_SLO = (4.0, 0.050)  # (TTFT s, TPOT s): the paper's online SLO, the default of every workload


class WorkloadError(ValueError):
    """A bad workload: unknown preset, bad trajectory or trace line, bad arrival rate."""


@dataclasses.dataclass(frozen=True)
class WorkloadSpec:
    name: str
    agents: int
    turns: float  # turns per agent (with turn_spread: their mean)
    first_append: int  # tokens of the first round (system prompt + task): exact, or the mean with first_spread
    append: int  # mean appended tokens per later turn
    gen: int  # mean generated tokens per turn
    spread: float = 0.3  # lognormal sigma of append/gen lengths (0: exact means)
    first_spread: float = 0.0  # lognormal sigma of the first round's length (0: exactly first_append)
    turn_spread: float = 0.0  # lognormal sigma of each agent's turn count around `turns` (0: every agent `turns`)
    max_len: int | None = None  # MaxLen: a trajectory ends before the turn whose prompt + generation exceeds it
    # The joint reading (`joint_lengths`): turn lengths follow the agent's turn count, and a trajectory
    # past MaxLen keeps its turns, each shortened, instead of being truncated.
    joint: bool = False
    turn_power: float = 0.0  # later appends and every gen scale as (agent's turns / `turns`) ** -turn_power
    agent_spread: float = 0.0  # lognormal sigma of an agent's turn-length factor around that power law
    think_s: float = 0.0  # mean tool/think time before each later turn (0: the paper's zero latency)
    slo_ttft_s: float = PAPER_SLO[0]  # online-mode SLO (docs/paper.md); CPU presets scale it
    slo_tpot_s: float = PAPER_SLO[1]

    def __post_init__(self):
        for f in ("agents", "turns", "first_append", "append", "gen"):
            if getattr(self, f) < 1:
                raise WorkloadError(f"workload {self.name!r}: {f} must be >= 1, got {getattr(self, f)}")
        if self.max_len is not None and self.max_len < 2:
            raise WorkloadError(f"workload {self.name!r}: max_len must be >= 2, got {self.max_len}")
        if self.joint and self.max_len is None:
            raise WorkloadError(f"workload {self.name!r}: the joint reading needs max_len")


# (name, table turns, turn_spread, first-round mean, later-append mean, gen mean, MaxLen): see PRESETS
# below. Fitted by grid search (turn_spread, first round) on 512 agents, seed 0; checked on 2,048.
PAPER_FIT = (("paper-32k", 60, 0.60, 5000, 497, 148, 32_768), ("paper-48k", 106, 0.65, 6000, 392, 172, 49_152),
             ("paper-64k", 157, 0.70, 6000, 373, 176, 65_536))
# The recorded agentic-coding sessions' shape (`sessions.turn_shape`, `dualjax workload shape DIR` on the 30
# public sessions of ../shared/traces/agentic-coding): a session's context growth per turn falls as its turn
# count to the power -0.482 (Pearson r of the logs -0.75), with a residual lognormal spread of 0.538.
TRACE_SHAPE = (0.482, 0.538)  # (turn_power, agent_spread)
# The joint reading of Table 2 (docs/workloads.md): (name, turns, turn_spread, first round, later-append
# base, gen base, MaxLen). Fitted by `dualjax workload fit NAME` (8,192 agents, seed 0).
PAPER_JOINT_FIT = (("paper-32k-60", 60.1, 0.748, 5976, 533, 172, 32_768),
                   ("paper-48k-106", 106.1, 0.761, 7887, 401, 195, 49_152),
                   ("paper-64k-157", 157.3, 0.809, 9763, 341, 189, 65_536))
# KV hit rates below the paper's (issue 60's regimes; published agentic hit rates span ~65 % to 99 %): paper-64k
# with longer later appends, so that fewer turns fit MaxLen and each hits less. (name, target hit rate,
# later-append mean): fitted by `dualjax workload fit NAME` (bisection on the append, 2,048 agents, seed 0).
HIT_FIT = (("hit-65", 0.65, 13_629), ("hit-85", 0.85, 5_149), ("hit-95", 0.95, 1_597))
# PAPER.md §6 (docs/paper.md §9) Table 2 per dataset: (turns, append, gen, total, mean context).
TABLE_2 = {"32K": (60, 608, 148, 28_639, 17_183), "48K": (106, 474, 172, 42_607, 25_120),
           "64K": (157, 429, 176, 55_958, 32_721)}
TABLE_2_KEYS = ("turns_mean", "append_mean", "gen_mean", "total_mean", "context_mean")
# The presets fitted to Table 2: preset -> (dataset, the reading of the table its fit holds: "request", the
# per-turn columns as means over all requests, or "agent", every column a mean over trajectories).
PAPER_PRESETS = {"paper-32k": ("32K", "request"), "paper-48k": ("48K", "request"), "paper-64k": ("64K", "request"),
                 "paper-32k-60": ("32K", "agent"), "paper-48k-106": ("48K", "agent"),
                 "paper-64k-157": ("64K", "agent")}

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
    # The paper's datasets (docs/paper.md §9 Table 2), fitted so that the kept turns reproduce the table's
    # append, gen, total and request-weighted mean context (within 5%, tests/dualjax/core/test_workload.py)
    # and no trajectory exceeds MaxLen. The table's turn count (157 at 64K) cannot hold with its totals
    # (157 x (429 + 176) = 95k > 64K): we read it as the trajectories' length *before* truncation at
    # MaxLen. Each agent draws an untruncated turn count around it (turn_spread), a long first round
    # (system prompt + task: first_append) and per-turn lengths (spread); the trajectory ends before
    # the turn that would exceed MaxLen. Kept turns average ~38 / ~66 / ~95. Fitted inputs: turn_spread,
    # first_append and `append` (the later turns' mean, so that the mean over *all* turns is the table's).
    **{name: WorkloadSpec(name, agents=64, turns=turns, first_append=first, append=later, gen=gen, spread=0.6,
                          first_spread=0.6, turn_spread=spread, max_len=max_len)
       for name, turns, spread, first, later, gen, max_len in PAPER_FIT},
    # The same datasets read per trajectory (docs/workloads.md "The paper's Table 2, two readings"): every column a
    # mean over trajectories, so the table's turn count holds (157 at 64K) and long trajectories have short
    # turns. Turn count, first round and turn lengths are drawn jointly (`joint_lengths`) with the recorded
    # sessions' shape (`TRACE_SHAPE`); a trajectory past MaxLen keeps its turns, shortened.
    **{name: WorkloadSpec(name, agents=64, turns=turns, first_append=first, append=later, gen=gen, spread=0.6,
                          first_spread=0.6, turn_spread=spread, max_len=max_len, joint=True,
                          turn_power=TRACE_SHAPE[0], agent_spread=TRACE_SHAPE[1])
       for name, turns, spread, first, later, gen, max_len in PAPER_JOINT_FIT},
}
# paper-64k at lower hit rates (`HIT_FIT`; `dualjax workload stats` gives `hit_rate`)
PRESETS.update({name: dataclasses.replace(PRESETS["paper-64k"], name=name, append=later)
                for name, _, later in HIT_FIT})


def get_workload(name: str, **overrides) -> WorkloadSpec:
    if name not in PRESETS:
        raise WorkloadError(f"unknown workload {name!r}; presets: {', '.join(PRESETS)}")
    overrides = {k: v for k, v in overrides.items() if v is not None}
    return dataclasses.replace(PRESETS[name], **overrides) if overrides else PRESETS[name]


@dataclasses.dataclass(frozen=True)
class Turn:
    append: np.ndarray  # [A] int32 token ids
    gen_len: int
    # A recorded session's turn (`dualjax.core.sessions`) gives its whole prompt, sent as is instead of
    # context + append (`append` is then its tokens past the trace's hit), and its recorded pause.
    prompt: np.ndarray | None = None  # [S] int32 token ids
    pause_s: float | None = None  # seconds after the previous turn completes (None: the agent's think_s)


def turn_lengths(spec: WorkloadSpec, agent: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(appended tokens, generated tokens) per turn of one agent: the lengths alone, which is all
    the simulator needs; `trajectory` draws its token ids around exactly these lengths. With
    `max_len`, the trajectory ends before the first turn whose prompt + generation exceeds it."""
    rng = stream("turn-lengths", seed, agent)

    def draw(mean, sigma, n):
        if sigma == 0:
            return np.full(n, mean)
        return np.maximum(1, np.round(mean * rng.lognormal(-sigma * sigma / 2, sigma, n)))
    if spec.joint:
        return joint_lengths(spec, rng, even_normals(seed, agent))
    turns = int(draw(spec.turns, spec.turn_spread, 1)[0])
    append, gen = draw(spec.append, spec.spread, turns), draw(spec.gen, spec.spread, turns)
    append[0] = draw(spec.first_append, spec.first_spread, 1)[0]
    if spec.max_len is not None:
        append[0] = min(append[0], spec.max_len - 1)
        gen[0] = min(gen[0], spec.max_len - append[0])
        kept = max(1, int(np.searchsorted(np.cumsum(append + gen), spec.max_len, side="right")))
        append, gen = append[:kept], gen[:kept]
    return append.astype(np.int64), gen.astype(np.int64)


# The R3 sequence (Roberts 2018: 1 / phi**k for phi the real root of x**4 = x + 1): successive points fill the
# unit cube evenly in every dimension and every pair of them.
_R3 = tuple(1 / 1.2207440846057596 ** k for k in (1, 2, 3))


def even_normals(seed: int, agent: int) -> tuple[float, float, float]:
    """Three standard normals for `agent`, spread evenly over agents: the inverse normal CDF of the agent's
    point of the R3 sequence, shifted by the seed's offset ((seed + 1) x (sqrt 2, sqrt 3, sqrt 5), mod 1).
    Any run of consecutive agents then holds the distribution's quantiles (not a random sample of them),
    so the means of a few thousand agents are the population's; still a function of (seed, agent) alone."""
    offset = np.sqrt([2.0, 3.0, 5.0]) * (seed + 1)
    u = (offset + (agent + 1) * np.array(_R3)) % 1.0
    return tuple(statistics.NormalDist().inv_cdf(min(max(x, 1e-12), 1 - 1e-12)) for x in u)


def joint_lengths(spec: WorkloadSpec, rng, z: tuple[float, float, float]) -> tuple[np.ndarray, np.ndarray]:
    """One agent of the per-trajectory reading (docs/workloads.md "The paper's Table 2, two readings"): a turn count
    N around `turns` (turn_spread), a first round around `first_append` (first_spread), and later
    appends and every generation around `append` and `gen` times the agent's factor
    (N / turns) ** -turn_power (the recorded sessions' shape, `TRACE_SHAPE`) with lognormal noise
    (agent_spread) and per-turn noise (spread). A trajectory whose total exceeds MaxLen keeps its N
    turns: all but the first round are shortened by one factor so that it ends at MaxLen."""
    def noise(sigma, n):  # lognormal of mean 1
        return rng.lognormal(-sigma * sigma / 2, sigma, n) if sigma else np.ones(n)

    def even(sigma, k):  # the same, from the agent's k-th even normal
        return math.exp(sigma * z[k] - sigma * sigma / 2)
    n = max(1, round(spec.turns * even(spec.turn_spread, 0)))
    factor = (n / spec.turns) ** -spec.turn_power * even(spec.agent_spread, 1)
    first = max(1, min(round(spec.first_append * even(spec.first_spread, 2)), spec.max_len // 2))
    n = min(n, (spec.max_len - first) // 2)  # room for one appended and one generated token per turn
    append = np.maximum(1, np.round(spec.append * factor * noise(spec.spread, n)))
    gen = np.maximum(1, np.round(spec.gen * factor * noise(spec.spread, n)))
    append[0] = first
    total = append.sum() + gen.sum()
    if total > spec.max_len:
        r = (spec.max_len - first) / (total - first)
        append[1:], gen = np.maximum(1, np.floor(append[1:] * r)), np.maximum(1, np.floor(gen * r))
        # turns floored at 1 + 1 tokens can still overshoot: then the trajectory ends at MaxLen
        kept = int(np.searchsorted(np.cumsum(append + gen), spec.max_len, side="right"))
        append, gen = append[:kept], gen[:kept]
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


def load_trajectories(path: str, vocab: int, seed: int = 0, max_len: int | None = None) -> list[Agent]:
    """Agents from a JSONL file, one agent per line:

        {"start": 0.0, "turns": [{"append": [ids...]} | {"append_len": 300}, "gen": 20}, ...]}

    `start` (seconds, default 0) and `think_s` are optional; `append_len` draws random ids
    (seeded by the line number). A bad line raises WorkloadError with its line number and reason;
    so does a turn whose prompt + generation exceeds `max_len` (the model's context: such a request
    could never be decoded), before any work.
    """
    agents = []
    for n, line in enumerate(_lines(path), start=1):
        if not line.strip():
            continue
        try:
            agents.append(_agent_from_json(json.loads(line), vocab, stream("trajectory-file", seed, n)))
        except (ValueError, KeyError, TypeError) as e:
            raise WorkloadError(f"{path}:{n}: {e}") from None
        if max_len is not None and (why := beyond_context(agents[-1], max_len)):
            raise WorkloadError(f"{path}:{n}: agent {len(agents) - 1} {why}")
    if not agents:
        raise WorkloadError(f"{path}: no agents")
    return agents


def beyond_context(agent: Agent, max_len: int) -> str | None:
    """Why `agent` cannot run on a model of `max_len` tokens of context (its first turn whose prompt +
    generation exceeds it), or None when every turn fits."""
    ctx = 0
    for i, t in enumerate(agent.turns):
        prompt = len(t.prompt) if t.prompt is not None else ctx + len(t.append)
        if prompt + t.gen_len > max_len:
            return (f"turn {i}: prompt {prompt} + generation {t.gen_len} = {prompt + t.gen_len} tokens exceed the "
                    f"model's context of {max_len} tokens (max_seq_len)")
        ctx = prompt + t.gen_len
    return None


def _lines(path: str):
    """The lines of a workload's text file, read as they are taken; one that cannot be read is bad input."""
    try:
        with open(path) as f:
            yield from f
    except (OSError, UnicodeDecodeError) as e:
        raise WorkloadError(f"{path}: {getattr(e, 'strerror', None) or e}") from None


def _agent_from_json(d: dict, vocab: int, rng) -> Agent:
    if not isinstance(d, dict) or not isinstance(d.get("turns"), list) or not d["turns"]:
        raise ValueError("expected an object with a non-empty list 'turns'")
    turns = []
    for i, t in enumerate(d["turns"]):
        if not isinstance(t, dict):
            raise ValueError(f"turn {i}: expected an object, got {t!r}")
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
    start, think = d.get("start", 0.0), d.get("think_s", 0.0)
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) and 0 <= x < math.inf for x in (start, think)):
        raise ValueError(f"'start' and 'think_s' must be finite numbers >= 0, got {start!r} and {think!r}")
    start, think = float(start), float(think)
    return Agent(start, turns, think)


MOONCAKE_BLOCK = 512


def _mooncake_row(r, odd: dict[str, int]) -> tuple | None:
    """(arrival s, input tokens, output tokens, hash ids) of one Mooncake record, or None when it is
    skipped (`sessions.ODD_RULES`: a missing or bad field, or hash ids that do not cover the input)."""
    r = r if isinstance(r, dict) else {}
    t, n_in, n_out, ids = r.get("timestamp"), r.get("input_length"), r.get("output_length"), r.get("hash_ids")
    if (not isinstance(t, (int, float)) or not isinstance(n_in, int) or n_in < 1 or not isinstance(n_out, int)
            or n_out < 0 or not isinstance(ids, list) or not all(isinstance(h, int) and h >= 0 for h in ids)
            or len(ids) != -(-n_in // MOONCAKE_BLOCK)):
        odd["skipped"] += 1
        return None
    if n_out == 0:
        odd["zero_output"] += 1
    return float(t) / 1e3, n_in, max(1, n_out), tuple(ids)


@functools.lru_cache(maxsize=4)
def read_mooncake(path: str, limit: int | None = None) -> tuple[tuple, dict[str, int]]:
    """(the first `limit` replayable records, the rules applied) of a Mooncake trace (JSONL: timestamp
    in ms, input_length, output_length, one hash id per 512 input tokens). A line that is not JSON
    makes the file unreadable (WorkloadError naming file and line); an odd record follows its rule."""
    rows, odd = [], sessions.no_odd_records()
    for n, line in enumerate(_lines(path), start=1):
        if limit is not None and len(rows) >= limit:
            break
        if not line.strip():
            continue
        try:
            r = json.loads(line)
        except ValueError as e:
            raise WorkloadError(f"{path}:{n}: not JSON: {e}") from None
        if (row := _mooncake_row(r, odd)) is not None:
            rows.append(row)
    if not rows:
        raise WorkloadError(f"{path}: no replayable Mooncake record (docs/workloads.md)")
    return tuple(rows), odd


def mooncake_requests(path: str, limit: int | None = None, time_scale: float = 1.0, length_scale: float = 1.0,
                      seed: int = 0, max_len: int | None = None) -> tuple[list[tuple], dict[str, int]]:
    """The replayed requests of a Mooncake trace in arrival order, each (start s, hash ids, tokens per
    hash block, output tokens), and the odd-record counts. Arrivals are spread uniformly inside each
    timestamp tick (the traces are quantised to ~3 s); `length_scale` shrinks every block and output;
    a request longer than `max_len` (prompt + output) is left out (`beyond_context`)."""
    rows, odd = read_mooncake(path, limit)
    odd = dict(odd)
    ticks = sorted({t for t, *_ in rows})
    tick = min(np.diff(ticks)) if len(ticks) > 1 else 0.0
    rng = stream("trace-jitter", seed)
    block = max(1, int(round(MOONCAKE_BLOCK * length_scale)))
    out = []
    for t, n_in, n_out, hashes in rows:
        start = (t + rng.uniform(0, tick)) * time_scale
        sizes = np.full(len(hashes), block, np.int64)
        sizes[-1] = max(1, int(round((n_in - MOONCAKE_BLOCK * (len(hashes) - 1)) * length_scale)))
        gen = max(1, int(round(n_out * length_scale)))
        if max_len is not None and sizes.sum() + gen > max_len:
            odd["beyond_context"] += 1
            continue
        out.append((start, hashes, sizes, gen))
    if not out:
        raise WorkloadError(f"{path}: no request fits the model's {max_len} tokens; shrink them with LENGTH_SCALE")
    return sorted(out, key=lambda x: x[0]), odd


def mooncake_trace(path: str, vocab: int, limit: int | None = None, time_scale: float = 1.0,
                   length_scale: float = 1.0, seed: int = 0, max_len: int | None = None) -> list[Agent]:
    """Requests of a Mooncake trace (`mooncake_requests`), each a one-turn agent. Each 512-token hash
    id maps to deterministic token ids (seeded by the id), so requests that share leading hash ids
    share their prefix tokens and hence KV blocks."""
    agents, block = [], max(1, int(round(MOONCAKE_BLOCK * length_scale)))
    for start, hashes, sizes, gen in mooncake_requests(path, limit, time_scale, length_scale, seed, max_len)[0]:
        ids = [stream("trace-blocks", seed, h).integers(0, vocab, block)[:n] for h, n in zip(hashes, sizes)]
        agents.append(Agent(start, [Turn(np.concatenate(ids).astype(np.int32), gen)]))
    return agents


def mooncake_table(spec: sessions.SessionSpec, agents: int | None = None, seed: int = 0,
                   max_len: int | None = None) -> sessions.SessionTable:
    """A Mooncake trace as the simulator takes it: each request a one-turn agent with its prompt, its
    hit tokens (the leading run of hash ids seen in earlier requests: an unbounded cache shared by
    all requests, in arrival order) and its output."""
    requests, odd = mooncake_requests(spec.path, spec.limit or agents, length_scale=spec.scale, seed=seed,
                                      max_len=max_len)
    seen: set[int] = set()
    prompt, hit = [], []
    for _, hashes, sizes, _ in requests:
        run = ([h not in seen for h in hashes] + [True]).index(True)
        prompt.append(np.array([sizes.sum()]))
        hit.append(np.array([sizes[:run].sum()]))
        seen.update(hashes)
    n = len(requests)
    return sessions.SessionTable(np.arange(n), np.zeros(n, np.int64), np.array([r[0] for r in requests]), prompt,
                                 hit, [np.array([r[3]]) for r in requests], [np.zeros(1)] * n, odd)


def length_stats(lengths: list[tuple[np.ndarray, np.ndarray]], block_tokens: int = 64) -> dict:
    """Table-2 statistics of agents given as (append, gen) lengths per turn, read two ways: means over
    requests (append, gen, context = the prompt: everything before plus the turn's append) and means over
    agents of each agent's own mean (`*_agent_mean`); per agent its turns and total (every appended and
    generated token), the longest total, and the KV hit rate as the simulator's store gives it (a later
    turn hits every whole `block_tokens` block of the context before it, less one token, `lengths.hit_tokens`;
    over all prompt tokens)."""
    append = np.concatenate([a for a, _ in lengths])
    gen = np.concatenate([g for _, g in lengths])
    prompts = [np.cumsum(a + g) - g for a, g in lengths]
    totals = np.array([int(a.sum() + g.sum()) for a, g in lengths])
    prompt = np.concatenate(prompts)
    hit = hit_tokens(prompt - append, prompt, block_tokens)
    return {"agents": len(lengths), "requests": int(append.size), "turns_mean": float(append.size / len(lengths)),
            "append_mean": float(append.mean()), "gen_mean": float(gen.mean()), "total_mean": float(totals.mean()),
            "context_mean": float(prompt.mean()), "max_total": int(totals.max()),
            "append_agent_mean": float(np.mean([a.mean() for a, _ in lengths])),
            "gen_agent_mean": float(np.mean([g.mean() for _, g in lengths])),
            "context_agent_mean": float(np.mean([p.mean() for p in prompts])),
            "hit_rate": float(hit.sum() / prompt.sum())}


def table_2(stats: dict, name: str) -> dict | None:
    """A paper preset's statistics against Table 2 under both readings (None for other workloads): the
    dataset, the reading the preset is fitted to, the table's figures, and per reading the statistics
    and each one's relative error."""
    if name not in PAPER_PRESETS:
        return None
    dataset, fitted = PAPER_PRESETS[name]
    paper = dict(zip(TABLE_2_KEYS, TABLE_2[dataset]))
    readings = {}
    for reading, suffix in (("request", ""), ("agent", "_agent")):
        got = {k: stats[k.replace("_mean", f"{suffix}_mean") if k not in ("turns_mean", "total_mean") else k]
               for k in TABLE_2_KEYS}
        readings[reading] = {"stats": got, "error": {k: got[k] / paper[k] - 1 for k in TABLE_2_KEYS}}
    return {"dataset": dataset, "fitted_reading": fitted, "paper": paper, **readings}


def fit_hit(name: str, agents: int = 2048, seed: int = 0) -> dict:
    """Fit a hit-rate preset (`HIT_FIT`): the largest later-append mean at which `length_stats`'s hit rate
    of `agents` agents of `seed` still exceeds the target (the hit rate falls as the appends grow)."""
    target = dict((n, t) for n, t, _ in HIT_FIT).get(name)
    if target is None:
        raise WorkloadError(f"{name!r} is not a hit-rate preset: {', '.join(n for n, *_ in HIT_FIT)}")
    base = get_workload(name, agents=agents)

    def stats(later):
        spec = dataclasses.replace(base, append=later)
        return length_stats([turn_lengths(spec, a, seed) for a in range(agents)])
    lo, hi = 1, base.max_len
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if stats(mid)["hit_rate"] > target else (lo, mid)
    return {"name": name, "agents": agents, "seed": seed, "append": lo, "hit_rate": stats(lo)["hit_rate"]}


def fit_workload(name: str, agents: int | None = None, seed: int = 0) -> dict:
    """`dualjax workload fit NAME`: re-derive a fitted preset's constants (`PAPER_JOINT_FIT`, `HIT_FIT`)."""
    if name in dict((n, t) for n, t, _ in HIT_FIT):
        return fit_hit(name, agents or 2048, seed)
    return fit_joint(name, agents or 8192, seed)


def fit_joint(name: str, agents: int = 8192, seed: int = 0) -> dict:
    """Fit a joint-reading paper preset (`PAPER_JOINT_FIT`) to Table 2 read per trajectory: turns,
    turn_spread, first_append, append and gen by least squares on the five columns' relative errors,
    `agents` agents of `seed` (the draws are the agents' own streams, so the objective is deterministic);
    turn_power and agent_spread stay the traces' (`TRACE_SHAPE`). Returns the fitted inputs and errors."""
    from scipy.optimize import least_squares
    base = get_workload(name, agents=agents)
    dataset, reading = PAPER_PRESETS.get(name, (None, None))
    if reading != "agent":
        raise WorkloadError(f"{name!r} is not a fitted preset: {', '.join(n for n, *_ in PAPER_JOINT_FIT + HIT_FIT)}")
    target = np.array(TABLE_2[dataset], float)

    def spec_of(x):
        turns, spread, first, later, gen = np.exp(x)
        return dataclasses.replace(base, turns=round(float(turns), 1), turn_spread=round(float(spread), 3),
                                   first_append=int(round(first)),
                                   append=int(round(later)), gen=int(round(gen)))

    def errors(x):
        s = length_stats([turn_lengths(spec_of(x), a, seed) for a in range(agents)])
        return np.array([s["turns_mean"], s["append_agent_mean"], s["gen_agent_mean"], s["total_mean"],
                         s["context_agent_mean"]]) / target - 1
    x0 = np.log([base.turns, base.turn_spread, base.first_append, base.append, base.gen])
    x = least_squares(errors, x0, diff_step=1e-2).x
    spec = spec_of(x)
    return {"name": name, "agents": agents, "seed": seed, "turns": spec.turns,
            "turn_spread": spec.turn_spread, "first_append": spec.first_append, "append": spec.append,
            "gen": spec.gen, "error": dict(zip(TABLE_2_KEYS, errors(x).tolist()))}


def slo_for(name: str) -> tuple[float, float]:
    """(TTFT, TPOT) SLO in seconds: the preset's, else the paper's 4 s and 50 ms."""
    spec = PRESETS.get(name)
    return (spec.slo_ttft_s, spec.slo_tpot_s) if spec else PAPER_SLO


def _spec(name: str) -> sessions.SessionSpec:
    try:
        return sessions.parse_spec(name)
    except sessions.SessionError as e:
        raise WorkloadError(str(e)) from None


def load_workload(name: str, vocab: int, seed: int = 0, agents: int | None = None, turns: int | None = None,
                  aps: float | None = None, think_time: str = "zero", max_len: int | None = None) -> list[Agent]:
    """A preset name, a trajectory file (*.jsonl), `mooncake:PATH[:LIMIT[:SCALE]]` or
    `sessions:PATH[:LIMIT[:SCALE]]`; a recorded request longer than `max_len` (the model's context)
    is not replayed (`sessions.ODD_RULES`), a trajectory file's is refused (`load_trajectories`)."""
    if name.startswith("sessions:"):
        return session_agents(name, vocab, seed, agents, aps, think_time, max_len)
    if name.startswith("mooncake:"):
        spec = _spec(name)
        return mooncake_trace(spec.path, vocab, limit=spec.limit or agents, seed=seed, length_scale=spec.scale,
                              max_len=max_len)
    if name.endswith(".jsonl"):
        return load_trajectories(name, vocab, seed, max_len)
    return agents_for(get_workload(name, agents=agents, turns=turns), vocab, seed, aps)


def trace_table(name: str, agents: int | None = None, seed: int = 0, think_time: str = "zero",
                aps: float | None = None, max_len: int | None = None) -> sessions.SessionTable | None:
    """A recorded trace (`sessions:` or `mooncake:`) as per-agent, per-turn prompt, hit, output and pause
    lengths, as the simulator replays it and the report counts it; None for other workloads."""
    if not name.startswith(("sessions:", "mooncake:")):
        return None
    spec = _spec(name)
    if name.startswith("mooncake:"):
        return mooncake_table(spec, agents, seed, max_len)
    try:
        return sessions.session_table(spec, agents, seed, think_time,
                                      None if aps is None else (lambda n: start_times(n, seed, aps)), max_len)
    except sessions.SessionError as e:
        raise WorkloadError(str(e)) from None


def workload_report(name: str, agents: int | None = None, seed: int = 0, max_len: int | None = None,
                    block_tokens: int = 64) -> dict:
    """report.json's `workload`: how often each odd-record rule applied (`sessions.ODD_RULES`) and, for
    recorded traces, the trace's own hit rates (`sessions.hit_summary`); null rates otherwise."""
    table = trace_table(name, agents, seed, max_len=max_len)
    if table is None:
        return {"odd_records": sessions.no_odd_records(), "trace_hit_rate": None, "trace_hit_rate_at_block": None,
                "trace_hit_gap": None}
    return {"odd_records": dict(table.odd), **sessions.hit_summary(table.prompt, table.hit, block_tokens)}


def max_context(agents: list[Agent]) -> int:
    """Longest context (prompt + generation) any agent reaches: sizes the decode cache."""
    longest = 0
    for a in agents:
        ctx = 0
        for t in a.turns:
            ctx = (len(t.prompt) if t.prompt is not None else ctx + len(t.append)) + t.gen_len
            longest = max(longest, ctx)
    return longest


def session_agents(name: str, vocab: int, seed: int = 0, agents: int | None = None, aps: float | None = None,
                   think_time: str = "zero", max_len: int | None = None) -> list[Agent]:
    """`sessions:PATH[:LIMIT[:LENGTH_SCALE]]`: recorded agentic sessions, one agent each
    (`dualjax.core.sessions`); `agents` takes the first sessions, or samples them when it is larger;
    a session ends before a request longer than `max_len` (the model's context)."""
    spec, table = _spec(name), trace_table(name, agents, seed, think_time, aps, max_len)
    loaded = sessions.load_sessions(spec.path, spec.limit)  # cached: read by `trace_table`
    out = []
    for a, (i, copy) in enumerate(zip(table.session.tolist(), table.copy.tolist())):
        prompts = sessions.session_prompts(loaded[i], copy, vocab, spec.scale, seed)[:len(table.prompt[a])]
        turns = [Turn(p[h:], int(g), p, float(z)) for p, h, g, z in
                 zip(prompts, table.hit[a].tolist(), table.gen[a].tolist(), table.pause[a].tolist())]
        out.append(Agent(float(table.start[a]), turns))
    return out
