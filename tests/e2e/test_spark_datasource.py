"""``format("keo")`` on a real local Spark against the real emulators: batch and streaming
writes, replays, dead letters, a query killed after its puts, and options refused by name.

Each test gets its own stream and ledger table; the SparkSession is shared (conftest.py). The
stream is read back with plain boto3 calls (streamcheck), never with the product's reader.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
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
    start_event_query,
    streamcheck,
    write_event_files,
)

import spark_jobs
from dedupe_store.settings import ENV_PREFIX
from dedupe_store.states import LedgerState
from devstack.failpoints import Failpoints
from devstack.fault_proxy import FaultProxy
from producer.hooks import Step
from producer.protocol import Message
from producer.wiring import Stack

pytestmark = pytest.mark.spark

QUERY_TIMEOUT_S = 180


def keo_options(settings: dict[str, str], **more: str) -> dict[str, str]:
    """KEO_* settings as the data source's options: ``KEO_LEASE_S`` -> ``lease_s``."""
    options = {name[len(ENV_PREFIX) :].lower(): value for name, value in settings.items()}
    return {**options, **more}


def _dead_letters(folder: Path) -> dict[str | None, dict[str, Any]]:
    (file,) = folder.glob("part-*.json")
    return {
        row["key"]: row for row in map(json.loads, file.read_text(encoding="utf-8").splitlines())
    }


def _ledger_positions(stack: Stack, keys: list[str]) -> dict[str, Any]:
    return {
        key: (record.state, record.attempt, record.position)
        for key, record in stack.ledger.batch_get(stack.settings.stream, keys).items()
    }


# --- batch writes ----------------------------------------------------------------------------


def test_a_write_checks_the_stream_and_the_table_once_on_the_driver_not_in_each_task(
    keo: Any, settings: dict[str, str], stack: Stack, emulators: Any, kinesis: Any
) -> None:
    # (replay mode's tasks here; key mode's in test_spark_sink.py: one TaskWriter, either mode)
    # GIVEN a stream and table, Kinesis and DynamoDB behind counting proxies, and a frame of
    # 4 partitions
    with (
        FaultProxy(emulators.kinesis) as kinesis_proxy,
        FaultProxy(emulators.dynamodb) as ledger_proxy,
    ):
        options = keo_options(
            settings,
            dedupe="replay",
            kinesis_endpoint_url=kinesis_proxy.endpoint,
            dynamodb_endpoint_url=ledger_proxy.endpoint,
        )
        rows = keo.createDataFrame(events(40), "key string, data string").repartition(4)
        # WHEN it is written
        rows.write.format("keo").mode("append").options(**options).save()
    # THEN the stream was described and the table checked once, by the driver: its tasks,
    # in every Python worker, built clients and asked neither (AWS answers 20
    # DescribeStreamSummary a second for the whole account)
    assert kinesis_proxy.received["DescribeStreamSummary"] == 1
    assert ledger_proxy.received["DescribeTable"] == 1
    assert kinesis_proxy.received["PutRecords"] >= 4
    # AND every row is in the stream once
    contents = streamcheck.read_stream(kinesis, stack.settings.stream)
    streamcheck.assert_only(contents, [key for key, _ in events(40)])
    assert set(contents.counts.values()) == {1}


