"""The audit against kinesalite and dynalite: every anomaly a user must hear about is reported.

Anomalies are planted by hand, around what the producer delivered: a second record for a
delivered key (boto3, directly), a record the ledger does not know, a key DELIVERED (its claim
group settled with a position) whose record is not in the stream, a key DELIVERED at a position
that is not its record's, a claim left IN_FLIGHT (its group never settled), and an expected key
that was never sent. ``audit_stream`` and ``keo audit
--json`` must report each of them (exit 1); a clean stream exits 0.

In replay mode (``keo audit --dedupe replay``) rows are counted, not keys: the stream is written
directly, as a replay-mode writer puts plain records, with identical rows, the same key with
other data, a row in a KPL aggregate and another writer's row; the audit names the rows with
copies missing and the extra copies, and reads no ledger.
"""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import planting
import pytest
import stacks
import streamcheck

from dedupe_store.clock import SystemClock
from dedupe_store.records import Group, Position
from devstack import emulators as local_stack
from kinesis_store.entries import DEFAULT_MAX_RECORD_BYTES, hash_key_of
from kinesis_store.kpl import Aggregate
from producer.audit.stream import audit_stream
from producer.outcomes import OutcomeStatus
from producer.protocol import Message
from producer.settings import ProducerSettings
from producer.wiring import Stack, build_stack

if TYPE_CHECKING:
    from conftest import Names

KEO = str(Path(sys.executable).with_name("keo"))
SHARDS = 2
DUPLICATED = "order-00001"
UNKNOWN = "stranger"
LOST = "ghost"
MOVED = "moved"
STUCK = "stuck"
NEVER_SENT = "never-sent"


@pytest.fixture
def stack(emulators: local_stack.Endpoints, names: Names) -> Stack:
    settings = ProducerSettings(
        stream=names.stream,
        table=names.table,
        kinesis_endpoint_url=emulators.kinesis,
        dynamodb_endpoint_url=emulators.dynamodb,
        region=local_stack.REGION,
    )
    stacks.create_stream_and_table(settings, SHARDS)
    return build_stack(settings)


@pytest.fixture
def kinesis(emulators: local_stack.Endpoints) -> Any:
    return streamcheck.kinesis_client(emulators.kinesis)


@pytest.fixture
def cli_env(env: dict[str, str], names: Names) -> dict[str, str]:
    return {**env, "KEO_STREAM": names.stream, "KEO_TABLE": names.table}


def messages(count: int) -> list[Message]:
    return [Message(f"order-{i:05d}", f'{{"order": {i}}}'.encode()) for i in range(count)]


def deliver(stack: Stack, batch: Sequence[Message]) -> None:
    with stack.producer() as producer:
        outcomes = producer.send(batch)
    assert {o.status for o in outcomes} == {OutcomeStatus.SENT}, outcomes


def claim(stack: Stack, key: str, data: bytes) -> Group:
    """A key claimed in a group of its own, never settled: IN_FLIGHT until its group records it."""
    group, _ = planting.plant_claims(
        stack.ledger,
        stack.settings.stream,
        [Message(key, data)],
        owner="audit-test",
        now_ms=SystemClock().now_ms(),
        lease_ms=60_000,
    )
    return group


def settle(stack: Stack, group: Group, key: str, position: Position) -> None:
    """The group records ``key`` DELIVERED at ``position``, whatever the stream holds."""
    planting.plant_delivery(stack.ledger, group, {key: position}, now_ms=SystemClock().now_ms())


def put_directly(kinesis: Any, stream: str, key: str, data: bytes) -> Position:
    """A record written behind the producer's back, as a stalled or foreign writer would."""
    response = kinesis.put_record(StreamName=stream, PartitionKey=key, Data=data)
    return Position(response["ShardId"], response["SequenceNumber"])


