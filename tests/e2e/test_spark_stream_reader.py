"""``spark.readStream.format("keo")`` against kinesalite, on the session's local Spark.

Each query runs with ``Trigger.AvailableNow`` (it stops by itself once it has read what the
stream held when it started) into a ``foreachBatch`` that keeps each batch's rows, so a test
sees batch boundaries and a replayed batch. Waits are on the query's state, never the clock.
The oracle is ``streamcheck``'s plain boto3 reading of the stream.
One query reads through the fault proxy (throttled GetRecords, expired iterators) and serves
its read metrics on a metrics_port.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from spark_support import OUTSIDE, free_port, sample, scrape_until, visible_places
from stream_reads import QUARTER, Batches, merge, put, run_query, split

from devstack.fault_proxy import FaultProxy, FaultRule, FaultSchedule
from kinesis_store.entries import DEFAULT_MAX_RECORD_BYTES
from kinesis_store.kpl import Aggregate
from producer.wiring import Stack

pytestmark = pytest.mark.spark


def assert_in_shard_order(sink: Batches) -> None:
    """Within each shard, batch after batch, rows come in sequence order."""
    last: dict[str, tuple[int, int]] = defaultdict(lambda: (-1, -1))
    for shard, sequence_number, sub in sink.places():
        place = (int(sequence_number), sub)
        assert place > last[shard], (shard, place, last[shard])
        last[shard] = place


def test_a_streaming_read_gives_every_record_once_in_bounded_batches_and_replays_a_batch_as_it_was(
    keo: Any, settings: dict[str, str], stack: Stack, kinesis: Any, tmp_path: Path
) -> None:
    stream = stack.settings.stream
    checkpoint = tmp_path / "checkpoint"
    # GIVEN plain records on both shards, a KPL aggregate of three user records for shard 0,
    # and a stray one of a user record for shard 0 and one whose hash key is shard 1's (the
    # KCL drops it whole)
    put(kinesis, stream, [f"k{i:02d}" for i in range(24)])
    aggregate = Aggregate(DEFAULT_MAX_RECORD_BYTES)
    for key in ("agg-0", "agg-1", "agg-2"):
        assert aggregate.add(key, b"aggregated", "5")
    stray = Aggregate(DEFAULT_MAX_RECORD_BYTES)
    assert stray.add("stray-inside", b"dropped with its aggregate", "5")
    assert stray.add(OUTSIDE, b"dropped by KCL", str(2**127 + 5))
    kinesis.put_records(StreamName=stream, Records=[aggregate.entry(), stray.entry()])

    # WHEN the stream is read at most 8 records a batch
    sink = Batches()
    run_query(keo, settings, checkpoint, sink, max_records_per_trigger="8")

    # THEN every user record KCL delivers came once, in order within its shard, in batches of
    # 8 at most; the aggregate's user records with their sub-sequence numbers
    assert sorted(sink.places()) == sorted(visible_places(kinesis, stream))
    assert len(sink.places()) == 27
    assert len(sink.rows) >= 4
    assert max(len(rows) for rows in sink.rows.values()) <= 8
    assert_in_shard_order(sink)
    first_run = set(sink.rows)

    # WHEN more records arrive and the query restarts from its checkpoint
    put(kinesis, stream, [f"new-{i}" for i in range(6)])
    run_query(keo, settings, checkpoint, sink, max_records_per_trigger="8")
    # THEN it reads those, and only those
    new_batches = sorted(set(sink.rows) - first_run)
    assert sorted(row[3] for b in new_batches for row in sink.rows[b]) == [
        f"new-{i}" for i in range(6)
    ]

    # WHEN the last batch's commit is lost (a driver died before writing it), more records
    # arrive, and the query restarts: Spark replays that batch from its logged offsets
    last = max(sink.rows)
    for name in (str(last), f".{last}.crc"):
        (checkpoint / "commits" / name).unlink(missing_ok=True)
    put(kinesis, stream, [f"later-{i}" for i in range(4)])
    run_query(keo, settings, checkpoint, sink, max_records_per_trigger="8")
    # THEN the replayed batch read exactly the records it read the first time, and the new
    # records came in the batches after it
    assert sink.replayed[last] == sink.rows[last]
    assert sorted(sink.places()) == sorted(visible_places(kinesis, stream))
    assert_in_shard_order(sink)


def test_a_split_and_a_merge_between_batches_read_each_parent_to_its_end_before_its_children(
    keo: Any, settings: dict[str, str], stack: Stack, kinesis: Any, tmp_path: Path
) -> None:
    stream = stack.settings.stream
    checkpoint = tmp_path / "checkpoint"
    sink = Batches()
    # GIVEN a query that has read both shards
    put(kinesis, stream, [f"first-{i}" for i in range(8)])
    run_query(keo, settings, checkpoint, sink, max_records_per_trigger="5")
    # WHEN shard 0 gets records, is split, and its children get records; then the children
    # are merged and the merged shard gets records (shard 1 gets records all along)
    put(kinesis, stream, [f"parent-{i}" for i in range(4)], hash_key=5)
    put(kinesis, stream, [f"other-{i}" for i in range(3)], hash_key=2**127 + 5)
    parent = "shardId-000000000000"
    children = split(kinesis, stream, parent)
    put(kinesis, stream, [f"low-{i}" for i in range(3)], hash_key=5)
    put(kinesis, stream, [f"high-{i}" for i in range(3)], hash_key=QUARTER + 5)
    merged = merge(kinesis, stream, children)
    put(kinesis, stream, [f"merged-{i}" for i in range(3)], hash_key=5)
    run_query(keo, settings, checkpoint, sink, max_records_per_trigger="5")

    # THEN every record came once, in order within each shard
    assert sorted(sink.places()) == sorted(visible_places(kinesis, stream))
    assert_in_shard_order(sink)
    # AND each parent was read to its end in batches before any of its children's records
    batch_of = sink.batch_of()
    by_shard: dict[str, list[int]] = defaultdict(list)
    for place, batch_id in batch_of.items():
        by_shard[place[0]].append(batch_id)
    assert max(by_shard[parent]) < min(min(by_shard[c]) for c in children)
    assert max(max(by_shard[c]) for c in children) < min(by_shard[merged])
    assert len(by_shard[merged]) == 3


def test_a_streaming_read_under_throttles_and_expired_iterators_loses_and_repeats_nothing_and_counts_its_reads(
    keo: Any, settings: dict[str, str], stack: Stack, kinesis: Any, emulators: Any, tmp_path: Path
) -> None:
    stream = stack.settings.stream
    # GIVEN records on both shards, and Kinesis reached through a proxy that throttles some
    # GetRecords and answers some with an expired iterator, driver's and executors' alike
    put(kinesis, stream, [f"f{i:02d}" for i in range(30)])
    schedule = FaultSchedule(
        [
            FaultRule("GetRecords", "throttle", probability=0.3, limit=1),
            FaultRule("GetRecords", "expire_iterator", probability=0.3, limit=3),
        ],
        seed=7,
    )
    port = free_port()
    sink = Batches()
    with FaultProxy(emulators.kinesis, schedule) as proxy:
        faulty = {**settings, "KEO_KINESIS_ENDPOINT_URL": proxy.endpoint}
        # WHEN a query reads the stream in batches of 16 at most, counting its reads on a port
        run_query(
            keo,
            faulty,
            tmp_path / "checkpoint",
            sink,
            max_records_per_trigger="16",
            query_name="faulty-read",
            metrics_port=str(port),
        )

    # THEN faults were met, and every record came once, in order within its shard
    assert schedule.injected["GetRecords:throttle"] >= 1
    assert schedule.injected["GetRecords:expire_iterator"] >= 1
    assert sorted(sink.places()) == sorted(visible_places(kinesis, stream))
    assert len(sink.places()) == 30
    assert_in_shard_order(sink)
    # AND the metrics port serves the rows and bytes read per shard, and each shard's lag
    per_shard: dict[str, int] = defaultdict(int)
    for shard_id, *_ in sink.places():
        per_shard[shard_id] += 1

    def labels(shard_id: str) -> dict[str, str]:
        return {"query": "faulty-read", "stream": stream, "shard": shard_id}

    found = scrape_until(
        port,
        lambda found: all(
            sample(found, "keo_spark_read_records_total", **labels(s)) == n
            for s, n in per_shard.items()
        ),
    )
    for shard_id in per_shard:
        data_bytes = sample(found, "keo_spark_read_bytes_total", **labels(shard_id))
        assert data_bytes == sum(
            len(row[4]) for b in sink.rows.values() for row in b if row[0] == shard_id
        )
        assert ("keo_spark_read_millis_behind_latest", frozenset(labels(shard_id).items())) in found


def test_the_simple_reader_reads_on_the_driver_every_record_once_and_resumes_from_its_checkpoint(
    keo: Any, settings: dict[str, str], stack: Stack, kinesis: Any, tmp_path: Path
) -> None:
    stream = stack.settings.stream
    checkpoint = tmp_path / "checkpoint"
    sink = Batches()
    # GIVEN plain records and a KPL aggregate on both shards
    put(kinesis, stream, [f"s{i:02d}" for i in range(10)])
    aggregate = Aggregate(DEFAULT_MAX_RECORD_BYTES)
    for key in ("sagg-0", "sagg-1"):
        assert aggregate.add(key, b"aggregated", "5")
    kinesis.put_records(StreamName=stream, Records=[aggregate.entry()])
    # WHEN the stream is read by the simple reader (the driver reads; no task per shard)
    run_query(keo, settings, checkpoint, sink, simple_reader="true")
    # THEN every user record came once, in order within its shard
    assert sorted(sink.places()) == sorted(visible_places(kinesis, stream))
    assert len(sink.places()) == 12
    assert_in_shard_order(sink)
    # WHEN more records arrive and the query restarts from its checkpoint
    put(kinesis, stream, [f"snew-{i}" for i in range(3)])
    before = set(sink.rows)
    run_query(keo, settings, checkpoint, sink, simple_reader="true")
    # THEN it reads those, and only those
    new_rows = [row[3] for b in sorted(set(sink.rows) - before) for row in sink.rows[b]]
    assert sorted(new_rows) == [f"snew-{i}" for i in range(3)]
