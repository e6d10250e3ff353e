"""The store's errors; the cause of a failed write in one word (an errno name when there is one);
a library error cut to one short line (TensorStore appends its whole JSON spec to each)."""

from __future__ import annotations

import errno
import re

_OS_ERROR = re.compile(r"os_error_code='(\d+)'|\[OS error (\d+)")  # how TensorStore's file driver names errno
_TS_CONTEXT = re.compile(r"\s*\[(tensorstore_spec|source locations)=.*", re.S)  # the spec TensorStore appends
BRIEF_CHARS = 200  # the most of a library's message that goes into one of the store's


class StoreError(Exception):
    """A store that cannot be opened or written; the message says what to do. `cause` names the
    failure in one word ("ENOSPC", "EIO", "EACCES", a TensorStore status code, ...)."""

    def __init__(self, message: str, cause: str = "error"):
        super().__init__(message)
        self.cause = cause


class FingerprintMismatch(StoreError):
    """A store written for another record format, model, weights or block size."""


def cause_of(e: BaseException) -> str:
    """"ENOSPC" for a full disk, "EIO", "EACCES", ...; else TensorStore's status code or the type."""
    number = e.errno if isinstance(e, OSError) and e.errno else None
    if number is None and (m := _OS_ERROR.search(str(e))):
        number = int(m[1] or m[2])
    if number is not None:
        return errno.errorcode.get(number, f"errno {number}")
    head = str(e).split(":", 1)[0].strip()
    return head if head.isupper() and " " not in head else type(e).__name__


def brief(e: BaseException) -> str:
    """`e`'s message on one line of at most BRIEF_CHARS: TensorStore's appended JSON spec and
    source locations dropped, the rest cut with an ellipsis."""
    text = " ".join(_TS_CONTEXT.sub("", str(e)).split())
    return text if len(text) <= BRIEF_CHARS else text[:BRIEF_CHARS - 1] + "…"
