"""The stream-name rule, written once: settings, the API and the ledger's keys all check it.

Kinesis names a stream with 1 to 128 of ``[A-Za-z0-9_.-]``. keo also refuses a name of dots
only (``.``, ``..``): it cannot be a URL path segment (clients normalise it away), so the API
could never read its ledger. The ledger's keys rest on the rule: a group item's key is
``__keo__/group/<stream>/<id>`` and a key item's ``<stream>#<key>``, so a name without ``/``
and ``#`` can never make one item's key another's. :func:`check_stream_name` is called where
those keys are built; it remembers the names it passed, so a claim pays a dictionary lookup.
"""

from __future__ import annotations

import functools
import re
from typing import Final

from dedupe_store.errors import InvalidStreamNameError

__all__ = ["MAX_STREAM_NAME_CHARS", "STREAM_NAME_PATTERN", "check_stream_name"]

MAX_STREAM_NAME_CHARS: Final = 128
# for pydantic's Field(pattern=...) too: one character at least, not all of them dots
STREAM_NAME_PATTERN: Final = r"^[A-Za-z0-9_.-]*[A-Za-z0-9_-][A-Za-z0-9_.-]*$"
_STREAM_NAME: Final = re.compile(STREAM_NAME_PATTERN)


@functools.lru_cache(maxsize=1024)
def check_stream_name(name: str) -> str:
    """``name`` itself when it is a stream name keo can use; else an
    :class:`~dedupe_store.errors.InvalidStreamNameError` saying why.

    Only valid names are remembered (a raise is not cached), so the cache holds at most the
    streams a process writes or reads, up to its bound.
    """
    if not name:
        raise InvalidStreamNameError(name, "is empty")
    if len(name) > MAX_STREAM_NAME_CHARS:
        raise InvalidStreamNameError(
            name, f"is longer than {MAX_STREAM_NAME_CHARS} characters ({len(name)})"
        )
    if _STREAM_NAME.fullmatch(name) is None:
        raise InvalidStreamNameError(
            name, "may hold only A-Z, a-z, 0-9, '_', '.' and '-', and not dots only"
        )
    return name
