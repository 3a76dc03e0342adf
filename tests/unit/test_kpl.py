"""Our wrapper of aws-kinesis-agg: deaggregation as a KCL consumer sees it, malformed aggregates
read as the KCL reads them (AggregatorUtil.deaggregate), and never a silent drop.

Aggregated records are built with the library's own aggregator, so the round trip checks our
reading against the format the KPL writes.
"""

from __future__ import annotations

import base64
import hashlib
import importlib
import sys
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kinesis_store import kpl
from kinesis_store.errors import AggregationFormatError
from kinesis_store.kpl import MAGIC, UserRecord, arrival_ms_of, deaggregate, is_aggregated

ARRIVAL = datetime(2024, 5, 1, 12, 30, 15, 250_000, tzinfo=UTC)
ARRIVAL_MS = 1_714_566_615_250
SHARD = "shardId-000000000003"


def _import_aggregator() -> Any:
    # the library puts its own folder first on sys.path when imported: keep ours as it was
    saved = list(sys.path)
    try:
        from aws_kinesis_agg.aggregator import RecordAggregator
    finally:
        sys.path[:] = saved
    return RecordAggregator


RecordAggregator = _import_aggregator()


def aggregate(user_records: list[tuple[str, bytes, str | None]]) -> tuple[str, bytes]:
    """The (partition key, data) of one aggregated Kinesis record holding ``user_records``."""
    aggregator = RecordAggregator()
    for partition_key, data, ehk in user_records:
        assert aggregator.add_user_record(partition_key, data, explicit_hash_key=ehk) is None
    partition_key, _ehk, data = aggregator.clear_and_get().get_contents()
    return partition_key, data


def kinesis_record(partition_key: str, data: bytes, sequence_number: str = "1") -> dict[str, Any]:
    """A record as boto3's GetRecords returns it."""
    return {
        "Data": data,
        "PartitionKey": partition_key,
        "SequenceNumber": sequence_number,
        "ApproximateArrivalTimestamp": ARRIVAL,
    }


def with_digest(body: bytes) -> bytes:
    return MAGIC + body + hashlib.md5(body, usedforsecurity=False).digest()


def agg_message(partition_keys: list[str], records: list[dict[str, Any]]) -> bytes:
    message = kpl._library()[2].AggregatedRecord()
    message.partition_key_table.extend(partition_keys)
    for fields in records:
        message.records.add(**fields)
    return message.SerializeToString()


# --- round trip ---------------------------------------------------------------------------------


def test_aggregated_record_yields_each_user_record_in_order() -> None:
    # GIVEN a KPL record aggregating three user records, one with an explicit hash key
    users = [
        ("order-1", b"first", None),
        ("order-2", b"\x00\xffbinary", "170141183460469231731687303715884105728"),
        ("order-1", b"", None),  # a repeated partition key, and empty data
    ]
    partition_key, data = aggregate(users)
    # WHEN it is deaggregated
    result = list(deaggregate(SHARD, kinesis_record(partition_key, data, "4959")).records)
    # THEN each user record comes back as a KCL consumer sees it: its own key, data as bytes,
    # sub-sequence numbers 0..n-1, and an explicit hash key only where one was given
    assert result == [
        UserRecord(SHARD, "order-1", b"first", "4959", 0, None, ARRIVAL_MS),
        UserRecord(
            SHARD,
            "order-2",
            b"\x00\xffbinary",
            "4959",
            1,
            "170141183460469231731687303715884105728",
            ARRIVAL_MS,
        ),
        UserRecord(SHARD, "order-1", b"", "4959", 2, None, ARRIVAL_MS),
    ]
    assert all(user.aggregated for user in result)


def test_explicit_hash_key_of_one_record_is_not_lent_to_the_others() -> None:
    # GIVEN an aggregate whose only explicit hash key belongs to its second record
    partition_key, data = aggregate([("a", b"1", None), ("b", b"2", "42"), ("c", b"3", None)])
    # WHEN deaggregated
    result = list(deaggregate(SHARD, kinesis_record(partition_key, data)).records)
    # THEN only that record carries it (the library reports entry 0 of the table for the others)
    assert [user.explicit_hash_key for user in result] == [None, "42", None]


ehk_values = st.integers(0, 2**128 - 1).map(str)
user_record = st.tuples(
    st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=256),
    st.binary(max_size=64),
    st.none() | ehk_values,
)


@settings(max_examples=60)
@given(st.lists(user_record, min_size=1, max_size=20))
def test_round_trip_of_any_user_records(users: list[tuple[str, bytes, str | None]]) -> None:
    # GIVEN any user records the KPL can aggregate
    partition_key, data = aggregate(users)
    # WHEN deaggregated
    result = list(deaggregate(SHARD, kinesis_record(partition_key, data, "77")).records)
    # THEN exactly the same records come back, in order, numbered 0..n-1
    assert [(u.partition_key, u.data, u.explicit_hash_key) for u in result] == users
    assert [u.sub_sequence_number for u in result] == list(range(len(users)))
    assert {(u.shard_id, u.sequence_number, u.arrival_ms) for u in result} == {
        (SHARD, "77", ARRIVAL_MS)
    }


