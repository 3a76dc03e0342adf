"""What a KCL consumer gets of a shard, wherever keo decides it: the KCL's whole-or-nothing rule
for an aggregate that strays outside its shard's hash range, and its reading of a malformed
aggregate (the members before the fault, or the record raw), logged, counted, never a read
stuck on it.

The rules are the KCL's (amazon-kinesis-client, software/amazon/kinesis/retrieval/
AggregatorUtil.java ``deaggregate``; KCL 1.x ``UserRecord.deaggregate``). Records are put on a
:class:`tests.fakes.kinesis.FakeKinesisClient` of two shards (LOW, HIGH) and read back by the
real :class:`kinesis_store.reader.KinesisReader`: the audit (both modes), the read-back of
both modes and the streaming read's rows each meet a stray and a malformed aggregate.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

import pytest
from fakes.kinesis import FakeKinesisClient

from dedupe_store.clock import ManualClock
from dedupe_store.records import LedgerRecord
from dedupe_store.states import LedgerState
from kinesis_store import kpl
from kinesis_store.errors import AggregationFormatError
from kinesis_store.kpl import MAGIC, MalformedAggregate, UserRecord
from kinesis_store.positions import ShardStart
from kinesis_store.reader import KinesisReader, stop_on_malformed
from kinesis_store.shards import Shard, kcl_view
from producer import metrics
from producer.audit.rows import ExpectedRow, RowAnomaly
from producer.audit.stream import Anomaly, audit_rows, audit_stream
from producer.key.decisions import Resolution
from producer.key.readback import ReadBackResolver
from producer.protocol import LeasePolicy, Message, prepare
from producer.replay.readback import read_rows

STREAM = "orders"
HALF = 2**127
LOW = Shard("shardId-000000000000", 0, HALF - 1, None, None, "1", None)
LEASE = LeasePolicy(lease_ms=60_000, put_timeout_ms=7_000, skew_ms=5_000)


def member(index: int, hash_key: int, *, ehk: bool = True) -> UserRecord:
    return UserRecord(
        LOW.shard_id, f"k{index}", b"d", "77", index, str(hash_key) if ehk else None, 0
    )


def raw(sequence_number: str) -> UserRecord:
    return UserRecord(LOW.shard_id, "raw", b"d", sequence_number, None, None, 0)


# --- the rule, on records as the reader gives them ------------------------------------------


def test_an_aggregate_with_one_member_outside_the_shard_is_dropped_whole() -> None:
    # GIVEN an aggregate read from LOW whose second member hashes into HIGH, between raw records
    records = [raw("1"), member(0, 5), member(1, HALF + 5), member(2, 7), raw("99")]
    # WHEN a KCL consumer of LOW reads them
    seen = list(kcl_view(records, LOW))
    # THEN the raw records are delivered and every member of the aggregate is dropped, even
    # those inside LOW's range (today: k0 and k2 counted as delivered)
    assert seen == [
        (raw("1"), True),
        (member(0, 5), False),
        (member(1, HALF + 5), False),
        (member(2, 7), False),
        (raw("99"), True),
    ]


def test_aggregates_inside_the_shard_are_delivered_and_judged_one_by_one() -> None:
    # GIVEN two aggregates one after the other: one inside LOW, then one straying out of it
    inside = [member(0, 5), member(1, 9)]
    stray = [
        UserRecord(LOW.shard_id, "s0", b"", "78", 0, str(HALF), 0),
        UserRecord(LOW.shard_id, "s1", b"", "78", 1, "3", 0),
    ]
    # WHEN judged
    seen = list(kcl_view([*inside, *stray], LOW))
    # THEN the first is delivered whole, the second dropped whole
    assert [delivered for _, delivered in seen] == [True, True, False, False]


def test_a_member_without_an_explicit_hash_key_is_routed_by_its_partition_key() -> None:
    # GIVEN a member with no explicit hash key, whose key's MD5 is in the upper half
    key = next(f"key-{i}" for i in range(100) if _md5(f"key-{i}") >= HALF)
    record = UserRecord(LOW.shard_id, key, b"", "5", 0, None, 0)
    # THEN a KCL consumer of LOW does not get it
    assert list(kcl_view([record], LOW)) == [(record, False)]


# --- the stream: a stray aggregate and a malformed one, read back -------------------------------


def _md5(key: str) -> int:
    return int.from_bytes(hashlib.md5(key.encode(), usedforsecurity=False).digest())


def _keys(count: int, *, low: bool) -> list[str]:
    found = (f"key-{i}" for i in range(10_000) if (_md5(f"key-{i}") < HALF) == low)
    return [next(found) for _ in range(count)]


def _put(client: FakeKinesisClient, entry: dict[str, Any]) -> None:
    answer = client.put_records(Records=[entry], StreamName=STREAM)
    assert answer["FailedRecordCount"] == 0


def _put_stray_aggregate(client: FakeKinesisClient, inside: str, outside: str) -> None:
    """An aggregate of ``inside`` (routes to LOW) then ``outside`` (routes to HIGH), put as the
    KPL puts it: routed by its first member, so it lands on LOW (a stale shard map)."""
    aggregate = kpl.Aggregate(1024 * 1024)
    for key in (inside, outside):
        assert aggregate.add(key, f"data {key}".encode(), str(_md5(key)))
    _put(client, aggregate.entry())


def _malformed_body(good_key: str) -> bytes:
    """An aggregate body whose second user record names a partition key not in its table."""
    message = kpl._library()[2].AggregatedRecord()
    message.partition_key_table.extend([good_key])
    message.records.add(partition_key_index=0, data=f"data {good_key}".encode())
    message.records.add(partition_key_index=7, data=b"lost")
    body = message.SerializeToString()
    return MAGIC + body + hashlib.md5(body, usedforsecurity=False).digest()


def _put_malformed_aggregate(client: FakeKinesisClient, good_key: str) -> None:
    _put(
        client,
        {
            "Data": _malformed_body(good_key),
            "PartitionKey": "aggregate",
            "ExplicitHashKey": str(_md5(good_key)),
        },
    )


def _put_raw(client: FakeKinesisClient, key: str) -> None:
    _put(client, {"Data": f"data {key}".encode(), "PartitionKey": key})


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def client(clock: ManualClock) -> FakeKinesisClient:
    return FakeKinesisClient(stream=STREAM, clock=clock, shard_count=2)


def _counter(counter: Any, *labels: str) -> float:
    return float(counter.labels(*labels)._value.get())


def test_the_reader_reads_a_malformed_aggregate_as_the_kcl_logs_and_counts_it(
    client: FakeKinesisClient, caplog: pytest.LogCaptureFixture
) -> None:
    # GIVEN a malformed aggregate (1 good member, then a bad partition key index) and a record
    good, after = _keys(2, low=True)
    _put_malformed_aggregate(client, good)
    _put_raw(client, after)
    faults: list[MalformedAggregate] = []
    reader = KinesisReader(client, STREAM, on_malformed=faults.append)
    # WHEN the shard is read (today: AggregationFormatError on every read, for good)
    with caplog.at_level(logging.WARNING, logger="kinesis_store.reader"):
        records = list(reader.read_all(LOW.shard_id))
    # THEN the member before the fault is delivered, then the read goes on past the record
    assert [(r.partition_key, r.sub_sequence_number) for r in records] == [
        (good, 0),
        (after, None),
    ]
    # AND the fault is logged with shard and sequence number, counted, and handed on
    assert [(f.delivered, f.dropped, f.raw) for f in faults] == [(1, 1, False)]
    sequence_number = records[0].sequence_number
    assert f"shard={LOW.shard_id} sequence_number={sequence_number}" in caplog.text
    assert reader.shard_reads(LOW.shard_id).malformed_aggregates == 1


def test_a_reader_told_to_stop_at_a_malformed_aggregate_stops_before_its_members(
    client: FakeKinesisClient,
) -> None:
    # GIVEN a malformed aggregate, and a reader that must not go past one
    (good,) = _keys(1, low=True)
    _put_malformed_aggregate(client, good)
    reader = KinesisReader(client, STREAM, on_malformed=stop_on_malformed)
    # WHEN the shard is read
    # THEN the read stops at it, naming it, and gave out none of its members
    records: list[UserRecord] = []
    with pytest.raises(AggregationFormatError, match=LOW.shard_id):
        records.extend(reader.read_all(LOW.shard_id))
    assert records == []


def test_the_audit_counts_the_members_of_a_stray_aggregate_as_missing(
    client: FakeKinesisClient,
) -> None:
    # GIVEN an aggregate of a key of LOW and a key of HIGH that landed on LOW, and a raw record
    (inside, plain), (outside,) = _keys(2, low=True), _keys(1, low=False)
    _put_stray_aggregate(client, inside, outside)
    _put_raw(client, plain)
    before = _counter(metrics.READ_DROPPED, STREAM, metrics.DROPPED_OUTSIDE_SHARD)
    # WHEN the stream is audited against the keys sent
    report = audit_stream(KinesisReader(client, STREAM), None, expected=[inside, outside, plain])
    # THEN neither member is delivered, as a KCL consumer sees it (today: `inside` counted)
    assert report.count(Anomaly.EXPECTED_MISSING) == 2
    assert set(report.expected_missing) == {inside, outside}
    assert report.dropped_by_kcl == 2
    assert report.user_records == 1
    assert _counter(metrics.READ_DROPPED, STREAM, metrics.DROPPED_OUTSIDE_SHARD) == before + 2


def test_the_audit_moves_past_a_malformed_aggregate_and_counts_it(
    client: FakeKinesisClient,
) -> None:
    # GIVEN a malformed aggregate, then a raw record, on LOW
    good, after = _keys(2, low=True)
    _put_malformed_aggregate(client, good)
    _put_raw(client, after)
    # WHEN the stream is audited (both modes; today: AggregationFormatError)
    report = audit_stream(KinesisReader(client, STREAM), None, expected=[good, after])
    rows = audit_rows(
        KinesisReader(client, STREAM),
        [ExpectedRow(key, f"data {key}".encode()) for key in (good, after, "lost-key")],
    )
    # THEN the member before the fault and the record after it are delivered
    assert report.count(Anomaly.EXPECTED_MISSING) == 0
    assert report.user_records == 2
    assert rows.count(RowAnomaly.MISSING) == 1  # "lost-key": not in the stream at all
    # AND the malformed aggregate is counted in both reports
    assert report.malformed_aggregates == 1
    assert rows.totals["malformed_aggregates"] == 1
    assert "malformed aggregates: 1" in report.summary()


def test_read_back_does_not_find_a_member_of_a_stray_aggregate(
    client: FakeKinesisClient, clock: ManualClock
) -> None:
    # GIVEN a claim of a key of LOW whose put went out in an aggregate that strayed onto LOW
    (inside,), (outside,) = _keys(1, low=True), _keys(1, low=False)
    claimed_at_ms = clock.now_ms()
    _put_stray_aggregate(client, inside, outside)
    (prepared,), _ = prepare([Message(inside, f"data {inside}".encode())], 1024 * 1024)
    claim = LedgerRecord(
        stream=STREAM,
        key=inside,
        state=LedgerState.IN_FLIGHT,
        attempt=1,
        owner="producer-a",
        claimed_at_ms=claimed_at_ms,
        payload_digest=prepared.payload_digest,
        routing_hash_key=prepared.explicit_hash_key,
        lease_expires_at_ms=claimed_at_ms + LEASE.lease_ms,
    )
    clock.advance(LEASE.lease_ms + 60_000)  # the lease is over for every clock
    resolver = ReadBackResolver(KinesisReader(client, STREAM), clock, LEASE, retention_hours=24)
    # WHEN the claim is read back
    result = resolver.resolve([claim])[inside]
    # THEN its put is not found: a KCL consumer never gets it, so it must be sent again
    # (today: FOUND, and the key counted as delivered)
    assert result.resolution is Resolution.NOT_FOUND


def test_replay_read_back_does_not_find_a_row_of_a_stray_aggregate(
    client: FakeKinesisClient, clock: ManualClock
) -> None:
    # GIVEN an earlier attempt's rows, put in an aggregate that strayed onto LOW
    (inside,), (outside,) = _keys(1, low=True), _keys(1, low=False)
    start_ms = clock.now_ms()
    _put_stray_aggregate(client, inside, outside)
    items, _ = prepare(
        [Message(key, f"data {key}".encode()) for key in (inside, outside)], 1024 * 1024
    )
    clock.advance(1_000)
    # WHEN a recovery reads the window back
    found = read_rows(
        KinesisReader(client, STREAM), clock, items, (start_ms, clock.now_ms()), excluding=set()
    )
    # THEN neither row is found, so both are sent again (today: `inside` found, not resent)
    assert found.positions == [None, None]


def test_replay_read_back_moves_past_a_malformed_aggregate(
    client: FakeKinesisClient, clock: ManualClock
) -> None:
    # GIVEN an earlier attempt's row in a malformed aggregate (before its fault), and one after
    good, after = _keys(2, low=True)
    start_ms = clock.now_ms()
    _put_malformed_aggregate(client, good)
    _put_raw(client, after)
    items, _ = prepare([Message(key, f"data {key}".encode()) for key in (good, after)], 1 << 20)
    clock.advance(1_000)
    # WHEN a recovery reads the window back (today: AggregationFormatError, every time)
    found = read_rows(
        KinesisReader(client, STREAM), clock, items, (start_ms, clock.now_ms()), excluding=set()
    )
    # THEN both are found: the member before the fault is delivered, as the KCL delivers it
    assert all(position is not None for position in found.positions)


def test_the_streaming_reads_rows_skip_a_stray_aggregate_and_move_past_a_malformed_one(
    client: FakeKinesisClient,
) -> None:
    pytest.importorskip("pyarrow")
    from spark_jobs.read_rows import malformed_aggregate_policy, rows_of

    # GIVEN on LOW: a stray aggregate, a malformed aggregate, then a raw record
    (inside, good, after), (outside,) = _keys(3, low=True), _keys(1, low=False)
    _put_stray_aggregate(client, inside, outside)
    _put_malformed_aggregate(client, good)
    _put_raw(client, after)
    before = _counter(metrics.MALFORMED_AGGREGATES, STREAM)

    def read(*, fail: bool) -> Any:
        reader = KinesisReader(
            client, STREAM, on_malformed=malformed_aggregate_policy(fail, STREAM)
        )
        return reader.read_range(LOW.shard_id, ShardStart.trim_horizon(), None)

    # WHEN the streaming read's rows are made of the shard (the default: go on)
    filtered = list(rows_of(read(fail=False), LOW, kcl_filter=True))
    unfiltered = list(rows_of(read(fail=False), LOW, kcl_filter=False))
    # THEN the stray aggregate gives no row, the malformed one its member before the fault,
    # and the read goes on past it (today: AggregationFormatError at every retry of the batch)
    assert [row[0] for row in filtered] == [good, after]
    # AND unfiltered, both members of the stray aggregate are marked as not visible to KCL
    assert [(row[0], row[-1]) for row in unfiltered] == [
        (inside, False),
        (outside, False),
        (good, True),
        (after, True),
    ]
    assert _counter(metrics.MALFORMED_AGGREGATES, STREAM) == before + 2
    # AND with fail_on_malformed_aggregate the read stops at it instead
    with pytest.raises(AggregationFormatError):
        list(rows_of(read(fail=True), LOW, kcl_filter=True))
