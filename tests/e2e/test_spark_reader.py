"""``spark.read.format("keo")`` and the audit on Spark, against the real emulators.

The stream gets plain records from the producer, one KPL aggregate put by hand whose second
user record hashes outside its shard (KCL drops it), a second copy of a delivered key (a
planted duplicate) and, in the expected keys, a key never sent (a planted loss).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from spark_support import events, streamcheck

import spark_jobs
from producer.audit import audit_stream
from producer.kpl import Aggregate
from producer.protocol import DEFAULT_MAX_RECORD_BYTES, Message, put_entry
from producer.wiring import Stack
from spark_jobs import audit as spark_audit
from spark_jobs.datasource import READ_SCHEMA

pytestmark = pytest.mark.spark

INSIDE = "agg-inside"
OUTSIDE = "agg-outside"
LOW_HASH = "5"  # shard 0 of 2 covers [0, 2**127)
HIGH_HASH = str(2**127 + 5)


@pytest.fixture
def keo(spark: Any) -> Any:
    spark_jobs.register(spark)
    return spark


@pytest.fixture
def planted(stack: Stack, kinesis: Any) -> list[str]:
    """20 delivered keys, an aggregate routed to shard 0 holding one user record for shard 0
    and one for shard 1; returns the delivered keys."""
    rows = events(20)
    with stack.producer() as producer:
        producer.send([Message(key, data.encode()) for key, data in rows])
    aggregate = Aggregate(DEFAULT_MAX_RECORD_BYTES)
    assert aggregate.add(INSIDE, b"kept", LOW_HASH)
    assert aggregate.add(OUTSIDE, b"dropped by KCL", HIGH_HASH)
    kinesis.put_records(StreamName=stack.settings.stream, Records=[aggregate.entry()])
    return [key for key, _ in rows]


def _options(settings: dict[str, str], **more: str) -> dict[str, str]:
    return {**spark_audit.read_options(settings), **more}


def test_a_read_yields_each_user_record_as_a_consumer_sees_it(
    keo: Any, settings: dict[str, str], stack: Stack, kinesis: Any, planted: list[str]
) -> None:
    # WHEN the stream is read with format("keo")
    frame = keo.read.format("keo").options(**_options(settings)).load()
    rows = {row["key"]: row for row in frame.collect()}

    # THEN one input partition per shard, the documented columns, and one row per user
    # record that KCL delivers: the aggregate split, its out-of-range record dropped
    assert frame.rdd.getNumPartitions() == 2
    assert frame.schema.simpleString() == keo.createDataFrame([], READ_SCHEMA).schema.simpleString()
    assert set(rows) == {*planted, INSIDE}
    oracle = streamcheck.read_stream(kinesis, stack.settings.stream)
    for key in planted:
        (record,) = oracle.by_key[key]
        row = rows[key]
        assert (row["data"], row["shard_id"], row["sequence_number"]) == (
            record.data,
            record.shard_id,
            record.sequence_number,
        )
        assert row["sub_sequence_number"] is None
        assert abs(row["approximate_arrival_timestamp"].timestamp() * 1000 - record.arrival_ms) < 1
    assert rows[INSIDE]["data"] == b"kept"
    assert rows[INSIDE]["sub_sequence_number"] == 0

    # AND without the filter the dropped record is there, marked
    unfiltered = keo.read.format("keo").options(**_options(settings, kcl_filter="false")).load()
    marks = {row["key"]: row["visible_to_kcl"] for row in unfiltered.collect()}
    assert marks[OUTSIDE] is False
    assert marks[INSIDE] is True

    # AND time bounds select by arrival: nothing arrived in the future
    later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    bounded = keo.read.format("keo").options(**_options(settings, starting_timestamp=later))
    assert bounded.load().count() == 0


def test_the_spark_audit_reports_what_keo_audit_reports(
    keo: Any,
    settings: dict[str, str],
    stack: Stack,
    kinesis: Any,
    planted: list[str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # GIVEN a second copy of a delivered key, and an expected key that was never sent
    duplicated = planted[3]
    kinesis.put_records(StreamName=stack.settings.stream, Records=[put_entry(duplicated, b"again")])
    expected = tmp_path / "expected.txt"
    expected.write_text("\n".join([*planted, "never-sent"]) + "\n", encoding="utf-8")

    # WHEN the stream is audited on Spark, as python -m spark_jobs.audit does
    argv = ["--stream", stack.settings.stream, "--expected", str(expected), "--json"]
    env = {"KEO_STREAM": stack.settings.stream, **settings}
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        code = spark_audit.main(argv, session=keo)
    out, err = capsys.readouterr()

    # THEN it fails (exit 1) with the same report keo audit's reading gives: the duplicate,
    # the loss, the aggregate's records unknown to the ledger, one record dropped as KCL would
    report = json.loads(out)
    assert code == 1
    keo_report = audit_stream(stack.reader, stack.ledger, expected=[*planted, "never-sent"])
    assert report == keo_report.as_json()
    assert set(report["duplicates"]) == {duplicated}
    assert report["expected_missing"] == ["never-sent"]
    assert report["unknown_keys"] == [INSIDE]
    assert report["dropped_by_kcl"] == 1
    assert f"verdict: {keo_report.anomalies} ANOMALIES" in err