# --- raw records --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [b"plain payload", b"", MAGIC, MAGIC + b"\x00" * 16],
    ids=["plain", "empty", "magic-only", "magic-and-digest-only"],
)
def test_raw_record_comes_back_as_itself(data: bytes) -> None:
    # GIVEN a record that was not aggregated (or is too short to be)
    # WHEN deaggregated
    result = list(deaggregate(SHARD, kinesis_record("order-9", data, "12")).records)
    # THEN it comes back unchanged, as one record without a sub-sequence number
    assert result == [UserRecord(SHARD, "order-9", data, "12", None, None, ARRIVAL_MS)]
    assert not result[0].aggregated


def test_magic_with_a_bad_md5_is_a_raw_record() -> None:
    # GIVEN a record that starts with the KPL magic but whose digest does not match its body
    _, data = aggregate([("a", b"1", None), ("b", b"2", None)])
    tampered = data[:-1] + bytes([data[-1] ^ 0xFF])
    # WHEN deaggregated
    read = deaggregate(SHARD, kinesis_record("user-key", tampered))
    result = list(read.records)
    # THEN it is taken as a raw record (as the KCL does): one record, the bytes as sent
    assert len(result) == 1
    assert result[0].data == tampered
    assert result[0].partition_key == "user-key"
    assert result[0].sub_sequence_number is None
    assert not is_aggregated(tampered)
    assert is_aggregated(data)
    # AND it is no fault: any data may start with those bytes
    assert read.fault is None


# --- malformed aggregates: as the KCL reads them, and said ------------------------------------
# amazon-kinesis-client, software/amazon/kinesis/retrieval/AggregatorUtil.java deaggregate: a
# body protobuf refuses is delivered raw; a user record that cannot be read (a key index outside
# its table) ends the aggregate: the members before it are delivered, the rest dropped.


@pytest.mark.parametrize(
    "body",
    [b"\x0a\xff", b"\xff\xff\xff\xff", b"\x1a\x02\x08\x00"],
    ids=["truncated-field", "garbage", "record-without-data"],
)
def test_valid_magic_and_md5_with_a_body_protobuf_refuses_is_delivered_raw(body: bytes) -> None:
    # GIVEN a record with the magic and a matching MD5 but a body that is no aggregate (cut
    # short, garbage, a user record without its required data)
    data = with_digest(body)
    # WHEN deaggregated
    read = deaggregate(SHARD, kinesis_record("pk", data, "31"))
    # THEN the record is delivered raw, as the KCL delivers it, never an error that stops a read
    assert read.records == (UserRecord(SHARD, "pk", data, "31", None, None, ARRIVAL_MS),)
    # AND the fault is said, naming the record, so that the reader logs and counts it
    fault = read.fault
    assert fault is not None
    assert (fault.shard_id, fault.sequence_number, fault.raw) == (SHARD, "31", True)
    assert (fault.delivered, fault.dropped) == (0, 0)
    assert f"{SHARD}/31" in str(fault.error())


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        ({"partition_key_index": 5, "data": b"lost"}, "partition key index 5"),
        (
            {"partition_key_index": 0, "explicit_hash_key_index": 3, "data": b"lost"},
            "explicit hash key index 3",
        ),
    ],
    ids=["partition-key-index", "explicit-hash-key-index"],
)
def test_members_before_a_bad_key_index_are_delivered_and_the_rest_dropped(
    bad: dict[str, Any], reason: str
) -> None:
    # GIVEN an aggregate whose second of three user records names a key not in its table
    body = agg_message(
        ["order-1"],
        [
            {"partition_key_index": 0, "data": b"good"},
            bad,
            {"partition_key_index": 0, "data": b"after"},
        ],
    )
    # WHEN it is deaggregated (on today's code: AggregationFormatError on every read)
    read = deaggregate(SHARD, kinesis_record("pk", with_digest(body), "8"))
    # THEN the first user record is delivered, the bad one and the one after it are not
    assert read.records == (UserRecord(SHARD, "order-1", b"good", "8", 0, None, ARRIVAL_MS),)
    # AND the fault says so, with the shard and sequence number
    fault = read.fault
    assert fault is not None
    assert (fault.shard_id, fault.sequence_number) == (SHARD, "8")
    assert (fault.raw, fault.delivered, fault.dropped) == (False, 1, 2)
    assert reason in fault.reason


