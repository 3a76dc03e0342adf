"""``KinesisReader`` tries a throttled read again, with backoff, and only a throttled one.

A scripted client answers each call; ``sleep`` records the waits. No sockets.
"""

from __future__ import annotations

from collections import deque
from datetime import UTC, datetime
from typing import Any

import botocore.exceptions
import pytest

from kinesis_store.positions import ShardStart
from kinesis_store.reader import KinesisReader, utc_timestamp
from producer.errors import StreamThrottledError, StreamUnavailableError

STREAM = "orders"
SHARD = {
    "ShardId": "shardId-000000000000",
    "HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": str(2**128 - 1)},
    "SequenceNumberRange": {"StartingSequenceNumber": "1"},
}
RECORD = {
    "SequenceNumber": "7",
    "ApproximateArrivalTimestamp": datetime(2026, 1, 1, tzinfo=UTC),
    "Data": b"payload",
    "PartitionKey": "order-1",
}


def error(code: str, status: int = 400) -> botocore.exceptions.ClientError:
    return botocore.exceptions.ClientError(
        {"Error": {"Code": code, "Message": code}, "ResponseMetadata": {"HTTPStatusCode": status}},
        "Test",
    )


class Scripted:
    """Each operation answers from its script, in order: an exception is raised, else returned."""

    def __init__(self, **scripts: list[Any]) -> None:
        self.scripts = {name: deque(answers) for name, answers in scripts.items()}
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def __getattr__(self, operation: str) -> Any:
        def call(**kwargs: Any) -> Any:
            self.calls.append((operation, kwargs))
            answer = self.scripts[operation].popleft()
            if isinstance(answer, Exception):
                raise answer
            return answer

        return call


def reader_over(client: Scripted, waits: list[float], **options: Any) -> KinesisReader:
    """A reader whose backoff draws the top of its jitter: the waits are the ceilings."""
    return KinesisReader(client, STREAM, sleep=waits.append, jitter=lambda: 1.0, **options)


def test_a_throttled_shard_listing_is_tried_again_after_a_backoff() -> None:
    # GIVEN ListShards throttled twice, then answered
    client = Scripted(
        list_shards=[
            error("LimitExceededException"),
            error("LimitExceededException"),
            {"Shards": [SHARD]},
        ]
    )
    waits: list[float] = []
    # WHEN the shard map is read
    shards = reader_over(client, waits).shards()
    # THEN it is, after waits of 0.4 s then 0.8 s
    assert [s.shard_id for s in shards] == ["shardId-000000000000"]
    assert waits == pytest.approx([0.4, 0.8])


def test_throttled_reads_give_up_after_the_retries_with_a_throttled_error() -> None:
    # GIVEN GetRecords throttled on every call
    client = Scripted(
        get_shard_iterator=[{"ShardIterator": "it-1"}],
        get_records=[error("ProvisionedThroughputExceededException")] * 10,
    )
    waits: list[float] = []
    reader = reader_over(client, waits, max_throttle_retries=6)
    # WHEN a shard is read
    # THEN after 7 calls (6 retries, waits doubling to a 5 s cap) the throttle is raised,
    # a retriable StreamUnavailableError, naming the shard
    with pytest.raises(
        StreamThrottledError, match="ProvisionedThroughputExceededException"
    ) as caught:
        list(reader.read_all("shardId-000000000000"))
    assert isinstance(caught.value, StreamUnavailableError)
    assert caught.value.retriable
    assert caught.value.shard_id == "shardId-000000000000"
    assert reader.get_records_calls == 7
    assert waits == pytest.approx([0.4, 0.8, 1.6, 3.2, 5.0, 5.0])


def test_a_read_refused_for_another_reason_is_not_tried_again() -> None:
    # GIVEN ListShards refused (AccessDenied): trying again would be refused again
    client = Scripted(list_shards=[error("AccessDeniedException")])
    waits: list[float] = []
    # WHEN the shard map is read
    # THEN the refusal is raised at once, with no wait
    with pytest.raises(StreamUnavailableError, match="AccessDeniedException") as caught:
        reader_over(client, waits).shards()
    assert not isinstance(caught.value, StreamThrottledError)
    assert waits == []


