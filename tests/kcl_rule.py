"""What a KCL consumer sees of a stream: a test oracle, a small port of the KCL's
deaggregation rule written for the tests, independent of the product's reader and of
aws-kinesis-agg.

The rule, from amazon-kinesis-client
``amazon-kinesis-client/src/main/java/software/amazon/kinesis/retrieval/AggregatorUtil.java``
(``AggregatorUtil.deaggregate(records, startingHashKey, endingHashKey)``, called by
``lifecycle/ProcessTask.java`` with the hash key range of the shard the records were read
from; KCL 1.x ``UserRecord.deaggregate`` does the same):

- a record is a KPL aggregate when its data starts with the magic ``F3 89 9A C2`` and ends with
  the MD5 of the protobuf body between them, and that body parses; anything else is passed on
  as one plain record, never filtered by hash key;
- each user record's *effective hash key* is its explicit hash key (from the aggregate's
  table) when it has one, else the MD5 of its partition key as an unsigned 128-bit integer;
- as soon as one user record's effective hash key is below the shard's starting hash key or
  above its ending hash key, the user records of that aggregate already taken are removed and
  the rest are not looked at: **the whole aggregate is dropped**, not just the stray member.

So a consumer with the KCL's rule never sees an aggregate built on a stale shard map that
landed on a shard not covering all its members; a consumer that deaggregates without the
filter (aws-kinesis-agg's deaggregator, as a Lambda uses it) sees every member of it.

    contents = read_stream(client, stream)      # boto3-shaped client: ListShards, GetRecords
    contents.kcl        # the user records a KCL consumer sees, shard by shard
    contents.unfiltered # the user records a deaggregator without the filter sees
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "KclShard",
    "KclUserRecord",
    "StreamAsSeen",
    "deaggregate_unfiltered",
    "kcl_deaggregate",
    "read_stream",
]

_MAGIC = b"\xf3\x89\x9a\xc2"
_DIGEST_BYTES = 16
_MAX_EMPTY_PAGES = 3  # an open shard's tip: empty pages with MillisBehindLatest 0


@dataclass(frozen=True, slots=True)
class KclShard:
    shard_id: str
    starting_hash_key: int
    ending_hash_key: int


@dataclass(frozen=True, slots=True)
class KclUserRecord:
    shard_id: str
    sequence_number: str
    sub_sequence_number: int | None  # None: a plain record
    partition_key: str
    data: bytes

    @property
    def row(self) -> tuple[str, bytes]:
        return self.partition_key, self.data


@dataclass(slots=True)
class _Member:
    partition_key: str
    explicit_hash_key: str | None
    data: bytes

    def effective_hash_key(self) -> int:
        if self.explicit_hash_key is not None:
            return int(self.explicit_hash_key)
        digest = hashlib.md5(self.partition_key.encode("utf-8"), usedforsecurity=False)
        return int.from_bytes(digest.digest())


def kcl_deaggregate(shard: KclShard, record: Mapping[str, Any]) -> list[KclUserRecord]:
    """The user records the KCL hands its processor for one GetRecords record of ``shard``."""
    members = _aggregate_members(bytes(record["Data"]))
    if members is None:
        return [_plain(shard.shard_id, record)]
    for member in members:
        if not shard.starting_hash_key <= member.effective_hash_key() <= shard.ending_hash_key:
            return []  # one member off the shard: the KCL drops the whole aggregate
    return _users(shard.shard_id, record, members)


def deaggregate_unfiltered(shard: KclShard, record: Mapping[str, Any]) -> list[KclUserRecord]:
    """Every user record of one GetRecords record, with no hash-range filter."""
    members = _aggregate_members(bytes(record["Data"]))
    if members is None:
        return [_plain(shard.shard_id, record)]
    return _users(shard.shard_id, record, members)


@dataclass(frozen=True)
class StreamAsSeen:
    """A whole stream's user records, as a KCL consumer and as an unfiltered one see them."""

    kcl: list[KclUserRecord]
    unfiltered: list[KclUserRecord]
    aggregates: int  # GetRecords records that are KPL aggregates
    dropped_aggregates: int  # of those, the ones the KCL drops whole
    kcl_keys: Counter[str] = field(init=False)
    kcl_rows: Counter[tuple[str, bytes]] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "kcl_keys", Counter(r.partition_key for r in self.kcl))
        object.__setattr__(self, "kcl_rows", Counter(r.row for r in self.kcl))


def read_stream(client: Any, stream: str) -> StreamAsSeen:
    """Every shard (open and closed) read from TRIM_HORIZON to its tip with plain GetRecords
    calls, each record deaggregated both ways."""
    kcl: list[KclUserRecord] = []
    unfiltered: list[KclUserRecord] = []
    aggregates = dropped = 0
    for shard in shards_of(client, stream):
        for record in records_of(client, stream, shard.shard_id):
            seen = kcl_deaggregate(shard, record)
            every = deaggregate_unfiltered(shard, record)
            if every and every[0].sub_sequence_number is not None:
                aggregates += 1
                dropped += not seen
            kcl.extend(seen)
            unfiltered.extend(every)
    return StreamAsSeen(kcl, unfiltered, aggregates, dropped)


