"""The Spark bench, tiny, on the session's SparkSession: every figure ``make bench`` promises
is in its results (the writers', and the streaming read's and the relay's), and ``keo bench``
renders them. Nothing about speed is asserted."""

from __future__ import annotations

import json
from typing import Any

import pytest

# the bench measures format("keo"), a Spark 4 data source
pytest.importorskip("pyspark.sql.datasource")

from cli.bench import render_spark_table
from devstack import emulators as local_stack
from devstack import quota_bench, spark_bench
from producer.settings import ProducerSettings

SINKS = ("arrow", "rows", "replay", "keo_send", "plain_foreach_batch")
RATIOS = ("new_vs_keo_send", "duplicate_vs_keo_send", "new_vs_plain_foreach_batch")


def _rate(figures: dict[str, Any]) -> float:
    rate = figures["rows_per_s"]
    assert isinstance(rate, float)
    assert rate > 0
    return rate


def test_the_spark_bench_reports_every_sink_and_ratio(
    spark: Any, emulators: local_stack.Endpoints
) -> None:
    # GIVEN the session's Spark and the emulators
    endpoints = {
        "kinesis_endpoint_url": emulators.kinesis,
        "dynamodb_endpoint_url": emulators.dynamodb,
        "region": local_stack.REGION,
    }
    # WHEN the bench runs on 200 rows, once each, and its streaming part on 200 records,
    # not warmed up
    results = spark_bench.run(
        spark,
        endpoints,
        rows=200,
        interface_rows=(),
        repeats=1,
        stream_records=200,
        stream_warm_up=False,
        stream_running_s=1.0,
    )
    # THEN every sink has its rate end to end, new and (but for the plain sink) DUPLICATE
    end_to_end = results["end_to_end"]
    assert set(end_to_end) == set(SINKS)
    for name in SINKS:
        _rate(end_to_end[name]["new"])
        if name != "plain_foreach_batch":
            _rate(end_to_end[name]["duplicate"])
    assert "duplicate" not in end_to_end["plain_foreach_batch"]
    assert end_to_end["keo_send"]["startup_s"] > 0
    # AND each writer's interface alone
    for name in ("arrow", "rows"):
        _rate(results["interface"][name]["200"])
    # AND every ratio: format("keo")'s writers against keo send and the plain sink
    for name in ("arrow", "rows"):
        assert all(isinstance(results["ratios"][name][r], float) for r in RATIOS)
    assert results["ratios"]["keo_send"]["new_vs_keo_send"] == 1.0
    assert results["ratios"]["plain_foreach_batch"]["duplicate_vs_keo_send"] is None
    # AND replay mode's bill, metered per row, and its ratio to the plain sink, per round
    replay = end_to_end["replay"]
    assert replay["rows_per_partition"] == 100
    assert replay["new"]["billed_write_units_per_message"] > 0
    assert replay["new"]["dynamodb_requests_by_operation"]["UpdateItem"] >= 3
    assert replay["duplicate"]["billed_write_units_per_message"] > 0
    assert isinstance(results["ratios"]["replay"]["new_vs_plain_foreach_batch"], float)
    assert len(results["replay_vs_plain"]["ratio_per_round"]) == 1
    # AND readStream.format("keo") next to a boto3 GetRecords loop, and the relay exactly once
    # next to at least once, each having seen every record (or it would have raised)
    streaming = results["streaming"]
    for pair, names in (
        ("read", ("keo_read_stream", "boto3_get_records", "boto3_get_records_paced")),
        ("relay", ("relay_exactly_once", "relay_at_least_once")),
    ):
        for name in names:
            assert streaming[pair][name]["records_per_s"] > 0
        assert isinstance(streaming[pair]["median_ratio"], float)
    # AND a running query's planning and batches, per batch
    assert streaming["running"]["batches"] >= 1
    assert streaming["running"]["planning_ms"]["median"] >= 0
    # AND the load average at the start and at the end, for reading noisy figures
    load = results["machine"]["load_average"]
    assert len(load["start"]) == len(load["end"]) == 3
    # AND it is JSON, and keo bench renders a row per sink from it
    table = render_spark_table(json.loads(json.dumps(results)))
    # two writers and replay mode end to end, two writers' interface alone
    assert table.count("\n| format(") == 5
    assert "`dedupe=replay` against the plain sink in 1 rounds" in table
    assert "\n| `keo send`" in table
    assert "\n| plain `foreachBatch`" in table
    assert '\n| readStream.format("keo")' in table
    assert "A query that runs on over a stream fed 1,000 records a second" in table
    assert "\n| relay A to B, exactly once" in table


def test_each_spark_reader_drains_a_backlog_beside_another_consumer_refusing_it_nothing(
    spark: Any, keo_env: Any
) -> None:
    # GIVEN the quota bench's Spark readers, on the session's Spark: the batch read and the
    # streaming one (read_records reads each shard as the batch read does: read_shard)
    readers = {
        name: reader
        for name, reader in quota_bench.spark_readers(spark).items()
        if "read_records" not in name
    }
    settings = ProducerSettings(stream="unused", table="unused")
    # WHEN each drains a backlog of 6 MiB behind the quota proxy (3 s of the read quota: the
    # rate is taken from 2 s after the first read on), beside a consumer at the tip
    figures = quota_bench.measure_readers(
        settings, backlog_mib=6, readers=readers, say=lambda _: None
    )
    # THEN each read the backlog, and the shard never refused the other consumer: the readers
    # kept within its 5 calls and 2 MiB a second together
    assert [f.reader for f in figures] == list(readers)
    for reader in figures:
        assert reader.read_mib_per_s > 0, reader
        assert reader.other_calls > 0, reader
        assert reader.other_throttled == 0, reader
