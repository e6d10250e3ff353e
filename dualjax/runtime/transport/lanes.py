"""What every transport promises: the interface hosts and rank 0 talk through, and the two lanes.

* **control**: every message whose class has no `bulk = True`. Small frozen dataclasses, sent at
  once: they overtake any queued KV (the high-priority lane).
* **bulk**: `LayerKV` and the messages that must stay in order with it (`PrefillDone`, which ends
  a request's KV stream). Per source and destination, bulk messages arrive in the order sent.

`sent_bytes` counts, per rank, "kv" (KV payload bytes) and "control" (the pickled bytes of every
other message and of the KV headers): what crosses the network, not how many messages.
"""

from __future__ import annotations

import collections
import pickle


class HostFailure(RuntimeError):
    """A host raised: the run is over. The message carries that host's traceback."""


def is_bulk(msg) -> bool:
    """Whether `msg` travels on the bulk lane (in order with the KV before it)."""
    return getattr(msg, "bulk", False)


def pickled(msg) -> bytes:
    """`msg` as a control message crosses the wire."""
    return pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)


class Transport:
    """How ranks exchange messages. `rank`, `size`: this rank and the job's ranks."""

    rank: int
    size: int

    def __init__(self):
        self.sent_bytes = collections.Counter()  # "control" / "kv" -> bytes

    def send(self, dst: int, msg) -> None:
        """Queue `msg` for rank `dst`; never blocks on the peer. A `LayerKV`'s array is read until
        it is sent: the caller must not modify it meanwhile (it may drop it)."""
        raise NotImplementedError

    def recv(self, timeout: float | None = None):
        """(source rank, message), or None after `timeout` seconds. Raises `HostFailure` once
        another host failed."""
        raise NotImplementedError

    def abort(self, text: str) -> None:
        """End the whole job now (another host failed)."""
        raise NotImplementedError

    def close(self) -> None:
        """Flush what was sent and release the transport's resources."""