def test_an_explicit_hash_key_that_is_no_integer_ends_the_aggregate() -> None:
    # GIVEN an aggregate whose first user record has an explicit hash key the KCL cannot read
    message = kpl._library()[2].AggregatedRecord()
    message.partition_key_table.extend(["a"])
    message.explicit_hash_key_table.extend(["not-a-number"])
    message.records.add(partition_key_index=0, explicit_hash_key_index=0, data=b"x")
    message.records.add(partition_key_index=0, data=b"y")
    # WHEN deaggregated
    read = deaggregate(SHARD, kinesis_record("pk", with_digest(message.SerializeToString())))
    # THEN nothing is delivered (BigInteger refuses it before any member was kept)
    assert read.records == ()
    assert read.fault is not None
    assert (read.fault.delivered, read.fault.dropped) == (0, 2)


def test_user_record_count_counts_what_a_kcl_consumer_gets() -> None:
    # GIVEN a malformed aggregate (1 good member of 2) and a body that is no aggregate
    body = agg_message(
        ["k"], [{"partition_key_index": 0, "data": b"1"}, {"partition_key_index": 9, "data": b""}]
    )
    # WHEN their user records are counted (a streaming read's admission control)
    # THEN the count is what the KCL delivers, and it never raises
    assert kpl.user_record_count(SHARD, kinesis_record("pk", with_digest(body))) == 1
    assert kpl.user_record_count(SHARD, kinesis_record("pk", with_digest(b"\xff\xff"))) == 1


def test_aggregation_format_error_is_a_value_error() -> None:
    # GIVEN callers that handle bad input as ValueError
    # THEN a corrupt aggregate is one of those
    assert issubclass(AggregationFormatError, ValueError)


# --- arrival time -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected_ms"),
    [
        (ARRIVAL, ARRIVAL_MS),
        (1_714_566_615.25, ARRIVAL_MS),
        (1_714_566_615, 1_714_566_615_000),
        (None, 0),
        ("2024-05-01", 0),
    ],
    ids=["datetime", "epoch-float", "epoch-int", "missing", "unknown-type"],
)
def test_arrival_time_in_epoch_ms(value: object, expected_ms: int) -> None:
    # GIVEN an ApproximateArrivalTimestamp in one of the shapes clients return
    # WHEN converted
    # THEN it is epoch milliseconds (0 when unknown)
    assert arrival_ms_of(value) == expected_ms


# --- the import does not move sys.path ----------------------------------------------------------


@pytest.fixture
def fresh_library_import(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Forget the library's deaggregator so an import runs its module code again; restore after."""
    import aws_kinesis_agg

    namespace = dict(vars(kpl))
    old = sys.modules["aws_kinesis_agg.deaggregator"]
    monkeypatch.delitem(sys.modules, "aws_kinesis_agg.deaggregator")
    monkeypatch.delattr(aws_kinesis_agg, "deaggregator")
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield old
    # reload made new classes (AggregationFormatError, ...): give other tests the originals back
    vars(kpl).clear()
    vars(kpl).update(namespace)


def test_importing_kpl_leaves_sys_path_unchanged(fresh_library_import: Any) -> None:
    # GIVEN the library's deaggregator, whose import puts its folder first on sys.path
    path_before = list(sys.path)
    # WHEN our wrapper is (re)loaded and imports it afresh (on first use: an aggregate)
    importlib.reload(kpl)
    kpl.Aggregate(1024)
    # THEN the library really was imported again ...
    assert sys.modules["aws_kinesis_agg.deaggregator"] is not fresh_library_import
    # ... and sys.path is exactly as it was: nothing of ours is shadowed by the library's folder
    assert sys.path == path_before


def test_our_aggregates_read_back_through_the_librarys_own_deaggregator() -> None:
    # GIVEN user records packed by the producer's Aggregate (each with its explicit hash key)
    saved = list(sys.path)  # the library puts its own folder first on sys.path
    from aws_kinesis_agg.deaggregator import iter_deaggregate_records

    sys.path[:] = saved

    aggregate = kpl.Aggregate(1024 * 1024)
    users = [(f"key-{i}", f"data {i}".encode(), str(1000 + i)) for i in range(20)]
    for key, data, ehk in users:
        assert aggregate.add(key, data, ehk)
    entry = aggregate.entry()
    record = {
        "Data": entry["Data"],
        "PartitionKey": entry["PartitionKey"],
        "SequenceNumber": "1",
        "ApproximateArrivalTimestamp": datetime.now(UTC),
    }
    # WHEN the library a KCL-style consumer uses deaggregates the Kinesis record
    read = [r["kinesis"] for r in iter_deaggregate_records([record], data_format="Boto3")]
    # THEN it gives back exactly the user records, in order, with their keys and hash keys
    assert [
        (r["partitionKey"], base64.b64decode(r["data"]), r["explicitHashKey"]) for r in read
    ] == users
    assert [r["subSequenceNumber"] for r in read] == list(range(20))
