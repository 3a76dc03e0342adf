"""The quota mode's Kinesis layer (devstack.quota_proxy) against kinesalite: each quota throttles
at its figure, as AWS answers past it, and a throttled record is never written.

The proxy's buckets read a clock the test moves, so every figure is exact: nothing here
depends on how fast the machine is. The client's retries are off: each call is one attempt.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import streamcheck
from botocore.config import Config
from botocore.exceptions import ClientError
from streamcheck import StepClock

from devstack.quota_proxy import KinesisQuotaProxy
from devstack.quotas import MIB
from kinesis_store.provisioning import create_stream

pytestmark = pytest.mark.integration

ONE_ATTEMPT = Config(retries={"total_max_attempts": 1, "mode": "standard"})


@pytest.fixture
def clock() -> StepClock:
    return StepClock()


@pytest.fixture
def proxy(emulators: Any, clock: StepClock) -> Iterator[KinesisQuotaProxy]:
    with KinesisQuotaProxy(emulators.kinesis, monotonic=clock) as running:
        yield running


@pytest.fixture
def client(proxy: KinesisQuotaProxy) -> Any:
    """A boto3 client through the proxy, one attempt a call."""
    return streamcheck.kinesis_client(proxy.endpoint, ONE_ATTEMPT)


@pytest.fixture
def direct(emulators: Any) -> Any:
    """A boto3 client on kinesalite itself: the test's view of what was written."""
    return streamcheck.kinesis_client(emulators.kinesis)


def _stream(direct: Any, names: Any, shards: int = 1) -> str:
    create_stream(direct, names.stream, shards, timeout_s=30)
    return str(names.stream)


def _entries(count: int, prefix: str, size: int = 10) -> list[dict[str, Any]]:
    return [{"PartitionKey": f"{prefix}{i:05d}", "Data": b"x" * size} for i in range(count)]


def _refused(answer: dict[str, Any]) -> list[int]:
    return [
        i
        for i, r in enumerate(answer["Records"])
        if r.get("ErrorCode") == "ProvisionedThroughputExceededException"
    ]


def _throttle_code(call: Any) -> str:
    with pytest.raises(ClientError) as refused:
        call()
    return str(refused.value.response["Error"]["Code"])


def test_a_shard_takes_1000_records_a_second_and_refuses_the_rest_unwritten(
    client: Any, direct: Any, names: Any, clock: StepClock
) -> None:
    # GIVEN a stream of one shard
    stream = _stream(direct, names)
    # WHEN 1,500 records are put within one second (three requests of 500)
    answers = [
        client.put_records(StreamName=stream, Records=_entries(500, f"k{n}-")) for n in range(3)
    ]
    # THEN the first 1,000 are written, the last 500 refused each in its place, with AWS's code
    # and message, and nothing of them in the stream
    assert [len(_refused(a)) for a in answers] == [0, 0, 500]
    assert answers[2]["FailedRecordCount"] == 500
    assert answers[2]["Records"][0]["ErrorMessage"].startswith(
        f"Rate exceeded for shard shardId-000000000000 in stream {stream}"
    )
    assert len(streamcheck.read_stream(direct, stream).records) == 1000
    # AND half a second later, half a second's worth is written again
    clock.advance(0.5)
    again = client.put_records(StreamName=stream, Records=_entries(500, "later-") * 1)
    assert len(_refused(again)) == 0
    more = client.put_records(StreamName=stream, Records=_entries(1, "one-more-"))
    assert len(_refused(more)) == 1
    assert len(streamcheck.read_stream(direct, stream).records) == 1500


def test_a_shard_takes_1_mib_a_second_counting_data_and_partition_keys(
    client: Any, direct: Any, names: Any
) -> None:
    # GIVEN a stream of one shard, and records of 100 KiB of data and a 9-byte key each
    stream = _stream(direct, names)
    records = _entries(12, "big-", size=100 * 1024)
    per_record = 100 * 1024 + len("big-00000")
    # WHEN they are put at once
    answer = client.put_records(StreamName=stream, Records=records)
    # THEN as many as fit in 1 MiB are written, in order, and the rest refused
    fits = MIB // per_record
    assert fits == 10
    assert _refused(answer) == [10, 11]
    written = streamcheck.read_stream(direct, stream).records
    assert sorted(r.partition_key for r in written) == [f"big-{i:05d}" for i in range(fits)]


def test_each_shard_has_its_own_write_quota(client: Any, direct: Any, names: Any) -> None:
    # GIVEN a stream of two shards, and 1,000 records routed to the first by explicit hash key
    stream = _stream(direct, names, shards=2)
    low = [{**entry, "ExplicitHashKey": "1"} for entry in _entries(500, "low-")]
    for _ in range(2):
        assert _refused(client.put_records(StreamName=stream, Records=low)) == []
    # WHEN more records go to each shard
    high = [{**entry, "ExplicitHashKey": str(2**127 + 1)} for entry in _entries(10, "high-")]
    mixed = client.put_records(StreamName=stream, Records=[low[0], *high])
    # THEN the first shard refuses its record, the second writes its own
    assert _refused(mixed) == [0]
    assert {r["ShardId"] for r in mixed["Records"][1:]} == {"shardId-000000000001"}


