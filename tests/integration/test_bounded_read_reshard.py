"""A bounded streaming read (``max_records_per_trigger``) across a split, on kinesalite: the
driver's planner counting each batch's end, a reader per range as the tasks read them.

kinesalite says a closed shard ended only on the empty page after its last record (the page
holding that record still gives a next iterator, and is 0 ms behind): a count that stopped at
a page caught up with the tip would never find the parent finished, and its children would
never be read. The oracle is ``streamcheck``'s plain boto3 reading.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import streamcheck

from dedupe_store.clock import SystemClock
from devstack import emulators as local_stack
from devstack.spark_demo import split_a_shard
from kinesis_store.entries import put_entry
from kinesis_store.kpl import UserRecord
from kinesis_store.provisioning import create_stream
from kinesis_store.reader import KinesisReader
from spark_jobs.stream_offsets import StartingPosition, StartingPositionKind, StreamOffset
from spark_jobs.stream_planner import Budget, StreamPlanner

if TYPE_CHECKING:
    from conftest import Names

pytestmark = pytest.mark.integration

BUDGET = Budget(4, None)


def run(
    planner: StreamPlanner, reader: KinesisReader, start: StreamOffset
) -> tuple[list[list[UserRecord]], StreamOffset]:
    """Batches until the end offset is the start (Spark then runs no batch)."""
    offset, batches = start, []
    for _ in range(50):
        end = planner.latest(offset, BUDGET)
        if end.as_json() == offset.as_json():
            return batches, offset
        batches.append(
            [
                record
                for part in planner.ranges(offset, end)
                for record in reader.read_range(part.shard.shard_id, part.start, part.through)
            ]
        )
        offset = end
    raise AssertionError("the query never caught up")


def test_a_bounded_query_finishes_a_split_parent_then_reads_its_children(
    emulators: local_stack.Endpoints, names: Names
) -> None:
    # GIVEN a one-shard stream holding 6 records, read to its tail by a bounded query
    client = streamcheck.kinesis_client(emulators.kinesis)
    create_stream(client, names.stream, 1, timeout_s=30)
    client.put_records(
        StreamName=names.stream,
        Records=[put_entry(f"before-{i}", b"data") for i in range(6)],
    )
    reader = KinesisReader(client, names.stream)
    planner = StreamPlanner(
        reader,
        SystemClock(),
        starting_position=StartingPosition(StartingPositionKind.TRIM_HORIZON),
        fail_on_data_loss=True,
        margin_ms=500,
        idle_poll_ms=0,
    )
    first, offset = run(planner, reader, planner.initial())
    # WHEN the shard is split and records land on both children
    split_a_shard(client, names.stream)
    client.put_records(
        StreamName=names.stream,
        Records=[put_entry(f"child-{i}", b"data") for i in range(8)],
    )
    rest, _ = run(planner, reader, offset)
    # THEN the parent is found finished and every record read once, the parent's first
    batches = first + rest
    read = [record.partition_key for batch in batches for record in batch]
    expected = streamcheck.read_stream(client, names.stream)
    assert sorted(read) == sorted(r.partition_key for r in expected.records)
    assert len(read) == 14
    parent = "shardId-000000000000"
    parent_batches = [i for i, b in enumerate(batches) for r in b if r.shard_id == parent]
    child_batches = [i for i, b in enumerate(batches) for r in b if r.shard_id != parent]
    assert max(parent_batches) < min(child_batches)
    assert all(len(batch) <= 4 for batch in batches)  # BUDGET
