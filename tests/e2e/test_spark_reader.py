"""The batch read of a stream (``spark_jobs.read_records``, on Spark 3.5 and 4; and
``spark.read.format("keo")``, on Spark 4) and the audit on Spark, against the real emulators.

The stream gets plain records from the producer, two KPL aggregates put by hand: one wholly
inside its shard, and a stray one whose second user record hashes outside its shard (the KCL
drops it whole, the user record inside the range too), a second copy of a delivered key (a
planted duplicate) and, in the expected keys, a key never sent (a planted loss). The last
key-mode test plants more of every anomaly than the report lists, in the stream and in the
ledger; the replay audit's test counts rows (key, data) against the JSON lines a run sent.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import planting
import pytest
from spark_support import (
    SPARK_VERSION,
    events,
    needs_data_sources,
    plant_unverifiable,
    streamcheck,
)

import spark_jobs
from dedupe_store.records import Position
from kinesis_store.entries import DEFAULT_MAX_RECORD_BYTES, put_entry
from kinesis_store.kpl import Aggregate
from producer.audit.rows import ExpectedRow
from producer.audit.stream import Anomaly, Findings, audit_rows, audit_stream
from producer.protocol import Message
from producer.wiring import Stack
from spark_jobs import audit as spark_audit
from spark_jobs.options import setting_options
from spark_jobs.read_rows import READ_SCHEMA

pytestmark = [pytest.mark.spark, pytest.mark.spark35]

KEPT = "agg-kept"  # an aggregate's user record inside its shard: delivered
INSIDE = "agg-inside"  # a stray aggregate's user record inside its shard: dropped with it
OUTSIDE = "agg-outside"
LOW_HASH = "5"  # shard 0 of 2 covers [0, 2**127)
HIGH_HASH = str(2**127 + 5)


@pytest.fixture
def planted(stack: Stack, kinesis: Any) -> list[str]:
    """20 delivered keys, an aggregate routed to shard 0 holding one user record for it, and
    a stray one holding one user record for shard 0 and one for shard 1; returns the delivered
    keys."""
    rows = events(20)
    with stack.producer() as producer:
        producer.send([Message(key, data.encode()) for key, data in rows])
    whole = Aggregate(DEFAULT_MAX_RECORD_BYTES)
    assert whole.add(KEPT, b"kept", LOW_HASH)
    stray = Aggregate(DEFAULT_MAX_RECORD_BYTES)
    assert stray.add(INSIDE, b"dropped with its aggregate", LOW_HASH)
    assert stray.add(OUTSIDE, b"dropped by KCL", HIGH_HASH)
    kinesis.put_records(StreamName=stack.settings.stream, Records=[whole.entry(), stray.entry()])
    return [key for key, _ in rows]


def _options(settings: dict[str, str], **more: str) -> dict[str, str]:
    return {**setting_options(settings), **more}


Read = Callable[[dict[str, str]], Any]


@pytest.fixture(
    params=[
        "read_records",
        pytest.param("format", marks=needs_data_sources),
    ]
)
def read(request: pytest.FixtureRequest, spark: Any) -> Read:
    """A batch read of a stream: ``spark_jobs.read_records`` (any Spark), or
    ``spark.read.format("keo")`` (Spark 4); both read the same rows."""
    if request.param == "read_records":
        return lambda options: spark_jobs.read_records(spark, options)
    spark_jobs.register(spark)
    return lambda options: spark.read.format("keo").options(**options).load()


def test_a_read_yields_each_user_record_as_a_consumer_sees_it(
    spark: Any,
    read: Read,
    settings: dict[str, str],
    stack: Stack,
    kinesis: Any,
    planted: list[str],
) -> None:
    # WHEN the stream is read
    frame = read(_options(settings))
    rows = {row["key"]: row for row in frame.collect()}

    # THEN one input partition per shard, the documented columns, and one row per user
    # record that KCL delivers: the aggregate split, the stray aggregate dropped whole
    assert frame.rdd.getNumPartitions() == 2
    assert (
        frame.schema.simpleString() == spark.createDataFrame([], READ_SCHEMA).schema.simpleString()
    )
    assert set(rows) == {*planted, KEPT}
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
    assert rows[KEPT]["data"] == b"kept"
    assert rows[KEPT]["sub_sequence_number"] == 0

    # AND without the filter the dropped record is there, marked
    unfiltered = read(_options(settings, kcl_filter="false"))
    marks = {row["key"]: row["visible_to_kcl"] for row in unfiltered.collect()}
    assert (marks[OUTSIDE], marks[INSIDE], marks[KEPT]) == (False, False, True)

    # AND time bounds select by arrival: nothing arrived in the future, all in the past hour
    now = datetime.now(UTC)
    later = (now + timedelta(hours=1)).isoformat()
    assert read(_options(settings, starting_timestamp=later)).count() == 0
    earlier = (now - timedelta(hours=1)).isoformat()
    assert read(_options(settings, starting_timestamp=earlier)).count() == len(rows)


def test_a_read_with_an_option_it_cannot_use_fails_on_the_driver_naming_it(
    spark: Any, settings: dict[str, str], stack: Stack
) -> None:
    # WHEN read_records is given an option no read knows, or a bound it cannot parse
    # THEN it fails before any task runs, naming the option
    with pytest.raises(spark_jobs.OptionsError, match="starting_position") as unknown:
        spark_jobs.read_records(spark, _options(settings), starting_position="latest")
    assert unknown.value.options == ["starting_position"]
    with pytest.raises(spark_jobs.OptionsError, match="ending_timestamp"):
        spark_jobs.read_records(spark, _options(settings), ending_timestamp="yesterday")


def test_the_spark_audit_reports_what_keo_audit_reports(
    spark: Any,
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
        code = spark_audit.main(argv, session=spark)
    out, err = capsys.readouterr()

    # THEN it fails (exit 1) with the same report keo audit's reading gives: the duplicate,
    # the loss, the aggregate's records unknown to the ledger, one record dropped as KCL would
    report = json.loads(out)
    assert code == 1
    keo_report = audit_stream(stack.reader, stack.ledger, expected=[*planted, "never-sent"])
    assert report == keo_report.as_json()
    assert set(report["duplicates"]) == {duplicated}
    assert report["expected_missing"] == ["never-sent"]
    assert report["unknown_keys"] == [KEPT]
    assert report["dropped_by_kcl"] == 2
    assert f"verdict: {keo_report.anomalies} ANOMALIES" in err


def test_the_spark_audit_counts_every_anomaly_and_brings_the_driver_one_row(
    spark: Any, settings: dict[str, str], stack: Stack, kinesis: Any, tmp_path: Path
) -> None:
    # GIVEN 8 keys delivered by the producer, 5 of them written a second time, 4 records
    # the ledger never claimed, 5 expected keys never sent (each more than the 3 listed)
    stream = stack.settings.stream
    rows = events(8)
    with stack.producer() as producer:
        producer.send([Message(key, data.encode()) for key, data in rows])
    delivered = [key for key, _ in rows]
    strangers = [f"stranger-{i}" for i in range(4)]
    kinesis.put_records(
        StreamName=stream,
        Records=[put_entry(key, b"again") for key in [*delivered[:5], *strangers]],
    )
    never_sent = [f"never-{i}" for i in range(5)]
    expected = tmp_path / "expected.txt"
    expected.write_text("\n".join([*delivered, *never_sent]) + "\n", encoding="utf-8")
    # and in the ledger: 4 claims in flight, 2 keys DELIVERED that the stream lacks, one
    # DELIVERED at a position its record is not at, one claim unverifiable
    now_ms = stack.clock.now_ms()

    def claims(*keys: str) -> Any:
        messages = [Message(key, key.encode()) for key in keys]
        group, _ = planting.plant_claims(
            stack.ledger, stream, messages, owner="test", now_ms=now_ms, lease_ms=60_000
        )
        return group

    stuck = [f"stuck-{i}" for i in range(4)]
    claims(*stuck)
    lost = ["lost-0", "lost-1"]
    nowhere = Position("shardId-000000000000", "49000000000000000000000000000000000000000000000001")
    planting.plant_delivery(
        stack.ledger, claims(*lost), dict.fromkeys(lost, nowhere), now_ms=now_ms
    )
    put = kinesis.put_record(StreamName=stream, PartitionKey="moved", Data=b"moved")
    elsewhere = Position(put["ShardId"], str(int(put["SequenceNumber"]) + 1))
    planting.plant_delivery(stack.ledger, claims("moved"), {"moved": elsewhere}, now_ms=now_ms)
    unverifiable = plant_unverifiable(stack, "lost-host-key", "data")

    # WHEN the stream is audited on Spark listing 3 keys per anomaly, the ledger read in
    # 3 segments
    frame = spark_audit.findings_frame(
        spark, settings, expected=str(expected), listed=3, segments=3
    )
    found = frame.collect()

    # THEN the driver gets one row whatever the keys: the merged findings
    assert len(found) == 1
    report = Findings.from_json(json.loads(found[0]["findings"])).report(stream, shards=2)
    # AND the counts are exact, each list holds the first 3 keys in key order
    assert report.counts == {
        Anomaly.DUPLICATE: 5,
        Anomaly.EXPECTED_MISSING: 5,
        Anomaly.DELIVERED_MISSING: 2,
        Anomaly.UNKNOWN: 4,
        Anomaly.POSITION_MISMATCH: 1,
        Anomaly.IN_FLIGHT: 4,
        Anomaly.UNVERIFIABLE: 1,
    }
    assert list(report.duplicates) == sorted(delivered[:5])[:3]
    assert report.expected_missing == never_sent[:3]
    assert report.unknown_keys == strangers[:3]
    assert report.in_flight == stuck[:3]
    assert report.missing_delivered == lost
    assert list(report.position_mismatches) == ["moved"]
    assert report.unverifiable == [unverifiable]
    assert (report.user_records, report.expected) == (8 + 5 + 4 + 1, 13)
    # AND it is the report keo audit gives, listing as many keys
    keo_report = audit_stream(
        stack.reader, stack.ledger, expected=[*delivered, *never_sent], listed=3
    )
    assert report.as_json() == keo_report.as_json()


def test_the_spark_replay_audit_reports_what_keo_audit_reports(
    spark: Any,
    settings: dict[str, str],
    stack: Stack,
    kinesis: Any,
    planted: list[str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # GIVEN the JSON lines a run sent: the 20 delivered rows, one of them twice, a row never
    # written, and a key sent again with other data, which the stream holds three times
    rows = events(20)
    twice, changed = rows[5], (rows[7][0], "other data")
    sent = [*rows, twice, ("never-written", "x"), changed]
    stream = stack.settings.stream
    kinesis.put_records(StreamName=stream, Records=[put_entry(changed[0], changed[1].encode())] * 3)
    expected = tmp_path / "run.jsonl"
    expected.write_text(
        "".join(json.dumps({"key": key, "data": data}) + "\n" for key, data in sent),
        encoding="utf-8",
    )

    # WHEN the stream is audited in replay mode on Spark, as python -m spark_jobs.audit does,
    # listing 1 row per anomaly
    argv = [*("--stream", stream, "--expected", str(expected)), "--json", "--list-keys", "1"]
    env = {"KEO_STREAM": stream, **settings}
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        code = spark_audit.main([*argv, "--dedupe", "replay"], session=spark)
    out, err = capsys.readouterr()

    # THEN it fails (exit 1): a copy missing of the row sent twice, the row never written, two
    # extra copies of the changed row, the aggregate's kept record unexpected, one dropped
    report = json.loads(out)
    assert code == 1, err
    assert report["counts"] == {"missing": 2, "duplicated": 1, "unexpected": 1}
    assert report["copies"] == {"missing": 2, "duplicated": 2, "unexpected": 1}
    assert [row["key"] for row in report["missing"]] == [twice[0]]  # the first in key order
    (duplicated,) = report["duplicated"]
    assert (duplicated["key"], duplicated["found"], len(duplicated["positions"])) == (
        changed[0],
        3,
        2,
    )
    assert [row["key"] for row in report["unexpected"]] == [KEPT]
    assert (report["dropped_by_kcl"], report["anomalies"]) == (2, 3)
    # AND it is the report keo audit's reading gives (which knows the lines, Spark does not)
    keo_report = audit_rows(
        stack.reader,
        [ExpectedRow(key, data.encode()) for key, data in sent],
        listed=1,
    )
    assert report == keo_report.as_json()
    assert "verdict: 3 ANOMALIES" in err

    # AND given plain keys, or no --expected, replay mode is a usage error (exit 2)
    keys = tmp_path / "keys.txt"
    keys.write_text("k0000\n", encoding="utf-8")
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        replay = ["--stream", stream, "--dedupe", "replay"]
        assert spark_audit.main([*replay, "--expected", str(keys)], session=spark) == 2
        with pytest.raises(SystemExit) as usage:
            spark_audit.main(replay, session=spark)
    assert usage.value.code == 2
    assert "is not JSON lines: --dedupe replay compares rows" in capsys.readouterr().err


def test_format_keo_registers_on_spark_4_and_is_refused_before_saying_what_to_use(
    spark: Any,
) -> None:
    # WHEN the keo data source is registered on the session's Spark
    if SPARK_VERSION >= (4, 0):
        # THEN on Spark 4 it is there
        spark_jobs.register(spark)
        return
    # THEN on Spark 3.5 it is refused, naming the Spark it needs and what to use instead
    with pytest.raises(spark_jobs.SparkVersionError) as refused:
        spark_jobs.register(spark)
    assert refused.value.running == spark.version
    assert "needs Spark 4.0 or later" in str(refused.value)
    assert "spark_jobs.read_records" in str(refused.value)
