"""Small recorded traces built in a test's temporary directory, in the formats docs/workloads.md
describes: agentic coding sessions (one JSON file per session) and Mooncake (JSONL). Tests never need
the public traces; those that use them skip when they are absent."""

from __future__ import annotations

import gzip
import json
import os

import numpy as np

SESSION_BLOCK = 64


def session_requests(n: int, seed: int, first_in: int = 60_000, append: int = 3_000, out: int = 300) -> list[dict]:
    """`n` requests of one coding session: each prompt is the previous one's full blocks (same hash
    ids) plus new blocks for the rest (the previous output re-rendered, the tool result), an unhashed
    tail, a recorded time, response time and think time."""
    rng = np.random.default_rng(seed)
    ids: list[int] = []
    t, requests, n_in = 0.0, [], first_in
    for k in range(n):
        full = n_in // SESSION_BLOCK
        ids = ids + list(range(len(ids) + 1, full + 1))  # ids 1..full: the earlier ones, then new blocks
        n_out = int(rng.integers(out // 2, out * 2))
        api, think = float(rng.uniform(2, 10)), 0.0 if k == 0 else float(rng.uniform(5, 60))
        t += think
        requests.append({"t": round(t, 1), "in": n_in, "out": n_out, "hash_ids": list(ids), "api_time": api,
                         "think_time": think})
        t += api
        n_in += n_out + int(rng.integers(append // 2, append * 2))
    return requests


def write_session(path: str, requests: list[dict], gz: bool = False) -> str:
    body = json.dumps({"id": os.path.basename(path).split(".")[0], "block_size": SESSION_BLOCK, "requests": requests})
    if gz:
        with gzip.open(path, "wt") as f:
            f.write(body)
    else:
        with open(path, "w") as f:
            f.write(body)
    return path


def two_sessions(d: str) -> str:
    """A directory of two sessions of 4 and 8 requests, one gzipped and one plain JSON."""
    write_session(os.path.join(d, "trace_a.json.gz"), session_requests(4, seed=1), gz=True)
    write_session(os.path.join(d, "trace_b.json"), session_requests(8, seed=2, first_in=40_000))
    return d


def mooncake_records(n: int, seed: int = 0, block: int = 512) -> list[dict]:
    """`n` Mooncake records in ticks of 3 s, about half sharing a leading run of hash ids with an earlier one."""
    rng = np.random.default_rng(seed)
    records, next_id = [], 0
    for i in range(n):
        n_in = int(rng.integers(2, 12)) * block - int(rng.integers(0, block))
        blocks = -(-n_in // block)
        shared = records[int(rng.integers(0, len(records)))]["hash_ids"][:blocks - 1] if records and i % 2 else []
        ids = shared + list(range(next_id, next_id + blocks - len(shared)))
        next_id += blocks - len(shared)
        records.append({"timestamp": 3000 * (i // 4), "input_length": n_in, "output_length": int(rng.integers(1, 50)),
                        "hash_ids": ids})
    return records


def write_jsonl(path: str, records: list) -> str:
    with open(path, "w") as f:
        f.write("\n".join(r if isinstance(r, str) else json.dumps(r) for r in records) + "\n")
    return path
