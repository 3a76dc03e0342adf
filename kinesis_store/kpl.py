"""The one place that touches aws-kinesis-agg: the KPL aggregation format.

Why a wrapper: importing aws-kinesis-agg puts its own folder first on ``sys.path`` (we put it
back), its deaggregator re-encodes user data as base64 while raw records come back as bytes
(we return bytes for both), and it prints and drops what it cannot parse (we raise
:class:`kinesis_store.errors.AggregationFormatError` instead).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from kinesis_store.entries import put_entry
from kinesis_store.errors import AggregationFormatError

MAGIC = b"\xf3\x89\x9a\xc2"
_DIGEST_BYTES = 16


@functools.cache
def _library() -> tuple[Any, Any, Any]:
    """aws-kinesis-agg's aggregator, deaggregator and protobuf messages, imported on first use:
    protobuf's import is about a tenth of a second of every command's start, and most sends
    and reads never meet an aggregate."""
    saved = list(sys.path)
    try:
        from aws_kinesis_agg import aggregator, deaggregator, messages_pb2
    finally:
        sys.path[:] = saved
    return aggregator, deaggregator, messages_pb2


# The aggregate's own partition key counts against the record limit too: up to 256
# characters of up to 4 UTF-8 bytes each.
_AGGREGATE_KEY_RESERVE_BYTES = 1024


class Aggregate:
    """One KPL aggregated record being filled. Not thread-safe (neither is the library):
    build each aggregate in one thread."""

    def __init__(self, max_record_bytes: int) -> None:
        limit = min(max_record_bytes, 1024 * 1024) - _AGGREGATE_KEY_RESERVE_BYTES
        aggregator, _, _ = _library()
        self._record = aggregator.AggRecord(max_size=limit)

    def add(self, partition_key: str, data: bytes, explicit_hash_key: str | None) -> bool:
        """Add a user record; False when it does not fit (start another aggregate)."""
        try:
            return bool(self._record.add_user_record(partition_key, data, explicit_hash_key))
        except ValueError:
            return False  # bigger than an aggregate can hold: the caller sends it alone

    def __len__(self) -> int:
        return int(self._record.get_num_user_records())

    def entry(self) -> dict[str, Any]:
        """The PutRecords entry: routed by the first user record's hash key."""
        partition_key, explicit_hash_key, data = self._record.get_contents()
        return put_entry(partition_key, data, explicit_hash_key or None)


@dataclass(frozen=True, slots=True)
class UserRecord:
    """A user record as a KCL consumer sees it (one per raw record, or one per aggregated entry)."""

    shard_id: str
    partition_key: str
    data: bytes
    sequence_number: str
    sub_sequence_number: int | None
    explicit_hash_key: str | None
    arrival_ms: int

    @property
    def aggregated(self) -> bool:
        return self.sub_sequence_number is not None


def is_aggregated(data: bytes) -> bool:
    """True when ``data`` is a KPL aggregate: the magic, a protobuf body, and its MD5."""
    if len(data) <= len(MAGIC) + _DIGEST_BYTES or not data.startswith(MAGIC):
        return False
    body, digest = data[len(MAGIC) : -_DIGEST_BYTES], data[-_DIGEST_BYTES:]
    return hashlib.md5(body, usedforsecurity=False).digest() == digest


def deaggregate(shard_id: str, record: dict[str, Any]) -> Iterator[UserRecord]:
    """The user records inside one GetRecords record (itself, when it is not aggregated)."""
    data: bytes = record["Data"]
    sequence_number = str(record["SequenceNumber"])
    arrival_ms = arrival_ms_of(record.get("ApproximateArrivalTimestamp"))
    if not is_aggregated(data):
        yield UserRecord(
            shard_id, record["PartitionKey"], data, sequence_number, None, None, arrival_ms
        )
        return
    try:
        entries = _parse(data).records
    except Exception as exc:
        raise AggregationFormatError(shard_id, sequence_number, str(exc)) from exc
    expected = len(entries)
    produced = 0
    # the library needs every field GetRecords returns; tests and tools may omit the time
    complete = {"ApproximateArrivalTimestamp": None, **record}
    _, deaggregator, _ = _library()
    for user in deaggregator.iter_deaggregate_records([complete], data_format="Boto3"):
        body = user["kinesis"]
        # the library reports table entry 0 for user records that have no explicit hash key
        has_ehk = produced < expected and entries[produced].HasField("explicit_hash_key_index")
        produced += 1
        yield UserRecord(
            shard_id,
            body["partitionKey"],
            base64.b64decode(body["data"]),
            sequence_number,
            int(body["subSequenceNumber"]),
            body.get("explicitHashKey") if has_ehk else None,
            arrival_ms,
        )
    if produced != expected:
        # the library printed the cause to stderr and stopped; never drop silently
        raise AggregationFormatError(
            shard_id, sequence_number, f"read {produced} of {expected} user records"
        )


def user_record_count(shard_id: str, record: dict[str, Any]) -> int:
    """How many user records one GetRecords record holds (1 unless it is an aggregate),
    without decoding them."""
    data: bytes = record["Data"]
    if not is_aggregated(data):
        return 1
    try:
        return len(_parse(data).records)
    except Exception as exc:
        raise AggregationFormatError(shard_id, str(record["SequenceNumber"]), str(exc)) from exc


def _parse(data: bytes) -> Any:
    _, _, messages_pb2 = _library()
    message = messages_pb2.AggregatedRecord()
    message.ParseFromString(data[len(MAGIC) : -_DIGEST_BYTES])
    return message


def arrival_ms_of(value: Any) -> int:
    """``ApproximateArrivalTimestamp`` (a datetime from boto3, or epoch seconds) in epoch ms."""
    if isinstance(value, datetime):
        return int(value.timestamp() * 1000)
    if isinstance(value, int | float):
        return int(value * 1000)
    return 0
