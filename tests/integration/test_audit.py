"""The audit against kinesalite and dynalite: every anomaly a user must hear about is reported.

Anomalies are planted by hand, around what the producer delivered: a second record for a
delivered key (boto3, directly), a record the ledger does not know, a key DELIVERED (its claim
group settled with a position) whose record is not in the stream, a key DELIVERED at a position
that is not its record's, a claim left IN_FLIGHT (its group never settled), and an expected key
that was never sent. ``audit_stream`` and ``keo audit
--json`` must report each of them (exit 1); a clean stream exits 0.
"""

from __future__ import annotations

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
from producer.audit import audit_stream
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


def run_audit(env: dict[str, str], expected: Path) -> tuple[int, dict[str, Any], str]:
    result = subprocess.run(
        [KEO, "audit", "--expected", str(expected), "--json"],
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
