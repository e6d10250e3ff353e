"""The store's errors, and the cause of a failed write in one word (an errno name when there is one)."""

from __future__ import annotations

import errno
import re

_OS_ERROR = re.compile(r"os_error_code='(\d+)'|\[OS error (\d+)")  # how TensorStore's file driver names errno


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
