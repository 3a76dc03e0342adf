"""The opaque cursor of the in-flight listing. Pure: no I/O.

The listing walks the sparse in-flight index bucket by bucket (0 .. buckets - 1), each bucket
in lease-expiry order. A cursor says where the next page starts: the bucket, and within it
the index position (lease expiry, group item key) of the last claim group returned, or the
start of the bucket. It also carries the stream and the stale cut-off of the first page, so
every page of one listing uses the same cut-off and a cursor cannot be replayed against
another stream.

Wire form: URL-safe base64 (no padding) of a compact JSON object whose first member is its
version, ``{"v":``, so every cursor starts with ``eyJ2Ijo`` (:data:`CURSOR_PATTERN`, published
in the OpenAPI document). Clients must treat it as opaque; its layout may change between
versions (``v``).

A cursor comes back from clients, so it is checked like any input: every field's type and
range (times a datetime can hold, a bucket of the index, a key Kinesis could take), before
anything reaches DynamoDB or a datetime.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from dataclasses import dataclass
from typing import TypeGuard

from api.errors import ApiError
from dedupe_store.ledger import group_pk

_VERSION = 1
MAX_CURSOR_CHARS = 2048
CURSOR_PATTERN = r"^eyJ2Ijo[A-Za-z0-9_-]+$"  # base64url of '{"v":' then the rest, unpadded
# 9999-12-31T23:59:59.999Z: the last instant a datetime (and an RFC 3339 time) can hold
MAX_EPOCH_MS = 253_402_300_799_999


class InvalidCursorError(ApiError, ValueError):
    """The cursor was not issued by this API for this listing (an API error, and a ValueError
    for callers that catch those)."""


@dataclass(frozen=True, slots=True)
class InFlightCursor:
    """Where the next page of an in-flight listing starts."""

    stream: str
    bucket: int
    before_ms: int | None  # the stale cut-off of the listing; None lists every in-flight claim
    after_lease_ms: int | None = None  # both None: start of the bucket
    after_pk: str | None = None  # the pk of the last group item listed

    def encode(self) -> str:
        body = {
            "v": _VERSION,
            "s": self.stream,
            "b": self.bucket,
            "t": self.before_ms,
            "l": self.after_lease_ms,
            "k": self.after_pk,
        }
        raw = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
        return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def decode_cursor(token: str, *, stream: str, buckets: int, stale: bool) -> InFlightCursor:
    """The cursor ``token`` stands for, checked against the listing it is used with."""
    if not token or len(token) > MAX_CURSOR_CHARS:
        raise InvalidCursorError("cursor is empty or too long")
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        body = json.loads(raw.decode("utf-8"))
    except (binascii.Error, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise InvalidCursorError("cursor is not one this API issued") from exc
    if not isinstance(body, dict) or not _is_int(body.get("v")) or body["v"] != _VERSION:
        raise InvalidCursorError("cursor is not one this API issued")
    cursor_stream = body.get("s")
    bucket = body.get("b")
    before_ms = body.get("t")
    after_lease_ms = body.get("l")
    after_pk = body.get("k")
    if cursor_stream != stream:
        raise InvalidCursorError("cursor belongs to another stream")
    if not _is_int(bucket) or not 0 <= bucket < buckets:
        raise InvalidCursorError("cursor names a bucket outside the in-flight index")
    if before_ms is not None and not _is_epoch_ms(before_ms):
        raise InvalidCursorError("cursor is not one this API issued")
    if (before_ms is not None) != stale:
        raise InvalidCursorError(
            f"cursor was issued for stale={'true' if before_ms is not None else 'false'}"
        )
    if after_lease_ms is None and after_pk is None:
        return InFlightCursor(stream=stream, bucket=bucket, before_ms=before_ms)
    if not _is_epoch_ms(after_lease_ms):
        raise InvalidCursorError("cursor is not one this API issued")
    # the index holds claim groups (ledger schema v2): a key item's pk is not a place in it
    if not _is_group_key(after_pk, stream):
        raise InvalidCursorError("cursor is not one this API issued")
    # DynamoDB rejects a start key outside the query's range condition
    if before_ms is not None and after_lease_ms >= before_ms:
        raise InvalidCursorError("cursor is not one this API issued")
    return InFlightCursor(
        stream=stream,
        bucket=bucket,
        before_ms=before_ms,
        after_lease_ms=after_lease_ms,
        after_pk=after_pk,
    )


_GROUP_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_epoch_ms(value: object) -> TypeGuard[int]:
    return _is_int(value) and 0 <= value <= MAX_EPOCH_MS


def _is_group_key(value: object, stream: str) -> TypeGuard[str]:
    """A group item's key of this stream: ``__keo__/group/<stream>/<id>``."""
    prefix = group_pk(stream, "")
    return (
        isinstance(value, str)
        and value.startswith(prefix)
        and _GROUP_ID.fullmatch(value[len(prefix) :]) is not None
    )
