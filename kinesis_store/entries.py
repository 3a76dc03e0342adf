"""What Kinesis counts in a PutRecords request: its limits, how a record is routed (the MD5
hash key), a record's size, and an entry's shape. Pure: no I/O.
"""

from __future__ import annotations

import hashlib
from typing import Any

__all__ = [
    "DEFAULT_MAX_RECORD_BYTES",
    "MAX_HASH_KEY",
    "MAX_PUT_REQUEST_BYTES",
    "MAX_RECORDS_PER_PUT",
    "hash_key_of",
    "put_entry",
    "record_size",
]

MAX_RECORDS_PER_PUT = 500
MAX_PUT_REQUEST_BYTES = 5 * 1024 * 1024
DEFAULT_MAX_RECORD_BYTES = 1024 * 1024  # where the stream does not say (MaxRecordSizeInKiB)
MAX_HASH_KEY = 2**128 - 1


def hash_key_of(routing_key: str) -> int:
    """Kinesis routing: the MD5 of the key as a 128-bit unsigned integer."""
    return int.from_bytes(hashlib.md5(routing_key.encode("utf-8"), usedforsecurity=False).digest())


def record_size(key: str, data: bytes) -> int:
    """What Kinesis counts against the record limit: data plus the UTF-8 partition key."""
    return len(data) + len(key.encode("utf-8"))


def put_entry(key: str, data: bytes, explicit_hash_key: str | None = None) -> dict[str, Any]:
    """One PutRecords entry. The message key is the partition key, so every record names its
    key; ``explicit_hash_key``, when given, routes it instead of the key's MD5."""
    entry: dict[str, Any] = {"Data": data, "PartitionKey": key}
    if explicit_hash_key is not None:
        entry["ExplicitHashKey"] = explicit_hash_key
    return entry