def test_an_expired_iterator_resumes_after_the_last_record_seen() -> None:
    # GIVEN a shard read whose iterator expires after the first page
    client = Scripted(
        get_shard_iterator=[{"ShardIterator": "it-1"}, {"ShardIterator": "it-2"}],
        get_records=[
            {"Records": [RECORD], "NextShardIterator": "it-1b", "MillisBehindLatest": 1},
            error("ExpiredIteratorException"),
            {"Records": [], "MillisBehindLatest": 0},
        ],
    )
    waits: list[float] = []
    # WHEN the whole shard is read
    records = list(reader_over(client, waits).read_all("shardId-000000000000"))
    # THEN the record is read once, and the read resumed right after it without waiting
    assert [r.partition_key for r in records] == ["order-1"]
    resumed = [kwargs for op, kwargs in client.calls if op == "get_shard_iterator"][1]
    assert resumed["ShardIteratorType"] == "AFTER_SEQUENCE_NUMBER"
    assert resumed["StartingSequenceNumber"] == "7"
    assert waits == []


def record(sequence_number: str) -> dict[str, Any]:
    return {**RECORD, "SequenceNumber": sequence_number, "PartitionKey": f"k{sequence_number}"}


def test_a_count_goes_on_after_its_page_read_ahead_though_the_iterator_expired_since() -> None:
    # GIVEN a count's first page read ahead (records 1 and 2 after record 0, the start), whose
    # next iterator has expired when the count goes on
    client = Scripted(
        get_shard_iterator=[{"ShardIterator": "at-0"}, {"ShardIterator": "after-2"}],
        get_records=[
            {
                "Records": [record("0"), record("1"), record("2")],
                "NextShardIterator": "after-2-old",
                "MillisBehindLatest": 5,
            },
            error("ExpiredIteratorException"),
            {
                "Records": [record("3"), record("4")],
                "NextShardIterator": "x",
                "MillisBehindLatest": 0,
            },
        ],
    )
    reader = reader_over(client, [])
    start = ShardStart.after("0")
    ahead = reader.read_ahead(SHARD["ShardId"], start, max_user_records=2)
    # WHEN the count of 4 records begins with it
    counted = reader.count_forward(SHARD["ShardId"], start, max_user_records=4, ahead=ahead)
    # THEN it counts on from right after the page's last record: 1 to 4, none twice
    assert (counted.user_records, counted.last and counted.last.sequence_number) == (4, "4")
    iterators = [kwargs for op, kwargs in client.calls if op == "get_shard_iterator"]
    assert [i["ShardIteratorType"] for i in iterators] == [
        "AT_SEQUENCE_NUMBER",
        "AFTER_SEQUENCE_NUMBER",
    ]
    assert iterators[1]["StartingSequenceNumber"] == "2"
    assert [kwargs["Limit"] for op, kwargs in client.calls if op == "get_records"] == [3, 2, 2]


def test_a_count_that_reaches_a_page_caught_up_with_an_open_shards_tip_stops_there() -> None:
    # GIVEN a shard holding nothing after the record a count starts after
    client = Scripted(
        get_shard_iterator=[{"ShardIterator": "at-7"}],
        get_records=[{"Records": [RECORD], "NextShardIterator": "it-2", "MillisBehindLatest": 0}],
    )
    # WHEN it is counted on from that record
    counted = reader_over(client, []).count_forward(
        SHARD["ShardId"], ShardStart.after("7"), max_user_records=10
    )
    # THEN one page says so: short of what was asked, 0 ms behind the tip
    assert (counted.user_records, counted.full, counted.ended) == (0, False, False)
    assert [op for op, _ in client.calls] == ["get_shard_iterator", "get_records"]


def test_response_timestamps_are_parsed_in_utc_as_the_same_instants_as_the_sdk_does() -> None:
    # Kinesis sends epoch seconds; anything else is botocore's to parse
    parsed = utc_timestamp(1_714_566_615.25)
    assert parsed == datetime(2024, 5, 1, 12, 30, 15, 250_000, tzinfo=UTC)
    assert parsed.tzinfo is UTC
    assert utc_timestamp(1_714_566_615) == datetime(2024, 5, 1, 12, 30, 15, tzinfo=UTC)
    assert utc_timestamp("2024-05-01T12:30:15.250Z") == parsed
