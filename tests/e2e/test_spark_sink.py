"""The Spark sink on a real local Spark against the real emulators.

Each test gets its own stream and ledger table; the SparkSession is shared (tests/e2e/conftest.py).
The stream is read back with plain boto3 calls (tests/integration/streamcheck.py), never with the
product's reader, so a reader bug cannot hide a duplicate.
"""

from __future__ import annotations

import argparse
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from threading import Barrier
from typing import Any

import pytest
from spark_support import (
    assert_binary_rows_arrived,
    assert_exactly_these,
    batch_complete,
    events,
    frame,
    free_port,
    payloads,
    plant_unverifiable,
    sample,
    scrape_until,
    streamcheck,
    write_event_files,
)

from devstack.failpoints import Failpoints
from devstack.fault_proxy import FaultProxy
from producer.errors import UnresolvedKeysError
from producer.hooks import NO_HOOKS
from producer.protocol import Message
from producer.wiring import Stack
from spark_jobs.dead_letters import (
    DEAD_LETTER_SCHEMA,
    PART_FILE,
    DeadLetter,
    DeadLetterWriter,
    HadoopFolders,
)
from spark_jobs.produce_stream import start_query
from spark_jobs.sink import ExactlyOnceSink
from spark_jobs.writer import BatchReport, PartitionReport

pytestmark = [pytest.mark.spark, pytest.mark.spark35]


# --- (1) a batch is delivered exactly once ----------------------------------------------------


def test_a_batch_is_delivered_exactly_once(
    spark: Any, settings: dict[str, str], stack: Stack, kinesis: Any
) -> None:
    # GIVEN 200 rows in two partitions
    rows = events(200)
    sink = ExactlyOnceSink(settings, query_id="q-static")

    # WHEN they are written as batch 0
    report = sink.write_batch(frame(spark, rows), 0)

    # THEN every key is in the stream once, where the ledger says, and the batch is COMPLETE
    assert report.counts == {
        "sent": 200,
        "duplicates": 0,
        "conflicts": 0,
        "rejected": 0,
        "unresolved": 0,
    }
    contents = streamcheck.read_stream(kinesis, stack.settings.stream)
    streamcheck.assert_exactly_once(
        contents, [k for k, _ in rows], stack.ledger, payloads=payloads(rows)
    )
    streamcheck.assert_only(contents, [k for k, _ in rows])
    assert batch_complete(stack, "q-static", 0)


def test_a_batch_checks_the_stream_and_the_table_once_on_the_driver_not_in_each_task(
    spark: Any, settings: dict[str, str], stack: Stack, emulators: Any
) -> None:
    # (key mode's tasks here; replay mode's in test_spark_datasource.py: one TaskWriter, either mode)
    # GIVEN Kinesis and DynamoDB behind counting proxies, and a batch of 4 partitions
    with (
        FaultProxy(emulators.kinesis) as kinesis_proxy,
        FaultProxy(emulators.dynamodb) as ledger_proxy,
    ):
        proxied = {
            **settings,
            "KEO_KINESIS_ENDPOINT_URL": kinesis_proxy.endpoint,
            "KEO_DYNAMODB_ENDPOINT_URL": ledger_proxy.endpoint,
        }
        sink = ExactlyOnceSink(proxied, query_id="q-control", dedupe="key")
        # WHEN it is written
        rows = spark.createDataFrame(events(40), "key string, data string").repartition(4)
        report = sink.write_batch(rows, 0)
    # THEN the driver described the stream and checked the table once; its tasks, in every
    # Python worker, built clients and asked neither
    assert report.counts["sent"] == 40
    assert kinesis_proxy.received["DescribeStreamSummary"] == 1
    assert ledger_proxy.received["DescribeTable"] == 1
    assert stack.settings.stream == sink.stream