def test_put_record_over_the_quota_is_refused_whole(client: Any, direct: Any, names: Any) -> None:
    stream = _stream(direct, names)
    for _ in range(2):
        client.put_records(StreamName=stream, Records=_entries(500, "fill-"))
    code = _throttle_code(lambda: client.put_record(StreamName=stream, PartitionKey="k", Data=b"x"))
    assert code == "ProvisionedThroughputExceededException"
    assert len(streamcheck.read_stream(direct, stream).records) == 1000


def test_get_records_takes_5_calls_a_second_per_shard(
    client: Any, direct: Any, names: Any, clock: StepClock
) -> None:
    # GIVEN a stream of one shard, read through the proxy
    stream = _stream(direct, names)
    iterator = client.get_shard_iterator(
        StreamName=stream, ShardId="shardId-000000000000", ShardIteratorType="TRIM_HORIZON"
    )["ShardIterator"]
    # WHEN it is read 6 times within a second
    for _ in range(5):
        iterator = client.get_records(ShardIterator=iterator)["NextShardIterator"]
    # THEN the sixth call is throttled, and a second later it is served
    code = _throttle_code(lambda: client.get_records(ShardIterator=iterator))
    assert code == "ProvisionedThroughputExceededException"
    clock.advance(1.0)
    client.get_records(ShardIterator=iterator)


def test_a_read_past_2_mib_owes_the_shard_until_the_rate_pays_it_back(
    client: Any, direct: Any, names: Any, clock: StepClock
) -> None:
    # GIVEN a shard holding 3 records of 1,000,000 bytes (put a second apart: 1 MiB/s)
    stream = _stream(direct, names)
    for i in range(3):
        entry = {"PartitionKey": f"mb-{i}", "Data": b"m" * 1_000_000}
        assert _refused(client.put_records(StreamName=stream, Records=[entry])) == []
        clock.advance(1.0)
    iterator = client.get_shard_iterator(
        StreamName=stream, ShardId="shardId-000000000000", ShardIteratorType="TRIM_HORIZON"
    )["ShardIterator"]
    # WHEN one call reads all three (about 3 MB: 1 MB more than a second's 2 MiB)
    page = client.get_records(ShardIterator=iterator)
    assert len(page["Records"]) == 3
    owed_s = (3 * (1_000_000 + len("mb-0")) - 2 * MIB) / (2 * MIB)
    # THEN the shard refuses reads until the rate has paid back what was read beyond it
    clock.advance(owed_s * 0.9)
    next_iterator = page["NextShardIterator"]
    code = _throttle_code(lambda: client.get_records(ShardIterator=next_iterator))
    assert code == "ProvisionedThroughputExceededException"
    clock.advance(owed_s * 0.2)
    client.get_records(ShardIterator=next_iterator)


def test_get_shard_iterator_takes_5_calls_a_second_per_shard(
    client: Any, direct: Any, names: Any, clock: StepClock
) -> None:
    stream = _stream(direct, names, shards=2)

    def ask(shard: str) -> Any:
        return client.get_shard_iterator(
            StreamName=stream, ShardId=shard, ShardIteratorType="LATEST"
        )

    for _ in range(5):
        ask("shardId-000000000000")
    assert _throttle_code(lambda: ask("shardId-000000000000")) == (
        "ProvisionedThroughputExceededException"
    )
    ask("shardId-000000000001")  # another shard: its own quota
    clock.advance(0.2)
    ask("shardId-000000000000")  # a fifth of a second: one call more


def test_describe_stream_summary_takes_20_calls_a_second_for_the_account(
    client: Any, direct: Any, names: Any, proxy: KinesisQuotaProxy
) -> None:
    # GIVEN two streams
    first = _stream(direct, names)
    second = direct.create_stream(StreamName=f"{first}-2", ShardCount=1)
    assert second is not None
    # WHEN DescribeStreamSummary is called 20 times on one, then on the other
    for _ in range(20):
        client.describe_stream_summary(StreamName=first)
    # THEN the account's 21st call is refused as AWS refuses it, whichever the stream
    code = _throttle_code(lambda: client.describe_stream_summary(StreamName=f"{first}-2"))
    assert code == "LimitExceededException"
    # AND the proxy's report says so, for any process that asks
    report = httpx.get(f"{proxy.endpoint}/__keo/report", timeout=5).json()
    assert report["quotas"]["calls"]["DescribeStreamSummary"] == 21
    assert report["quotas"]["throttles"] == {"DescribeStreamSummary": 1}
    assert report["received"]["DescribeStreamSummary"] == 21