def test_a_batch_write_delivers_each_key_once_dead_letters_bad_rows_and_adds_nothing_twice(
    keo: Any, settings: dict[str, str], stack: Stack, kinesis: Any, tmp_path: Path
) -> None:
    # GIVEN good rows with a routing key column, and among them an empty key, an oversized
    # record and a key already delivered with other data
    good = [(key, data, f"tenant-{i % 3}") for i, (key, data) in enumerate(events(60))]
    with stack.producer() as producer:
        producer.send([Message("taken", b"the first payload")])
    bad = [
        ("", "no key", None),
        ("huge", "x" * (1024 * 1024 + 1), None),
        ("taken", "another payload", None),
    ]
    rows = frame(keo, good + bad, "key string, data string, tenant string")
    dead_letters = tmp_path / "dlq"
    port = free_port()
    options = keo_options(
        settings,
        routing_key_column="tenant",
        dead_letter_path=str(dead_letters),
        metrics_port=str(port),
    )

    # WHEN the frame is written with format("keo")
    rows.write.format("keo").mode("append").options(**options).save()

    # THEN every good row is in the stream once, where the ledger says, and nothing else
    good_keys = [key for key, _, _ in good]
    contents = streamcheck.read_stream(kinesis, stack.settings.stream)
    streamcheck.assert_exactly_once(
        contents, good_keys, stack.ledger, payloads=payloads([(k, d) for k, d, _ in good])
    )
    streamcheck.assert_only(contents, [*good_keys, "taken"])
    assert contents.counts["taken"] == 1

    # AND the bad rows are dead-lettered with their reason and data
    (written,) = dead_letters.glob("write=*")
    letters = _dead_letters(written)
    assert set(letters) == {"", "huge", "taken"}
    assert letters[""]["status"] == "REJECTED"
    assert "key is empty" in letters[""]["reason"]
    assert letters["huge"]["status"] == "REJECTED"
    assert len(letters["huge"]["data"]) == 1024 * 1024 + 1
    assert letters["taken"]["status"] == "CONFLICT"
    assert letters["taken"]["data"] == "another payload"

    # WHEN the same frame is written again
    before = _ledger_positions(stack, good_keys)
    rows.write.format("keo").mode("append").options(**options).save()

    # THEN every good row was a DUPLICATE: nothing sent, no claim taken again, the stream
    # as it was; the bad rows are dead-lettered again
    again = streamcheck.read_stream(kinesis, stack.settings.stream)
    assert len(again.records) == len(contents.records)
    assert _ledger_positions(stack, good_keys) == before
    assert {state for state, _, _ in before.values()} == {LedgerState.DELIVERED}
    assert len(list(dead_letters.glob("write=*"))) == 2

    # AND the driver's metrics count both writes and their rows
    write = {"query": "batch-write", "stream": stack.settings.stream}
    found = scrape_until(
        port, lambda found: sample(found, "keo_spark_batches_committed_total", **write) == 2
    )
    assert sample(found, "keo_spark_rows_total", outcome="SENT", **write) == 60
    assert sample(found, "keo_spark_rows_total", outcome="DUPLICATE", **write) == 60
    assert sample(found, "keo_spark_rows_total", outcome="REJECTED", **write) == 4
    assert sample(found, "keo_spark_rows_total", outcome="CONFLICT", **write) == 2
    # AND what the executors' producers did, under keo send's names: 60 claims won the first
    # time, then every claim lost to the key's delivered item (and "taken" both times)
    assert sample(found, "keo_claims_total", result="won", **write) == 60
    assert sample(found, "keo_claims_total", result="lost", **write) == 62
    assert sample(found, "keo_put_requests_total", **write) >= 1


def test_binary_data_through_the_row_writer_arrives_as_sent(
    keo: Any, settings: dict[str, str], stack: Stack, kinesis: Any
) -> None:
    # GIVEN binary data with a routing key, written through Spark rows instead of Arrow
    rows = [(f"b{i}", bytes([i, 0, 255]), "tenant-a") for i in range(20)]
    binary = frame(keo, rows, "id string, body binary, tenant string")
    options = keo_options(
        settings, key_column="id", data_column="body", routing_key_column="tenant", arrow="false"
    )

    # WHEN written
    binary.write.format("keo").mode("append").options(**options).save()

    # THEN the bytes arrive unchanged, all on the routing key's shard
    assert_binary_rows_arrived(kinesis, stack, rows)


def test_a_write_with_an_unresolved_key_fails_and_delivers_the_rest(
    keo: Any, settings: dict[str, str], stack: Stack, kinesis: Any
) -> None:
    # GIVEN a key whose earlier claim the ledger could not verify within retention
    rows = events(20)
    stuck = plant_unverifiable(stack, *rows[0])
    port = free_port()
    options = keo_options(settings, metrics_port=str(port))

    # WHEN a frame with that key is written
    # THEN the write fails, naming the key, for Spark to retry it
    with pytest.raises(Exception, match=f"keys left unresolved.*{stuck}"):
        frame(keo, rows).write.format("keo").mode("append").options(**options).save()

    # AND the other rows are delivered, the stuck key is not sent
    contents = streamcheck.read_stream(kinesis, stack.settings.stream)
    streamcheck.assert_exactly_once(contents, [k for k, _ in rows[1:]], stack.ledger)
    streamcheck.assert_absent(contents, [stuck])

    # AND the driver's metrics count the write aborted (its task failed), not committed
    write = {"query": "batch-write", "stream": stack.settings.stream}
    found = scrape_until(
        port,
        lambda found: sample(found, "keo_spark_batch_failures_total", reason="aborted", **write),
    )
    assert sample(found, "keo_spark_batch_failures_total", reason="aborted", **write) == 1
    assert sample(found, "keo_spark_batches_committed_total", **write) == 0


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ({"strem": "orders"}, "unknown option 'strem'"),
        (
            {"lease": "30", "key_col": "id"},
            "unknown options 'key_col' (did you mean 'key_column'?), "
            "'lease' (did you mean 'lease_s'?)",
        ),
        ({"key_column": "id"}, "key_column 'id' is not a column"),
        ({"lease_s": "0.5"}, "KEO_LEASE_S=0.5 is too short"),
        ({"query_name": "q"}, "query_name names a streaming query"),
        ({"dead_letter_path": "s3://bucket/dlq"}, "only local or mounted paths"),
        ({"metrics_port": "http"}, "metrics_port must be a port number"),
    ],
)
def test_an_option_it_cannot_use_fails_the_write_naming_it(
    keo: Any, settings: dict[str, str], extra: dict[str, str], named: str
) -> None:
    # GIVEN options with an unknown name, a missing column or a bad value (for a stream
    # that does not exist: options are checked before the stream is looked at)
    options = keo_options(settings, **extra)

    # WHEN a frame is written with them
    # THEN the write fails before any task runs, and the message names the option
    with pytest.raises(Exception, match=re.escape(named)):
        frame(keo, events(3)).write.format("keo").mode("append").options(**options).save()