# --- the aggregated record format (amazon-kinesis-producer's aggregation-format.md) -------------
#
#   message AggregatedRecord {
#     repeated string partition_key_table     = 1;
#     repeated string explicit_hash_key_table = 2;
#     repeated Record records                 = 3;
#   }
#   message Record {
#     required uint64 partition_key_index     = 1;
#     optional uint64 explicit_hash_key_index = 2;
#     required bytes  data                    = 3;
#     repeated Tag    tags                    = 4;
#   }


def _aggregate_members(data: bytes) -> list[_Member] | None:
    """The members of a KPL aggregate, or None when ``data`` is not one (as the KCL decides)."""
    if len(data) <= len(_MAGIC) + _DIGEST_BYTES or not data.startswith(_MAGIC):
        return None
    body, digest = data[len(_MAGIC) : -_DIGEST_BYTES], data[-_DIGEST_BYTES:]
    if hashlib.md5(body, usedforsecurity=False).digest() != digest:
        return None
    try:
        keys: list[str] = []
        hash_keys: list[str] = []
        records: list[bytes] = []
        for number, value in _fields(body):
            if number == 1:
                keys.append(_bytes(value).decode("utf-8"))
            elif number == 2:
                hash_keys.append(_bytes(value).decode("utf-8"))
            elif number == 3:
                records.append(_bytes(value))
        members: list[_Member] = []
        for raw in records:
            fields = dict(_fields(raw))
            hash_index = fields.get(2)
            members.append(
                _Member(
                    keys[_int(fields[1])],
                    hash_keys[_int(hash_index)] if hash_index is not None else None,
                    _bytes(fields.get(3, b"")),
                )
            )
    except (IndexError, KeyError, TypeError, ValueError):
        return None  # does not parse: the KCL passes it on as a plain record
    return members


def _fields(buffer: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value) of a protobuf message: varints as ints, length-delimited as bytes."""
    at = 0
    while at < len(buffer):
        tag, at = _varint(buffer, at)
        number, wire_type = tag >> 3, tag & 7
        if wire_type == 0:
            value, at = _varint(buffer, at)
            yield number, value
        elif wire_type == 2:
            length, at = _varint(buffer, at)
            if at + length > len(buffer):
                raise ValueError("truncated field")
            yield number, buffer[at : at + length]
            at += length
        elif wire_type in (1, 5):
            at += 8 if wire_type == 1 else 4
        else:
            raise ValueError(f"wire type {wire_type}")


def _bytes(value: int | bytes) -> bytes:
    if not isinstance(value, bytes):
        raise TypeError("a length-delimited field was expected")
    return value


def _int(value: int | bytes) -> int:
    if not isinstance(value, int):
        raise TypeError("a varint field was expected")
    return value


def _varint(buffer: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buffer[at]  # IndexError when truncated
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7


def _plain(shard_id: str, record: Mapping[str, Any]) -> KclUserRecord:
    return KclUserRecord(
        shard_id, str(record["SequenceNumber"]), None, str(record["PartitionKey"]), record["Data"]
    )


def _users(
    shard_id: str, record: Mapping[str, Any], members: Iterable[_Member]
) -> list[KclUserRecord]:
    sequence_number = str(record["SequenceNumber"])
    return [
        KclUserRecord(shard_id, sequence_number, index, member.partition_key, member.data)
        for index, member in enumerate(members)
    ]


def shards_of(client: Any, stream: str) -> list[KclShard]:
    """Every shard of the stream, open and closed, with its hash key range."""
    shards: list[KclShard] = []
    kwargs: dict[str, Any] = {"StreamName": stream}
    while True:
        page = client.list_shards(**kwargs)
        for shard in page.get("Shards", []):
            hash_range = shard["HashKeyRange"]
            shards.append(
                KclShard(
                    shard["ShardId"],
                    int(hash_range["StartingHashKey"]),
                    int(hash_range["EndingHashKey"]),
                )
            )
        token = page.get("NextToken")
        if not token:
            return shards
        kwargs = {"NextToken": token}


def records_of(client: Any, stream: str, shard_id: str) -> Iterator[Mapping[str, Any]]:
    """Every GetRecords record of the shard, from TRIM_HORIZON to its tip (its end, or a few
    empty pages at the tip)."""
    iterator: str | None = client.get_shard_iterator(
        StreamName=stream, ShardId=shard_id, ShardIteratorType="TRIM_HORIZON"
    )["ShardIterator"]
    empty_pages = 0
    while iterator is not None and empty_pages < _MAX_EMPTY_PAGES:
        page = client.get_records(ShardIterator=iterator, Limit=10_000)
        yield from page["Records"]
        iterator = page.get("NextShardIterator")
        if page["Records"]:
            empty_pages = 0
        elif page.get("MillisBehindLatest", 0) == 0:
            empty_pages += 1
