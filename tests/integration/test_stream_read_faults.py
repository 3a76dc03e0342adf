"""The streaming read's reader under throttled GetRecords and expired iterators, over HTTP:
kinesalite behind the fault proxy, which answers some GetRecords with
``ProvisionedThroughputExceededException`` and some with ``ExpiredIteratorException`` (a
seeded schedule). Every record comes once, in order: a throttled page is asked for again, an
expired iterator is renewed right after the last record read. The oracle is ``streamcheck``'s
plain boto3 reading, straight from kinesalite. No sleeps: the reader's are recorded.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest
import streamcheck
from botocore.config import Config

from devstack import emulators as local_stack
from devstack.fault_proxy import FaultProxy, FaultRule, FaultSchedule
from kinesis_store.entries import put_entry
from kinesis_store.positions import ShardStart
from kinesis_store.provisioning import create_stream
from kinesis_store.read_pacing import ReadPacer
from kinesis_store.reader import KinesisReader

if TYPE_CHECKING:
    from conftest import Names

pytestmark = pytest.mark.integration

RECORDS = 60
PAGE = 4  # records a GetRecords call asks for: many pages, so faults land mid-read


@pytest.fixture
def stream(emulators: local_stack.Endpoints, names: Names) -> str:
    """Two shards holding RECORDS records, put straight into kinesalite."""
    client = streamcheck.kinesis_client(emulators.kinesis)
    create_stream(client, names.stream, 2, timeout_s=30)
    entries = [put_entry(f"k{i:03d}", f"data {i}".encode()) for i in range(RECORDS)]
    client.put_records(StreamName=names.stream, Records=entries)
    return names.stream


@pytest.fixture
def proxy(emulators: local_stack.Endpoints) -> Iterator[FaultProxy]:
    schedule = FaultSchedule(
        [
            FaultRule("GetRecords", "throttle", probability=0.25, limit=6),
            FaultRule("GetRecords", "expire_iterator", probability=0.25, limit=4),
        ],
        seed=24,
    )
    with FaultProxy(emulators.kinesis, schedule) as proxy:
        yield proxy


def faulty_client(endpoint: str) -> Any:
    """Through the proxy, with the SDK's retries off: the reader's own are under test."""
    return streamcheck.kinesis_client(
        endpoint, Config(retries={"total_max_attempts": 1, "mode": "standard"})
    )


class Waits:
    """The reader's sleeps, kept, and a clock they move: the pacer runs on it."""

    def __init__(self) -> None:
        self.now_s = 0.0
        self.slept: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now_s += seconds


def test_a_range_read_through_throttles_and_expired_iterators_gives_every_record_once(
    emulators: local_stack.Endpoints, stream: str, proxy: FaultProxy
) -> None:
    # GIVEN each shard's records as the oracle reads them, and a paced reader whose
    # GetRecords go through the fault proxy
    expected = streamcheck.read_stream(streamcheck.kinesis_client(emulators.kinesis), stream)
    waits = Waits()
    reader = KinesisReader(
        faulty_client(proxy.endpoint),
        stream,
        sleep=waits.sleep,
        page_limit=PAGE,
        pacer=ReadPacer(clock=lambda: waits.now_s, sleep=waits.sleep),
        jitter=lambda: 0.5,
    )

    # WHEN each shard is read from its start through its last record, as a task reads a
    # batch's range
    read = []
    for shard in reader.shards():
        last = [r for r in expected.records if r.shard_id == shard.shard_id][-1]
        read.extend(
            reader.read_range(shard.shard_id, ShardStart.trim_horizon(), last.sequence_number)
        )

    # THEN throttles and expiries were met, and every record came once, in shard order
    assert proxy.schedule.injected["GetRecords:throttle"] >= 1
    assert proxy.schedule.injected["GetRecords:expire_iterator"] >= 1
    places = [(r.shard_id, r.sequence_number) for r in read]
    assert places == [(r.shard_id, r.sequence_number) for r in expected.records]
    assert len(places) == RECORDS
    # AND the reader paced its calls (0.2 s a shard's call) and backed off each throttle
    assert waits.slept
    assert sum(reader.shard_reads(s.shard_id).records for s in reader.shards()) >= RECORDS