# --- streaming writes ------------------------------------------------------------------------


def test_a_streaming_write_killed_after_its_puts_delivers_every_key_once_on_restart(
    keo: Any, settings: dict[str, str], stack: Stack, kinesis: Any, tmp_path: Path
) -> None:
    from pyspark.errors import StreamingQueryException

    # GIVEN three files of events (one micro-batch each, one bad row among them), and a
    # data source whose driver commit dies after batch 0's puts, before the batch is recorded
    keys = write_event_files(tmp_path / "in", files=3, per_file=40)
    bad_row = {"key": "", "data": "no key", "routing_key": None}
    with (tmp_path / "in" / "events-1.json").open("a", encoding="utf-8") as more:
        more.write(json.dumps(bad_row) + "\n")
    dead_letters = tmp_path / "dlq"
    port = free_port()
    options = keo_options(
        settings,
        routing_key_column="routing_key",
        dead_letter_path=str(dead_letters),
        query_name="orders-to-kinesis",
        metrics_port=str(port),
    )
    spark_jobs.register(keo, hooks=Failpoints(f"{Step.BATCH_AFTER_PUTS}=raise"))

    # WHEN the query runs and dies
    first = start_event_query(keo, tmp_path / "in", tmp_path / "checkpoint", options)
    with pytest.raises(StreamingQueryException, match="batch_after_puts"):
        first.awaitTermination(QUERY_TIMEOUT_S)
    assert len(streamcheck.read_stream(kinesis, stack.settings.stream).records) == 40
    assert not batch_complete(stack, "orders-to-kinesis", 0)

    # AND is restarted from the same checkpoint, without the fault
    spark_jobs.register(keo)
    second = start_event_query(keo, tmp_path / "in", tmp_path / "checkpoint", options)
    assert second.awaitTermination(QUERY_TIMEOUT_S)
    assert second.exception() is None

    # THEN batch 0 was replayed: every row a duplicate, nothing sent again
    replayed = stack.ledger.completed_batch(
        stack.settings.stream, "orders-to-kinesis", 0, now_ms=stack.clock.now_ms()
    )
    assert replayed is not None
    assert (replayed.counts["duplicates"], replayed.counts["sent"]) == (40, 0)
    assert batch_complete(stack, "orders-to-kinesis", 1)
    assert batch_complete(stack, "orders-to-kinesis", 2)

    # AND the stream holds every event once, and the audit is clean
    assert_exactly_these(kinesis, stack, keys)

    # AND the bad row is in its batch's dead letters, named by the query
    (folder,) = dead_letters.glob("batch=*")
    letter = _dead_letters(folder)[""]
    assert letter["status"] == "REJECTED"
    assert letter["query_id"] == "orders-to-kinesis"
    assert letter["batch_id"] == int(folder.name.removeprefix("batch="))

    # AND the driver's metrics count the failed commit once, the three committed batches, and
    # every row as its commit saw it (batch 0's 40 sent, then its replay's 40 duplicates)
    query = {"query": "orders-to-kinesis", "stream": stack.settings.stream}
    found = scrape_until(
        port, lambda found: sample(found, "keo_spark_batches_committed_total", **query) == 3
    )
    assert sample(found, "keo_spark_batch_failures_total", reason="error", **query) == 1
    assert sample(found, "keo_spark_batch_failures_total", reason="aborted", **query) == 0
    assert sample(found, "keo_spark_rows_total", outcome="SENT", **query) == 120
    assert sample(found, "keo_spark_rows_total", outcome="DUPLICATE", **query) == 40
    assert sample(found, "keo_spark_rows_total", outcome="REJECTED", **query) == 1