def test_binary_data_and_routing_keys_are_sent_as_given(
    spark: Any, settings: dict[str, str], stack: Stack, kinesis: Any
) -> None:
    # GIVEN binary data and a routing key column
    rows = [(f"b{i}", bytes([i, 0, 255]), "tenant-a") for i in range(20)]
    binary = frame(spark, rows, "id string, body binary, tenant string")
    sink = ExactlyOnceSink(
        settings,
        key_column="id",
        data_column="body",
        routing_key_column="tenant",
        query_id="q-binary",
    )

    # WHEN written
    sink.write_batch(binary, 0)

    # THEN the bytes arrive unchanged, all on the routing key's shard
    assert_binary_rows_arrived(kinesis, stack, rows)


# --- (2) replays add nothing ------------------------------------------------------------------


def test_a_replayed_batch_adds_nothing(
    spark: Any, settings: dict[str, str], stack: Stack, kinesis: Any
) -> None:
    # GIVEN batch 0 delivered
    rows = events(200)
    batch = frame(spark, rows)
    sink = ExactlyOnceSink(settings, query_id="q-replay")
    sink.write_batch(batch, 0)

    # WHEN the same batch is replayed with the same batch id
    replay = sink.write_batch(batch, 0)

    # THEN the batch ledger skips it without any per-key work
    assert replay.skipped
    assert sum(replay.counts.values()) == 0

    # WHEN the same rows come again under another batch id
    again = sink.write_batch(batch, 1)

    # THEN every row is a DUPLICATE, and the stream still holds each key once
    assert again.counts["duplicates"] == 200
    assert again.counts["sent"] == 0
    contents = streamcheck.read_stream(kinesis, stack.settings.stream)
    assert len(contents.records) == 200
    streamcheck.assert_exactly_once(contents, [k for k, _ in rows], stack.ledger)


# --- (3) two tasks on the same partition ------------------------------------------------------


def test_two_tasks_writing_the_same_partition_deliver_each_key_once(
    spark: Any, settings: dict[str, str], stack: Stack, kinesis: Any
) -> None:
    # GIVEN one partition's rows and the executor function of its batch (as a speculative
    # task and the original would both run it)
    rows = [(key, data, None) for key, data in events(200, prefix="race")]
    sink = ExactlyOnceSink(settings, query_id="q-race")
    writer = sink.partition_writer(frame(spark, [(k, d) for k, d, _ in rows]), "q-race", 0)
    start = Barrier(2)

    def task(_: int) -> list[PartitionReport]:
        start.wait()
        return list(writer(0, iter(rows)))

    # WHEN two tasks write it at once
    with ThreadPoolExecutor(2) as pool:
        reports = [r for found in pool.map(task, range(2)) for r in found]

    # THEN between them every key was sent once and found a duplicate once, none left open
    assert sum(r.counts["sent"] for r in reports) == 200
    assert sum(r.counts["duplicates"] for r in reports) == 200
    assert not [u for r in reports for u in r.unresolved]
    contents = streamcheck.read_stream(kinesis, stack.settings.stream)
    streamcheck.assert_exactly_once(contents, [r[0] for r in rows], stack.ledger)


# --- (4) dead letters -------------------------------------------------------------------------


