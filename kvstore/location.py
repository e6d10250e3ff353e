"""Where a store is, from one line of text: a directory (the POSIX back end) or any TensorStore
kvstore, by URL (`file:///shared/kv/`, `gs://bucket/kv/`, `memory://`, an adapter such as
`file:///shared/kv/|ocdbt:`) or JSON spec, inline or in a `.json` file (the TensorStore back end;
so `file://` is how to put a local directory on TensorStore's I/O).

Whether a store is there is asked of its manifest (`store_exists`). A network store is reached once
with few retries and a time limit (REACH_S), so an unreachable one is one line, not minutes of
TensorStore's retries. A `memory://` store lives in one process: every store of a process opens it
in the same context, so they all see one store.

Errors are one line that starts with the text as given; a caller that took it from a flag or a
file adds that name.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os

import tensorstore as ts

from kvstore.errors import StoreError, brief
from kvstore.metadata import MANIFEST
from kvstore.store import local_spec

REACH_S = 30.0  # the most a network store may take to answer the first read
# a network store's first read gives up after a few quick retries (TensorStore's own retry for minutes)
REACH_RETRIES = {"max_retries": 2, "initial_delay": "0.5s", "max_delay": "2s"}
EXAMPLES = "a directory, a kvstore URL (file:///shared/kv/, gs://bucket/kv/, s3://bucket/kv/) or a JSON kvstore spec"


@dataclasses.dataclass(frozen=True)
class StoreLocation:
    """Where a store is: `name` as the text gave it, its TensorStore kvstore `spec` and its I/O back
    end `io` ("posix" for a directory, "tensorstore" for a URL or spec)."""

    name: str
    spec: dict
    io: str

    def drivers(self) -> list[str]:
        """Every kvstore driver of the spec, adapters' bases included (`file:///x|ocdbt:`: ocdbt, file)."""
        found, todo = [], [self.spec]
        while todo:
            node = todo.pop()
            if isinstance(node, dict):
                found += [node["driver"]] if isinstance(node.get("driver"), str) else []
                todo += node.values()
        return found

    @property
    def directory(self) -> str | None:
        """The local directory the store is, or None (a store without a filesystem of its own)."""
        return (self.spec["path"].rstrip("/") or "/") if self.spec["driver"] == "file" else None

    @property
    def context(self) -> ts.Context | None:
        """The process's one context for a `memory://` store, so every store of the process (every
        host of an embedded run) opens the same one; None (a fresh one per store) elsewhere."""
        return _memory_context() if "memory" in self.drivers() else None


@functools.cache
def _memory_context() -> ts.Context:
    """The context every `memory://` store of this process opens in: one store, whoever opens it."""
    return ts.Context()


def _json_spec(text: str):
    """The JSON of a location: inline (`{"driver": ...}`) or in the .json file it names."""
    body = text
    if not text.lstrip().startswith("{"):
        try:
            with open(text) as f:
                body = f.read()
        except OSError as e:
            raise StoreError(f"{text}: cannot read the kvstore spec file: {e.strerror}", "spec") from None
    try:
        return json.loads(body)
    except json.JSONDecodeError as e:
        raise StoreError(f"{text.strip()[:80]}: not JSON ({e.msg} at character {e.pos}); {EXAMPLES}", "spec") from None


def locate(text: str) -> StoreLocation:
    """`text` as a location: a directory (POSIX I/O); else a TensorStore kvstore URL, an inline JSON
    spec (`{...}`) or a `.json` file holding one (TensorStore I/O), whose path is taken as a
    directory (a `/` added). Raises StoreError in one line starting with `text`: an unknown scheme
    or driver, a malformed spec."""
    if text.lstrip().startswith("{") or text.endswith(".json"):
        given = _json_spec(text)
    elif "://" in text:
        given = text
    else:
        return StoreLocation(text, local_spec(text), "posix")
    try:
        spec = ts.KvStore.Spec(given).to_json()
    except (ValueError, TypeError) as e:
        why = brief(e).removeprefix(f'Parsing spec from url: "{text}": ')
        raise StoreError(f"{text}: {why}; {EXAMPLES}", "spec") from None
    if spec["driver"] == "file" and not spec.get("path"):
        raise StoreError(f"{text}: a file kvstore needs a path; {EXAMPLES}", "spec")
    if spec.get("path") and not spec["path"].endswith("/"):
        spec["path"] += "/"
    return StoreLocation(text, spec, "tensorstore")


def store_exists(where: StoreLocation) -> bool:
    """Whether a store is at `where` (its manifest), without making one. Raises StoreError in one line
    when the kvstore does not answer: a network store gets few quick retries and REACH_S seconds."""
    if where.directory is not None:
        return os.path.exists(os.path.join(where.directory, MANIFEST))
    context = where.context or ts.Context({f"{k}_request_retries": REACH_RETRIES for k in ("gcs", "s3", "http")})
    try:
        kv = ts.KvStore.open(where.spec, context=context).result(timeout=REACH_S)
        return kv.read(MANIFEST).result(timeout=REACH_S).state == "value"
    except TimeoutError:
        raise StoreError(f"cannot reach the store {where.name}: no answer in {REACH_S:g} s", "ETIMEDOUT") from None
    except (ValueError, OSError, NotImplementedError) as e:
        raise StoreError(f"cannot reach the store {where.name}: {brief(e)}", "unreachable") from None
