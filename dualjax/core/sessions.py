"""Recorded agentic coding sessions as a workload: `sessions:PATH[:LIMIT[:LENGTH_SCALE]]`.

One session per file (JSON, gzipped or not; the format is docs/workloads.md's): per request its input
and output token counts, one hash id per full 64-token block of the input (`len(hash_ids) == in // 64`;
the last `in % 64` tokens are not hashed) and its time in the session. Each session is an agent and
each request a turn:

* a turn's prompt is its blocks' tokens: the tokens of a block are deterministic in (session,
  copy, hash id), so equal ids share KV through the store's chained block hashes and different
  sessions (or copies of one) share nothing; the unhashed tail is fresh tokens of that request
  (a trace that hashes a partial last block, Mooncake-style, gets that block's leading tokens);
* it generates `out` tokens; the next prompt is the trace's, not the model's output appended,
  so the KV of generated tokens is written back but never hit (as in the trace, whose next
  request re-renders the output into new blocks);
* pauses: `recorded` waits each request's recorded tool/user time (`think_time`, else the gap
  between requests less the previous API time) after the previous turn completes, `zero` is the
  paper's rule, a number scales the recorded pauses;
* `LENGTH_SCALE` shrinks every block, tail and output by the same factor (blocks keep their ids,
  so the hit structure is unchanged; with `--block-tokens` = round(64 x scale) the runtime's
  blocks are the trace's);
* more agents than sessions sample sessions with replacement (docs/paper.md §9 does this for its own
  trajectories); a copy has its own tokens and, offline, starts up to one recorded turn late.

A request that cannot be replayed as recorded follows a rule (`ODD_RULES`, counted in the report);
only a file that cannot be read at all is refused. `trace_hit_rate` is the token hit rate (unbounded
per-session cache, arrival order, longest leading run of seen ids) of the requests replayed, at their
replayed lengths.
NumPy only; the simulator takes `session_table` (lengths, hits and pauses, no tokens).
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import gzip
import json
import os
import zlib

import numpy as np

from dualjax.core.lengths import at_block
from dualjax.core.streams import stream

SESSION_BLOCK = 64  # tokens per hash id in the agentic-coding traces
PAUSES = ("recorded", "zero")


class SessionError(ValueError):
    """A bad session file or spec; `dualjax.core.workload` re-raises it as a WorkloadError."""


@dataclasses.dataclass(frozen=True)
class Session:
    """One recorded session: per request (R of them) its lengths, hash ids and pause before it."""

    name: str
    block: int
    inputs: np.ndarray  # [R] prompt tokens
    outputs: np.ndarray  # [R] generated tokens
    ids: tuple[np.ndarray, ...]  # R arrays of block hash ids (local to the session)
    pauses: np.ndarray  # [R] seconds between the previous request's end and this one's start (0 first)
    api_s: np.ndarray  # [R] recorded response time (0 where not recorded)
    odd: dict[str, int] = dataclasses.field(default_factory=dict)  # times each of `ODD_RULES` applied

    @property
    def key(self) -> int:
        return zlib.crc32(self.name.encode())


@dataclasses.dataclass(frozen=True)
class SessionSpec:
    path: str
    limit: int | None = None
    scale: float = 1.0


def parse_spec(name: str) -> SessionSpec:
    """`sessions:PATH[:LIMIT[:LENGTH_SCALE]]` (a Mooncake trace's `mooncake:...` takes the same form)
    -> SessionSpec; raises SessionError."""
    parts = name.split(":")
    kind = parts[0] if parts[0] in ("sessions", "mooncake") else "sessions"
    if parts[0] != kind or len(parts) < 2 or not parts[1] or len(parts) > 4:
        raise SessionError(f"expected {kind}:PATH[:LIMIT[:LENGTH_SCALE]], got {name!r}")
    try:
        limit = int(parts[2]) if len(parts) > 2 and parts[2] else None
        scale = float(parts[3]) if len(parts) > 3 else 1.0
    except ValueError as e:
        raise SessionError(f"{name!r}: LIMIT must be an integer and LENGTH_SCALE a number ({e})") from None
    if (limit is not None and limit < 1) or not 0 < scale <= 1:
        raise SessionError(f"{name!r}: LIMIT must be >= 1 and 0 < LENGTH_SCALE <= 1")
    return SessionSpec(parts[1], limit, scale)


def pause_factor(think_time: str) -> float:
    """`recorded` -> 1, `zero` -> 0, a non-negative number -> itself (a factor on recorded pauses)."""
    if think_time in PAUSES:
        return 1.0 if think_time == "recorded" else 0.0
    try:
        factor = float(think_time)
    except ValueError:
        factor = -1.0
    if not factor >= 0:
        raise SessionError(f"think time must be recorded, zero or a factor >= 0, got {think_time!r}")
    return factor


def session_files(path: str) -> list[str]:
    if os.path.isdir(path):
        files = sorted(glob.glob(os.path.join(path, "*.json.gz")) + glob.glob(os.path.join(path, "*.json")))
        if not files:
            raise SessionError(f"{path}: no *.json or *.json.gz session files")
        return files
    if not os.path.exists(path):
        raise SessionError(f"{path}: no such file or directory")
    return [path]


# Odd records (docs/workloads.md): what a recorded request that cannot be replayed as recorded becomes.
ODD_RULES = {
    "zero_output": "a request that generated 0 tokens generates 1",
    "skipped": "a request without a replayable prompt (missing or bad 'in', 'out' or 'hash_ids', or hash ids "
               "that do not match 'in') is left out; its session goes on with the next request",
    "bad_pause": "a missing, negative or non-numeric 'think_time' is replaced by the recorded gap",
    "bad_time": "a missing, non-numeric or decreasing 't' is taken as the previous request's (no gap)",
    "beyond_context": "a session ends before its first request whose prompt + generation exceeds the model's "
                      "context (a Mooncake request longer than it is left out)",
    "empty_sessions": "a session none of whose requests can be replayed is left out",
}


def no_odd_records() -> dict[str, int]:
    """Every rule of `ODD_RULES` applied 0 times: report.json's `workload.odd_records` of a clean workload."""
    return dict.fromkeys(ODD_RULES, 0)


@functools.lru_cache(maxsize=8)
def load_sessions(path: str, limit: int | None = None) -> tuple[Session, ...]:
    """The first `limit` sessions of a directory (sorted by file name) or one file that hold a replayable
    request (`ODD_RULES`); raises SessionError when none does."""
    loaded = tuple(read_session(f) for f in session_files(path)[:limit])
    if not any(len(s.inputs) for s in loaded):
        raise SessionError(f"{path}: no replayable request in {len(loaded)} session file(s) (docs/workloads.md)")
    return loaded


def read_session(path: str) -> Session:
    """One session file, gzipped or not. A file that cannot be read as a session (not gzip, not JSON, no
    list of requests) raises SessionError naming the file and the line; an odd request follows its rule
    in `ODD_RULES` and is counted in `Session.odd`."""
    try:
        with (gzip.open if path.endswith(".gz") else open)(path, "rt") as f:
            d = json.load(f)
    except json.JSONDecodeError as e:
        raise SessionError(f"{path}:{e.lineno}:{e.colno}: not JSON: {e.msg}") from None
    except (OSError, EOFError, UnicodeDecodeError) as e:
        raise SessionError(f"{path}: cannot read: {e}") from None
    if not isinstance(d, dict) or not isinstance(d.get("requests"), list) or not d["requests"]:
        raise SessionError(f"{path}: expected an object with a non-empty list 'requests'")
    block = d.get("block_size", SESSION_BLOCK)
    if not isinstance(block, int) or block < 1:
        raise SessionError(f"{path}: block_size must be a positive integer, got {block!r}")
    odd, rows = no_odd_records(), []
    for r in d["requests"]:
        if (row := _request(r, block, odd)) is None:
            continue
        last = rows[-1][3] if rows else None
        if row[3] is None or (last is not None and row[3] < last):  # no gap before it
            odd["bad_time"] += 1
            row = (*row[:3], last or 0.0, *row[4:])
        rows.append(row)
    odd["empty_sessions"] = int(not rows)
    t = np.array([r[3] for r in rows], float)
    api = np.array([r[5] for r in rows], float)
    gaps = np.maximum(0.0, np.diff(t, prepend=t[:1]) - np.roll(api, 1))
    pauses = np.array([r[4] if r[4] is not None else g for r, g in zip(rows, gaps)], float)
    pauses[:1] = 0.0
    return Session(str(d.get("id") or os.path.basename(path)), block, np.array([r[0] for r in rows], np.int64),
                   np.array([r[1] for r in rows], np.int64), tuple(r[2] for r in rows), pauses, api, odd)


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and np.isfinite(x)


def _request(r, block: int, odd: dict[str, int]) -> tuple | None:
    """(in, out, hash ids, t or None, think time or None, api time) of one recorded request, or None when
    it is skipped; `odd` counts the rules applied (`ODD_RULES`; `bad_time` is the caller's)."""
    r = r if isinstance(r, dict) else {}
    n_in, n_out, ids = r.get("in"), r.get("out"), r.get("hash_ids")
    good_ids = isinstance(ids, list) and all(isinstance(h, int) and not isinstance(h, bool) and h >= 0 for h in ids)
    if (not isinstance(n_in, int) or n_in < 1 or not isinstance(n_out, int) or n_out < 0 or not good_ids
            or len(ids) not in (n_in // block, -(-n_in // block))):
        odd["skipped"] += 1
        return None
    if n_out == 0:
        odd["zero_output"] += 1
        n_out = 1
    think = r.get("think_time")
    if think is not None and not (_number(think) and think >= 0):
        odd["bad_pause"] += 1
        think = None
    t, api = r.get("t"), r.get("api_time")
    return (n_in, n_out, np.asarray(ids, np.int64), float(t) if _number(t) else None, think,
            float(api) if _number(api) and api > 0 else 0.0)


# -- lengths and hits (what the simulator needs) ------------------------------------------------------

def block_sizes(s: Session, k: int, scale: float = 1.0) -> tuple[np.ndarray, int]:
    """(tokens of each hashed block, tokens of the unhashed tail) of request k at `scale`."""
    n_in, ids = int(s.inputs[k]), s.ids[k]
    full = min(len(ids), n_in // s.block)
    b = max(1, round(s.block * scale))
    sizes = np.full(len(ids), b, np.int64)
    rest = n_in - s.block * full
    if len(ids) > full:  # a hashed partial last block
        sizes[-1], rest = max(1, round(rest * scale)), 0
    return sizes, round(rest * scale) if len(ids) else max(1, round(rest * scale))


def session_hits(s: Session, scale: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """(prompt tokens, hit tokens) per request: an unbounded cache of every id
    seen earlier in the session; a request reuses its longest leading run of seen ids."""
    seen: set[int] = set()
    prompt, hit = np.zeros(len(s.inputs), np.int64), np.zeros(len(s.inputs), np.int64)
    for k, ids in enumerate(s.ids):
        sizes, tail = block_sizes(s, k, scale)
        new = [h not in seen for h in ids.tolist()] + [True]
        run = new.index(True)
        prompt[k], hit[k] = sizes.sum() + tail, sizes[:run].sum()
        seen.update(ids.tolist())
    return prompt, hit


@dataclasses.dataclass(frozen=True)
class SessionTable:
    """Per agent (a session or a sampled copy of one), per turn: prompt and trace-hit tokens,
    generated tokens and the pause before the turn; and each agent's session, copy and start."""

    session: np.ndarray  # [A] index into the loaded sessions
    copy: np.ndarray  # [A] 0 for the first use of a session, else the agent id
    start: np.ndarray  # [A] seconds
    prompt: list[np.ndarray]
    hit: list[np.ndarray]
    gen: list[np.ndarray]
    pause: list[np.ndarray]
    odd: dict[str, int] = dataclasses.field(default_factory=no_odd_records)  # `ODD_RULES` applied, over the files

    @property
    def trace_hit_rate(self) -> float:
        return float(sum(h.sum() for h in self.hit) / sum(p.sum() for p in self.prompt))


def session_table(spec: SessionSpec, agents: int | None = None, seed: int = 0, think_time: str = "zero",
                  arrivals=None, max_len: int | None = None) -> SessionTable:
    """The agents of a session workload: each loaded session once, then (agents > sessions) sessions
    drawn with replacement. Offline (`arrivals` None), a copy starts at a uniform offset within its
    session's first recorded turn (response + pause); online, `arrivals(n)` gives the n start times.
    `max_len` (the model's context) ends a session before its first request whose prompt + generation
    exceeds it (docs/paper.md §9's MaxLen rule); a session whose first request does is left out."""
    loaded = load_sessions(spec.path, spec.limit)
    factor = pause_factor(think_time)
    turns = {}
    for i, s in enumerate(loaded):
        prompt, hit = session_hits(s, spec.scale)
        gen = np.maximum(1, np.round(s.outputs * spec.scale)).astype(np.int64)
        fits = prompt + gen <= (max_len or np.inf)
        kept = len(prompt) if fits.all() else int(np.argmin(fits))
        if kept:
            turns[i] = (prompt[:kept], hit[:kept], gen[:kept], s.pauses[:kept] * factor)
    if not turns:
        raise SessionError(f"{spec.path}: no session's first request fits the model's {max_len} tokens; "
                           f"shrink them with LENGTH_SCALE")
    usable = np.array(sorted(turns))
    n = agents or len(usable)
    extra = usable[stream("session-sample", seed).integers(0, len(usable), max(0, n - len(usable)))]
    which = np.concatenate([usable[:n], extra]).astype(np.int64)
    copy = np.where(np.arange(n) < len(usable), 0, np.arange(n))
    if arrivals is not None:
        start = np.asarray(arrivals(n), float)
    else:
        rng = stream("session-sample", seed, 1)
        span = [loaded[i].api_s[0] + (turns[i][3][1] if len(turns[i][3]) > 1 else 0.0) for i in which]
        start = np.where(copy > 0, rng.uniform(0, 1, n) * np.array(span), 0.0)
    odd = {k: sum(s.odd.get(k, 0) for s in loaded) for k in ODD_RULES}
    odd["beyond_context"] = sum(len(s.inputs) for s in loaded) - sum(len(t[0]) for t in turns.values())
    return SessionTable(which, copy, start, *([turns[i][k] for i in which] for k in range(4)), odd)


# -- tokens (what a real run needs) ---------------------------------------------------------------

def session_prompts(s: Session, copy: int, vocab: int, scale: float = 1.0, seed: int = 0) -> list[np.ndarray]:
    """The prompt token ids of every request of `s`: a block's tokens depend only on (seed, session,
    copy, hash id, scale), the tail's on the request."""
    b = max(1, round(s.block * scale))
    top = max((int(ids.max()) for ids in s.ids if len(ids)), default=0) + 1
    table = stream("session-blocks", seed, s.key, copy).integers(0, vocab, (top + len(s.inputs), b), dtype=np.int32)
    prompts = []
    for k, ids in enumerate(s.ids):
        sizes, tail = block_sizes(s, k, scale)
        parts = [table[ids[:len(ids) - 1]].ravel()] if len(ids) else []
        if len(ids):
            parts.append(table[ids[-1], :sizes[-1]])
        parts.append(table[top + k, :tail])  # tail <= b: fewer tokens than a block
        prompts.append(np.concatenate(parts))
    return prompts


HIT_GAP = ("hit_rate is below trace_hit_rate because the store hits whole --block-tokens blocks (trace blocks "
           "of round(64 x LENGTH_SCALE) tokens that do not fill one are recomputed, as is the unhashed tail), one "
           "prompt token is always computed, and the store is bounded (LRU eviction, blocks not yet written or "
           "bad are misses); trace_hit_rate_at_block is the most an unbounded store of the run's block size can "
           "hit. Both count every session's first turn as a miss.")


def hit_summary(prompts: list[np.ndarray], hits: list[np.ndarray], block_tokens: int) -> dict:
    """report.json's trace hit keys: the trace's own token hit rate (unbounded cache, hash ids) and
    the same rounded down to whole `block_tokens` blocks with one prompt token left to compute
    (`lengths.at_block`, as the simulator replays them)."""
    p, h = np.concatenate(prompts), np.concatenate(hits)
    whole = at_block(h, p, block_tokens)
    return {"trace_hit_rate": float(h.sum() / p.sum()), "trace_hit_rate_at_block": float(whole.sum() / p.sum()),
            "trace_hit_gap": HIT_GAP}


def turn_shape(loaded: tuple[Session, ...]) -> dict:
    """How a session's turn length falls with its turn count: per session with at least two requests, N
    requests and its context growth per turn g = (last prompt - first prompt) / (N - 1) (the A + G of
    the paper's replay rule, net of compactions); the least-squares power law log g = a + b log N, the
    residual log spread, the Pearson correlation of log N and log g, and the spread of log N."""
    n, growth = [], []
    for s in loaded:
        if len(s.inputs) >= 2:
            n.append(len(s.inputs))
            growth.append(max(1, int(s.inputs[-1]) - int(s.inputs[0])) / (len(s.inputs) - 1))
    if len(n) < 3:
        raise SessionError(f"a shape needs at least 3 sessions of 2 or more requests, got {len(n)}")
    x, y = np.log(n), np.log(growth)
    slope, intercept = np.polyfit(x, y, 1)
    residual = y - (intercept + slope * x)
    return {"sessions": len(n), "power": float(-slope), "intercept": float(intercept),
            "spread": float(residual.std(ddof=2)), "pearson": float(np.corrcoef(x, y)[0, 1]),
            "turns_mean": float(np.mean(n)), "turns_log_spread": float(x.std(ddof=1))}