def test_rejected_and_conflicting_rows_are_dead_lettered_and_the_rest_delivered(
    spark: Any, settings: dict[str, str], stack: Stack, kinesis: Any, tmp_path: Path
) -> None:
    # GIVEN a batch with an empty key, an oversized record, and a key already used for other
    # data, among good rows
    good = events(30)
    with stack.producer() as producer:
        producer.send([Message("taken", b"the first payload")])
    bad = [
        ("", "no key"),
        ("huge", "x" * (1024 * 1024 + 1)),
        ("taken", "another payload"),
    ]
    dead_letters = tmp_path / "dlq"
    sink = ExactlyOnceSink(settings, dead_letter_path=str(dead_letters), query_id="q-dlq")

    # WHEN it is written as batch 7
    report = sink.write_batch(frame(spark, good + bad), 7)

    # THEN the good rows are delivered and the batch is COMPLETE
    assert report.counts["sent"] == 30
    assert report.counts["rejected"] == 2
    assert report.counts["conflicts"] == 1
    contents = streamcheck.read_stream(kinesis, stack.settings.stream)
    streamcheck.assert_exactly_once(contents, [k for k, _ in good], stack.ledger)
    streamcheck.assert_only(contents, [k for k, _ in good] + ["taken"])
    assert contents.counts["taken"] == 1
    assert batch_complete(stack, "q-dlq", 7)

    # AND the bad rows are in the batch's dead-letter file with their reason and data
    files = sorted((dead_letters / "batch=7").glob("part-*.json"))
    assert len(files) == 1
    letters = {
        row.get("key"): row
        for row in map(json.loads, files[0].read_text(encoding="utf-8").splitlines())
    }
    assert set(letters) == {"", "huge", "taken"}
    assert letters[""]["status"] == "REJECTED"
    assert "key is empty" in letters[""]["reason"]
    assert letters["huge"]["status"] == "REJECTED"
    assert "bytes" in letters["huge"]["reason"]
    assert len(letters["huge"]["data"]) == 1024 * 1024 + 1
    assert letters["taken"]["status"] == "CONFLICT"
    assert letters["taken"]["data"] == "another payload"
    assert all(row["batch_id"] == 7 and row["query_id"] == "q-dlq" for row in letters.values())


def test_a_replayed_batch_replaces_its_dead_letters_even_those_the_earlier_spark_writer_left(
    spark: Any, tmp_path: Path
) -> None:
    # GIVEN batch 4's folder as the sink's Spark writer left it before the writers were one
    folder = tmp_path / "dlq" / "batch=4"
    earlier = [("q", 4, "k", "REJECTED", "key is empty", "x", None, None)]
    spark.createDataFrame(earlier, DEAD_LETTER_SCHEMA).coalesce(1).write.json(str(folder))
    # WHEN the batch is replayed and writes its dead letters through the session
    report = BatchReport("q", 4)
    report.dead_letters.append(DeadLetter("k", "REJECTED", "key is empty", "x", None, None))
    DeadLetterWriter(str(tmp_path / "dlq"), "orders", HadoopFolders(spark)).write(report)
    # THEN the folder holds its letters once, in the one writer's file
    files = sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))
    assert files == [PART_FILE]
    (letter,) = map(json.loads, (folder / PART_FILE).read_text(encoding="utf-8").splitlines())
    assert (letter["key"], letter["batch_id"], letter["data"]) == ("k", 4, "x")


# --- unresolved keys fail the batch ------------------------------------------------------------


def test_a_batch_with_an_unresolved_key_raises_and_is_not_marked_complete(
    spark: Any, settings: dict[str, str], stack: Stack, kinesis: Any
) -> None:
    # GIVEN a key whose earlier claim the ledger could not verify within retention
    rows = events(20)
    stuck = plant_unverifiable(stack, *rows[0])
    sink = ExactlyOnceSink(settings, query_id="q-unresolved")

    # WHEN a batch with that key is written
    with pytest.raises(UnresolvedKeysError) as raised:
        sink.write_batch(frame(spark, rows), 0)

    # THEN the batch fails for Spark to retry, names the key, and is not marked COMPLETE,
    # while the other rows are delivered
    assert raised.value.keys == [stuck]
    assert not batch_complete(stack, "q-unresolved", 0)
    contents = streamcheck.read_stream(kinesis, stack.settings.stream)
    streamcheck.assert_exactly_once(contents, [k for k, _ in rows[1:]], stack.ledger)
    streamcheck.assert_absent(contents, [stuck])


# --- metrics ----------------------------------------------------------------------------------