def test_a_replayed_batch_recorded_complete_is_skipped(
    keo: Any, settings: dict[str, str], stack: Stack, kinesis: Any, tmp_path: Path
) -> None:
    # GIVEN a query that delivered two batches, whose last commit Spark never recorded (the
    # driver died between the batch record and the checkpoint's commit log)
    keys = write_event_files(tmp_path / "in", files=2, per_file=30)
    port = free_port()
    options = keo_options(settings, query_name="skipping", metrics_port=str(port))
    checkpoint = tmp_path / "checkpoint"
    assert start_event_query(keo, tmp_path / "in", checkpoint, options).awaitTermination(
        QUERY_TIMEOUT_S
    )
    first = stack.ledger.completed_batch(
        stack.settings.stream, "skipping", 1, now_ms=stack.clock.now_ms()
    )
    assert first is not None
    for written in (checkpoint / "commits").glob("*1*"):
        written.unlink()  # the commit and its checksum file

    # WHEN the query is restarted
    assert start_event_query(keo, tmp_path / "in", checkpoint, options).awaitTermination(
        QUERY_TIMEOUT_S
    )

    # THEN Spark replayed batch 1 and the data source skipped it: its record is the first one
    # (a re-run would have rewritten it with 30 duplicates), and the stream is unchanged
    again = stack.ledger.completed_batch(
        stack.settings.stream, "skipping", 1, now_ms=stack.clock.now_ms()
    )
    assert again == first
    assert (checkpoint / "commits" / "1").exists()
    contents = streamcheck.read_stream(kinesis, stack.settings.stream)
    streamcheck.assert_exactly_once(contents, keys, stack.ledger)
    streamcheck.assert_only(contents, keys)

    # AND the driver's metrics count two batches committed and one skipped, no row twice
    query = {"query": "skipping", "stream": stack.settings.stream}
    found = scrape_until(
        port, lambda found: sample(found, "keo_spark_batches_skipped_total", **query) == 1
    )
    assert sample(found, "keo_spark_batches_committed_total", **query) == 2
    assert sample(found, "keo_spark_rows_total", outcome="SENT", **query) == 60
    assert sample(found, "keo_spark_rows_total", outcome="DUPLICATE", **query) == 0


def test_the_driver_serves_the_metrics_of_every_query_on_its_metrics_port(
    keo: Any, settings: dict[str, str], stack: Stack, tmp_path: Path
) -> None:
    # GIVEN two files of events with a bad row, and a port for the driver's metrics
    write_event_files(tmp_path / "in", files=2, per_file=20)
    with (tmp_path / "in" / "events-0.json").open("a", encoding="utf-8") as more:
        more.write(json.dumps({"key": "", "data": "no key", "routing_key": None}) + "\n")
    port = free_port()

    # WHEN two queries write them one after the other with that metrics_port, the second
    # finding every key delivered
    for name in ("first", "second"):
        options = keo_options(settings, query_name=name, metrics_port=str(port))
        query = start_event_query(keo, tmp_path / "in", tmp_path / f"checkpoint-{name}", options)
        assert query.awaitTermination(QUERY_TIMEOUT_S)
        assert query.exception() is None

    # THEN /metrics on 127.0.0.1:port has both queries' batches, and their rows by outcome
    first = {"query": "first", "stream": stack.settings.stream}
    second = {"query": "second", "stream": stack.settings.stream}
    found = scrape_until(
        port, lambda found: sample(found, "keo_spark_batches_committed_total", **second) == 2
    )
    assert sample(found, "keo_spark_batches_committed_total", **first) == 2
    assert sample(found, "keo_spark_rows_total", outcome="SENT", **first) == 40
    assert sample(found, "keo_spark_rows_total", outcome="REJECTED", **first) == 1
    assert sample(found, "keo_spark_rows_total", outcome="SENT", **second) == 0
    assert sample(found, "keo_spark_rows_total", outcome="DUPLICATE", **second) == 40
    assert sample(found, "keo_spark_rows_total", outcome="REJECTED", **second) == 1
    assert sample(found, "keo_spark_batch_failures_total", reason="error", **first) == 0
    assert sample(found, "keo_spark_last_commit_timestamp_seconds", **second) > 0