def run_audit(env: dict[str, str], expected: Path, *more: str) -> tuple[int, dict[str, Any], str]:
    result = subprocess.run(
        [KEO, "audit", "--expected", str(expected), "--json", *more],
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    (line,) = [line for line in result.stdout.splitlines() if line.strip()]
    return result.returncode, json.loads(line), result.stderr


def test_a_clean_stream_passes_the_audit(
    stack: Stack, cli_env: dict[str, str], tmp_path: Path
) -> None:
    # GIVEN 40 messages delivered by the producer, and the JSON lines they were sent from
    batch = messages(40)
    deliver(stack, batch)
    source = tmp_path / "orders.jsonl"
    source.write_text(
        "".join(json.dumps({"key": m.key, "data": m.data.decode()}) + "\n" for m in batch),
        encoding="utf-8",
    )

    # WHEN the stream is audited, in process and with `keo audit --expected`
    report = audit_stream(stack.reader, stack.ledger, expected=[m.key for m in batch])
    code, body, stderr = run_audit(cli_env, source)

    # THEN both find every key once, nothing else, and `keo audit` exits 0
    assert report.clean, report
    assert (report.user_records, report.distinct_keys, report.expected) == (40, 40, 40)
    assert code == 0, stderr
    assert body["clean"] is True
    assert body["user_records"] == 40
    assert body["expected"] == 40
    assert body["duplicate_count"] == 0
    assert body["missing_count"] == 0
    assert "CLEAN" in stderr


def test_every_planted_anomaly_is_reported(
    stack: Stack, kinesis: Any, cli_env: dict[str, str], tmp_path: Path
) -> None:
    # GIVEN 10 messages delivered by the producer
    batch = messages(10)
    deliver(stack, batch)
    stream = stack.settings.stream
    data = {m.key: m.data for m in batch}
    # and a second record of a delivered key, written directly
    extra = put_directly(kinesis, stream, DUPLICATED, data[DUPLICATED])
    # and a record whose key the ledger has never seen
    put_directly(kinesis, stream, UNKNOWN, b"who am i")
    # and a key the ledger says DELIVERED whose record is not in the stream (a loss)
    ghost = claim(stack, LOST, b"lost")
    fake = Position("shardId-000000000000", "49000000000000000000000000000000000000000000000001")
    settle(stack, ghost, LOST, fake)
    # and a key in the stream whose DELIVERED position in the ledger is another one
    moved = claim(stack, MOVED, b"moved")
    real = put_directly(kinesis, stream, MOVED, b"moved")
    wrong = Position(real.shard_id, str(int(real.sequence_number) + 1))
    settle(stack, moved, MOVED, wrong)
    # and a claim still IN_FLIGHT
    claim(stack, STUCK, b"stuck")
    # and an expected key that was never sent
    expected = [*data, NEVER_SENT]
    keys_file = tmp_path / "expected.txt"
    keys_file.write_text("\n".join(expected) + "\n", encoding="utf-8")

    # WHEN the stream is audited, in process and with `keo audit --json`
    report = audit_stream(stack.reader, stack.ledger, expected=expected)
    code, body, stderr = run_audit(cli_env, keys_file)

    # THEN the audit reports each anomaly, and only those
    assert not report.clean
    assert list(report.duplicates) == [DUPLICATED]
    (first, second) = report.duplicates[DUPLICATED]
    assert extra in {first, second}
    assert report.unknown_keys == [UNKNOWN]
    assert report.missing_delivered == [LOST]
    assert list(report.position_mismatches) == [MOVED]
    assert report.in_flight == [STUCK]
    assert report.expected_missing == [NEVER_SENT]
    assert report.unverifiable == []
    assert report.anomalies == 6
    assert report.user_records == 10 + 3  # the duplicate, the stranger, the moved record
    # and `keo audit` says the same in its JSON, and exits 1
    assert code == 1, stderr
    assert body["clean"] is False
    assert list(body["duplicates"]) == [DUPLICATED]
    assert len(body["duplicates"][DUPLICATED]) == 2
    assert {"shard_id": extra.shard_id, "sequence_number": extra.sequence_number} in body[
        "duplicates"
    ][DUPLICATED]
    assert body["duplicate_count"] == 1
    assert body["unknown_keys"] == [UNKNOWN]
    assert body["missing_delivered"] == [LOST]
    assert body["expected_missing"] == [NEVER_SENT]
    assert body["missing_count"] == 2
    assert body["position_mismatches"][MOVED]["ledger"] == {
        "shard_id": wrong.shard_id,
        "sequence_number": wrong.sequence_number,
    }
    assert body["in_flight"] == [STUCK]
    assert "6 ANOMALIES" in stderr


def test_keo_audit_says_when_a_stream_is_too_large_for_it(
    stack: Stack, kinesis: Any, cli_env: dict[str, str]
) -> None:
    # GIVEN a stream of 3 keys
    stream = stack.settings.stream
    for key in ("a", "b", "c"):
        put_directly(kinesis, stream, key, b"x")

    # WHEN keo audit may hold 2 keys
    result = subprocess.run(
        [KEO, "audit", "--max-keys", "2", "--json"],
        env=cli_env,
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )

    # THEN it gives no verdict: exit 2, and it names the audit that scales, for this stream
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""
    assert f"stream {stream} holds more than 2 keys: too many to audit in one process" in (
        result.stderr
    )
    table = stack.settings.table
    assert f"python -m spark_jobs.audit --stream {stream} --table {table} --json" in (result.stderr)


# --- replay mode: rows (key, data) counted, no ledger ------------------------------------------

PAID = ("order-1", b'{"status": "paid"}')
REFUNDED = ("order-1", b'{"status": "refunded"}')  # the same key, other data: another row
BLOB = ("blob-1", bytes([0, 255, 254, 10, 13]))  # not UTF-8: --data-encoding base64
NEVER_WRITTEN = ("order-9", b"never written")
FOREIGN = ("invoice-9", b"another writer's")


def rows_file(path: Path, rows: Sequence[tuple[str, bytes]], *, as_base64: bool = False) -> Path:
    """The JSON lines a run sent, one per row, as keo send reads them."""
    lines = []
    for key, data in rows:
        text = base64.b64encode(data).decode("ascii") if as_base64 else data.decode("utf-8")
        lines.append(json.dumps({"key": key, "data": text}) + "\n")
    path.write_text("".join(lines), encoding="utf-8")
    return path


def put_rows(kinesis: Any, stream: str, rows: Sequence[tuple[str, bytes]]) -> list[Position]:
    """Each row as one plain record, in order, as a replay-mode writer puts them."""
    return [put_directly(kinesis, stream, key, data) for key, data in rows]


def put_aggregated(kinesis: Any, stream: str, rows: Sequence[tuple[str, bytes]]) -> None:
    """The rows as one KPL aggregate, every user record routed to the aggregate's shard."""
    aggregate = Aggregate(DEFAULT_MAX_RECORD_BYTES)
    hash_key = str(hash_key_of(rows[0][0]))
    for key, data in rows:
        assert aggregate.add(key, data, hash_key)
    kinesis.put_records(StreamName=stream, Records=[aggregate.entry()])


def test_the_replay_audit_passes_a_stream_that_holds_each_row_as_many_times_as_sent(
    stack: Stack, kinesis: Any, cli_env: dict[str, str], tmp_path: Path
) -> None:
    # GIVEN a run's rows: one twice (two records), the same key with other data, and 5 more,
    # two of which a KPL aggregate carries
    others = [(f"order-{i}", f'{{"n": {i}}}'.encode()) for i in range(2, 7)]
    sent = [PAID, PAID, REFUNDED, *others]
    stream = stack.settings.stream
    put_rows(kinesis, stream, [PAID, REFUNDED, *others[:3], PAID])
    put_aggregated(kinesis, stream, others[3:])
    # and another writer's row in the same stream
    put_rows(kinesis, stream, [FOREIGN])
    expected = rows_file(tmp_path / "run.jsonl", sent)
    # and a ledger table that does not exist: replay mode keeps no per-key state
    env = {**cli_env, "KEO_TABLE": f"{stack.settings.table}-absent"}

    # WHEN the stream is audited in replay mode, and strictly
    code, body, stderr = run_audit(env, expected, "--dedupe", "replay")
    strict_code, strict, _ = run_audit(env, expected, "--dedupe", "replay", "--strict")

    # THEN every row is there as many times as sent: exit 0; the foreign row is only reported
    assert code == 0, stderr
    assert body["clean"] is True
    assert (body["dedupe"], body["user_records"], body["dropped_by_kcl"]) == ("replay", 9, 0)
    assert (body["expected_records"], body["expected_rows"], body["matched_rows"]) == (8, 7, 7)
    assert body["counts"] == {"missing": 0, "duplicated": 0, "unexpected": 1}
    assert [row["key"] for row in body["unexpected"]] == [FOREIGN[0]]
    assert "verdict: CLEAN" in stderr
    # AND the strict audit fails on it (exit 1)
    assert strict_code == 1
    assert strict["clean"] is False
    assert strict["anomalies"] == 1


def test_the_replay_audit_names_the_copies_missing_and_the_extra_copies(
    stack: Stack, kinesis: Any, cli_env: dict[str, str], tmp_path: Path
) -> None:
    # GIVEN a run that sent one row twice, the same key with other data, a binary row, two
    # more rows and a row that was never written; written in base64
    others = [("order-2", b"two"), ("order-3", b"three")]
    sent = [PAID, PAID, REFUNDED, BLOB, *others, NEVER_WRITTEN]
    expected = rows_file(tmp_path / "run.jsonl", sent, as_base64=True)
    # and a stream holding one copy of the row sent twice, and the binary row twice
    stream = stack.settings.stream
    _, blob, _, _, _, extra = put_rows(kinesis, stream, [PAID, BLOB, REFUNDED, *others, BLOB])
    assert (blob.shard_id, int(blob.sequence_number)) < (extra.shard_id, int(extra.sequence_number))

    # WHEN the stream is audited in replay mode
    code, body, stderr = run_audit(
        cli_env, expected, "--dedupe", "replay", "--data-encoding", "base64"
    )

    # THEN it fails (exit 1), naming the rows with copies missing, in key order, and the
    # binary row's extra copy: the later one, at its position
    assert code == 1, stderr
    assert body["counts"] == {"missing": 2, "duplicated": 1, "unexpected": 0}
    assert body["copies"] == {"missing": 2, "duplicated": 1, "unexpected": 0}
    assert [(r["key"], r["line"], r["expected"], r["found"]) for r in body["missing"]] == [
        (PAID[0], 1, 2, 1),
        (NEVER_WRITTEN[0], 7, 1, 0),
    ]
    (duplicated,) = body["duplicated"]
    assert (duplicated["key"], duplicated["line"], duplicated["extra"]) == (BLOB[0], 4, 1)
    assert duplicated["positions"] == [
        {"shard_id": extra.shard_id, "sequence_number": extra.sequence_number}
    ]
    assert (body["user_records"], body["matched_rows"], body["anomalies"]) == (6, 3, 3)
    assert "verdict: 3 ANOMALIES" in stderr


# --- what a KCL consumer gets: a stray aggregate, a malformed one (issue 35) --------------------


def keys_in_half(count: int, *, low: bool) -> list[str]:
    """Keys whose hash key is in the lower (or upper) half: one shard each of a 2-shard stream."""
    keys = (f"order-{i}" for i in range(10_000))
    return [key for key in keys if (hash_key_of(key) < 2**127) == low][:count]


def put_stray_aggregate(kinesis: Any, stream: str, rows: Sequence[tuple[str, bytes]]) -> None:
    """The rows as one KPL aggregate, each user record with its own hash key (as the producer
    packs them), routed by the first: rows of the other shard make it a stray aggregate, as a
    producer with a stale shard map puts across a split."""
    aggregate = Aggregate(DEFAULT_MAX_RECORD_BYTES)
    for key, data in rows:
        assert aggregate.add(key, data, str(hash_key_of(key)))
    kinesis.put_records(StreamName=stream, Records=[aggregate.entry()])


def put_malformed_aggregate(kinesis: Any, stream: str, good: tuple[str, bytes]) -> None:
    """A record with the KPL magic and a valid MD5 whose second user record names a partition
    key outside its table (the KCL delivers the first, drops the second)."""
    from kinesis_store import kpl

    message = kpl._library()[2].AggregatedRecord()
    message.partition_key_table.extend([good[0]])
    message.records.add(partition_key_index=0, data=good[1])
    message.records.add(partition_key_index=3, data=b"never delivered")
    body = message.SerializeToString()
    data = kpl.MAGIC + body + hashlib.md5(body, usedforsecurity=False).digest()
    kinesis.put_records(
        StreamName=stream,
        Records=[
            {"Data": data, "PartitionKey": good[0], "ExplicitHashKey": str(hash_key_of(good[0]))}
        ],
    )


def test_the_audit_counts_a_stray_aggregate_missing_and_reads_past_a_malformed_one(
    stack: Stack, kinesis: Any, cli_env: dict[str, str], tmp_path: Path
) -> None:
    # GIVEN a run's rows: two in an aggregate that strays (its second row belongs to the other
    # shard), one as the first user record of a malformed aggregate, and one plain record after
    (inside, good, after), (outside,) = keys_in_half(3, low=True), keys_in_half(1, low=False)
    rows = {key: f'{{"k": "{key}"}}'.encode() for key in (inside, outside, good, after)}
    stream = stack.settings.stream
    put_stray_aggregate(kinesis, stream, [(inside, rows[inside]), (outside, rows[outside])])
    put_malformed_aggregate(kinesis, stream, (good, rows[good]))
    put_rows(kinesis, stream, [(after, rows[after])])
    expected = rows_file(tmp_path / "run.jsonl", list(rows.items()))

    # WHEN the stream is audited, in replay mode with `keo audit` and in process by key
    code, body, stderr = run_audit(cli_env, expected, "--dedupe", "replay")
    report = audit_stream(stack.reader, None, expected=list(rows))

    # THEN neither row of the stray aggregate counts as delivered: a KCL consumer gets neither
    # (before: `inside` was counted delivered), and the audit fails on them
    assert code == 1, stderr
    assert sorted(r["key"] for r in body["missing"]) == sorted([inside, outside])
    assert body["dropped_by_kcl"] == 2
    assert sorted(report.expected_missing) == sorted([inside, outside])
    assert report.dropped_by_kcl == 2
    # AND the malformed aggregate stops neither audit (before: AggregationFormatError): its
    # first row and the record after it are delivered, and it is counted
    assert (body["user_records"], body["malformed_aggregates"]) == (2, 1)
    assert (report.user_records, report.malformed_aggregates) == (2, 1)
    assert "malformed aggregates: 1" in stderr