@pytest.mark.parametrize("dedupe", ["key", "replay"])
def test_the_sink_serves_its_batches_and_rows_on_its_metrics_port(
    spark: Any, settings: dict[str, str], stack: Stack, dedupe: str
) -> None:
    # GIVEN a sink with a metrics port
    port = free_port()
    rows = events(20)
    query = f"q-metrics-{dedupe}"
    sink = ExactlyOnceSink(settings, query_id=query, dedupe=dedupe, metrics_port=port)

    # WHEN batch 0 is written, then replayed (skipped: it is COMPLETE), and in key mode a
    # batch 1 whose key cannot settle
    sink.write_batch(frame(spark, rows), 0)
    assert sink.write_batch(frame(spark, rows), 0).skipped
    failures = 0
    if dedupe == "key":
        stuck = plant_unverifiable(stack, "stuck", "data")
        with pytest.raises(UnresolvedKeysError):
            sink.write_batch(frame(spark, [(stuck, "data")]), 1)
        failures = 1

    # THEN the driver serves the batches' ends and their rows by outcome, under the names of
    # format("keo")'s metrics, and what the executors' producers did
    labels = {"query": query, "stream": stack.settings.stream}
    found = scrape_until(
        port, lambda found: sample(found, "keo_spark_batches_skipped_total", **labels) == 1
    )
    assert sample(found, "keo_spark_batches_committed_total", **labels) == 1
    failed = sample(found, "keo_spark_batch_failures_total", reason="unresolved_keys", **labels)
    assert failed == failures
    assert sample(found, "keo_spark_rows_total", outcome="SENT", **labels) == 20
    assert sample(found, "keo_spark_rows_total", outcome="UNRESOLVED", **labels) == failures
    assert sample(found, "keo_spark_last_commit_timestamp_seconds", **labels) > 0
    produced = {
        name for (name, pairs) in found if dict(pairs).get("query") == query and "spark" not in name
    }
    assert "keo_ledger_requests_total" in produced, sorted(produced)


# --- (5) a streaming query that dies mid-batch ------------------------------------------------


def _job_args(source: Path, checkpoint: Path, dead_letter: Path) -> argparse.Namespace:
    return argparse.Namespace(
        source=str(source),
        checkpoint=str(checkpoint),
        dead_letter=str(dead_letter),
        trigger="available-now",
        max_files_per_trigger=1,
    )


def test_a_query_killed_after_its_puts_replays_the_batch_without_adding_anything(
    spark: Any,
    settings: dict[str, str],
    stack: Stack,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pyspark.errors import StreamingQueryException

    kinesis = streamcheck.kinesis_client(settings["KEO_KINESIS_ENDPOINT_URL"])

    # GIVEN three files of events, one per micro-batch, and a sink that dies after batch 0's
    # puts, before the batch is marked COMPLETE or committed to the checkpoint
    keys = write_event_files(tmp_path / "in", files=3, per_file=40)
    args = _job_args(tmp_path / "in", tmp_path / "checkpoint", tmp_path / "dlq")
    sink = ExactlyOnceSink(
        settings, routing_key_column="routing_key", dead_letter_path=args.dead_letter
    )
    sink.hooks = Failpoints("batch_after_puts=raise")

    # WHEN the query runs and dies
    first = start_query(spark, args, sink)
    with pytest.raises(StreamingQueryException, match="batch_after_puts"):
        first.awaitTermination(120)
    assert len(streamcheck.read_stream(kinesis, stack.settings.stream).records) == 40

    # AND is restarted from the same checkpoint
    sink.hooks = NO_HOOKS
    second = start_query(spark, args, sink)
    assert second.awaitTermination(120)
    assert second.exception() is None

    # THEN the same query id replayed batch 0: every row a duplicate, nothing added
    assert second.id == first.id
    replayed = stack.ledger.completed_batch(
        stack.settings.stream, second.id, 0, now_ms=stack.clock.now_ms()
    )
    assert replayed is not None
    assert (replayed.counts["duplicates"], replayed.counts["sent"]) == (40, 0)
    for batch_id in (1, 2):
        assert batch_complete(stack, second.id, batch_id)

    # AND the stream holds every event once, and the audit is clean
    assert_exactly_these(kinesis, stack, keys)
