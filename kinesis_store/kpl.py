"""The one place that touches aws-kinesis-agg: the KPL aggregation format.

Why a wrapper: importing aws-kinesis-agg puts its own folder first on ``sys.path`` (we put it
back), and its deaggregator re-encodes user data as base64 while raw records come back as bytes,
and prints and drops what it cannot parse. We read the protobuf ourselves, as the KCL does
(:func:`deaggregate`: the members before a fault are delivered, a body that is no aggregate is
delivered raw), and say what was wrong (:class:`MalformedAggregate`) so that a reader logs it,
counts it, or stops (:meth:`MalformedAggregate.error`).
"""

from __future__ import annotations

import functools
import hashlib
import re
import sys
from collections.abc import Sequence
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
    """True when ``data`` has the KPL form: the magic, a body, and the body's MD5."""
    if len(data) <= len(MAGIC) + _DIGEST_BYTES or not data.startswith(MAGIC):
        return False
    body, digest = data[len(MAGIC) : -_DIGEST_BYTES], data[-_DIGEST_BYTES:]
    return hashlib.md5(body, usedforsecurity=False).digest() == digest


@dataclass(frozen=True, slots=True)
class MalformedAggregate:
    """A record with the KPL magic and a valid MD5 tail that could not be read whole, and what
    a KCL consumer gets of it: with ``raw``, the record itself (its body is no aggregate);
    else the ``delivered`` user records before the fault, and not the ``dropped`` ones from
    the fault on (``dropped`` 0 with ``raw``)."""

    shard_id: str
    sequence_number: str
    reason: str
    raw: bool
    delivered: int
    dropped: int

    def error(self) -> AggregationFormatError:
        """The error that stops a reader which must not go past such a record."""
        return AggregationFormatError(self.shard_id, self.sequence_number, self.reason)


@dataclass(frozen=True, slots=True)
class Deaggregated:
    """What one GetRecords record holds for a KCL consumer, before the shard's hash-range rule
    (:func:`kinesis_store.shards.kcl_view`): its user records, and the fault when it has the
    KPL form but could not be read whole."""

    records: tuple[UserRecord, ...]
    fault: MalformedAggregate | None = None


# The KCL's deaggregation, followed here rule for rule (amazon-kinesis-client:
# software/amazon/kinesis/retrieval/AggregatorUtil.java ``deaggregate``; KCL 1.x:
# com/amazonaws/services/kinesis/clientlibrary/types/UserRecord.java ``deaggregate``):
# - no magic, 16 bytes or fewer after it, or an MD5 tail that does not match: a raw record;
# - a body protobuf refuses (``InvalidProtocolBufferException``, which Java also raises for a
#   user record without its required fields): the record is delivered raw, too;
# - a body that parses, then fails on a user record (a partition or explicit hash key index
#   outside its table, an explicit hash key that is no integer): the error is logged, the user
#   records before it stay delivered, that one and the rest are dropped;
# - the hash-range rule (any member outside the shard's range drops the whole aggregate) needs
#   the shard: :func:`kinesis_store.shards.kcl_view`.


def deaggregate(shard_id: str, record: dict[str, Any]) -> Deaggregated:
    """The user records a KCL consumer gets of one GetRecords record (itself, when it is not
    an aggregate), before the shard's hash-range rule; never raises on a malformed aggregate
    (:attr:`Deaggregated.fault` says what was wrong)."""
    data: bytes = record["Data"]
    sequence_number = str(record["SequenceNumber"])
    arrival_ms = arrival_ms_of(record.get("ApproximateArrivalTimestamp"))

    def raw() -> UserRecord:
        return UserRecord(
            shard_id, record["PartitionKey"], data, sequence_number, None, None, arrival_ms
        )

    if not is_aggregated(data):
        return Deaggregated((raw(),))
    try:
        message = _parse(data)
    except _NotAnAggregateError as exc:
        fault = MalformedAggregate(shard_id, sequence_number, str(exc), True, 0, 0)
        return Deaggregated((raw(),), fault)
    keys = message.partition_key_table
    hash_keys = message.explicit_hash_key_table
    members: list[UserRecord] = []
    for index, entry in enumerate(message.records):
        try:
            partition_key, explicit_hash_key = _keys_of(entry, keys, hash_keys)
        except _NotAnAggregateError as exc:
            dropped = len(message.records) - index
            reason = f"user record {index}: {exc}"
            fault = MalformedAggregate(shard_id, sequence_number, reason, False, index, dropped)
            return Deaggregated(tuple(members), fault)
        members.append(
            UserRecord(
                shard_id,
                partition_key,
                entry.data,
                sequence_number,
                index,
                explicit_hash_key,
                arrival_ms,
            )
        )
    return Deaggregated(tuple(members))


def user_record_count(shard_id: str, record: dict[str, Any]) -> int:
    """How many user records a KCL consumer gets of one GetRecords record, before the shard's
    hash-range rule (1 unless it is an aggregate); never raises."""
    if not is_aggregated(record["Data"]):
        return 1
    return len(deaggregate(shard_id, record).records)


# BigInteger(String) takes an optional sign and digits, nothing else
_INTEGER = re.compile(r"[+-]?[0-9]+")


class _NotAnAggregateError(ValueError):
    """The body, or one user record of it, cannot be read as the KCL reads it."""


def _keys_of(entry: Any, keys: Sequence[str], hash_keys: Sequence[str]) -> tuple[str, str | None]:
    """A user record's partition key and explicit hash key, from the aggregate's tables."""
    if entry.partition_key_index >= len(keys):
        raise _NotAnAggregateError(
            f"partition key index {entry.partition_key_index} outside its table of {len(keys)}"
        )
    if not entry.HasField("explicit_hash_key_index"):
        return keys[entry.partition_key_index], None
    if entry.explicit_hash_key_index >= len(hash_keys):
        raise _NotAnAggregateError(
            f"explicit hash key index {entry.explicit_hash_key_index} outside its table of "
            f"{len(hash_keys)}"
        )
    explicit_hash_key = hash_keys[entry.explicit_hash_key_index]
    if not _INTEGER.fullmatch(explicit_hash_key):
        raise _NotAnAggregateError(f"explicit hash key {explicit_hash_key!r} is no integer")
    return keys[entry.partition_key_index], explicit_hash_key


def _parse(data: bytes) -> Any:
    _, _, messages_pb2 = _library()
    message = messages_pb2.AggregatedRecord()
    try:
        message.ParseFromString(data[len(MAGIC) : -_DIGEST_BYTES])
    except Exception as exc:  # protobuf's DecodeError, or what its C layer raises
        raise _NotAnAggregateError(f"not an aggregate: {exc}") from exc
    # Java's parseFrom refuses a message without its required fields; Python's does not check
    if not message.IsInitialized():
        missing = ", ".join(message.FindInitializationErrors())
        raise _NotAnAggregateError(f"not an aggregate: missing required {missing}")
    return message


def arrival_ms_of(value: Any) -> int:
    """``ApproximateArrivalTimestamp`` (a datetime from boto3, or epoch seconds) in epoch ms."""
    if isinstance(value, datetime):
        return int(value.timestamp() * 1000)
    if isinstance(value, int | float):
        return int(value * 1000)
    return 0
