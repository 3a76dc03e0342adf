"""Rows of the fault matrix the other suites do not cover: a stalled producer resuming after
its claim was taken over with the signature fence off (with it on:
``test_signature_fence.py``), a reshard while an aggregating producer holds a stale shard map,
an aggregating producer crashed before its marks, and the same key twice in one batch. Each
ends with the stream read back and audited.

Each runs under the quota mode (AWS's quotas, scaled down so that they bind: a shard's records
a second, a key's and the table's DynamoDB units), once on dynalite (a claim a request) and
once on DynamoDB Local (25 claims a request, the code path AWS runs): the proxies answer what
they admit as the emulators do, so the emulators alone add nothing (CI's time). The producers
write through the quota proxies; the tests read the stream straight from kinesalite, as a KCL
consumer would.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any

import kcl_rule
import pytest
import stacks
import streamcheck

from dedupe_store.clock import SkewedClock, SystemClock
from dedupe_store.records import Position
from devstack import emulators as local_stack
from devstack.dynamodb_quota_proxy import DynamoDbQuotaProxy
from devstack.dynamodb_quotas import DynamoDbQuotas
from devstack.failpoints import FailpointError, Failpoints
from devstack.quota_proxy import KinesisQuotaProxy
from devstack.quotas import KinesisQuotas
from kinesis_store.provisioning import create_stream, wait_active
from producer.audit.stream import audit_stream
from producer.clients import kinesis_client
from producer.outcomes import OutcomeStatus
from producer.protocol import Message
from producer.settings import ProducerSettings, PutFence
from producer.wiring import Stack, build_stack, ledger_from

if TYPE_CHECKING:
    from conftest import Names

# The signature fence on, as by default, with a 1 s window (the emulators do not check
# signatures; the fence's own check runs on every put): the lease is its minimum, 1 + 2 + 2 x 0.5.
FAST: dict[str, Any] = {
    **stacks.FAST,
    "put_fence": "signature",
    "signature_window_s": 1.0,
    "lease_s": 4.0,
}


# The quota mode's figures scaled down to what these tests offer, so that they bind: a shard
# takes 50 records a second and the producer's pacer keeps to 75 (one and a half times: the
# shard throttles, records are resent); a key's item 2 write units a second, the table 200
QUOTAS = KinesisQuotas(shard_write_records_per_s=50)
PACED_ABOVE_QUOTAS = {"put_rate_limit_percent": 7.5}
TABLE_QUOTAS = DynamoDbQuotas(
    key_write_units_per_s=2, table_write_units_per_s=200, table_read_units_per_s=200
)
WORLDS = ["quotas-dynalite", "quotas-dynamodb-local"]


@pytest.fixture(params=WORLDS)
def settings(
    emulators: local_stack.Endpoints, names: Names, request: pytest.FixtureRequest
) -> Iterator[ProducerSettings]:
    """The producers' settings: through the quota mode's proxies (on dynalite or on DynamoDB
    Local), which must have seen their calls."""
    dynamodb = emulators.dynamodb
    if request.param == "quotas-dynamodb-local":
        dynamodb = request.getfixturevalue("dynamodb_local_endpoint")
    direct = ProducerSettings(
        stream=names.stream,
        table=names.table,
        kinesis_endpoint_url=emulators.kinesis,
        dynamodb_endpoint_url=dynamodb,
        **FAST,
    )
    create_stream(kinesis_client(direct, for_put=False), direct.stream, 2, timeout_s=30)
    ledger_from(direct).create_table()
    with ExitStack() as proxies:
        kinesis = proxies.enter_context(KinesisQuotaProxy(emulators.kinesis, QUOTAS))
        ledger = proxies.enter_context(DynamoDbQuotaProxy(dynamodb, TABLE_QUOTAS))
        yield direct.model_copy(
            update={
                "kinesis_endpoint_url": kinesis.endpoint,
                "dynamodb_endpoint_url": ledger.endpoint,
                **PACED_ABOVE_QUOTAS,
            }
        )
        # the producers wrote through the quota mode
        assert kinesis.state.calls["PutRecords"] > 0
        assert ledger.state.calls


@pytest.fixture
def kinesis(emulators: local_stack.Endpoints) -> Any:
    return streamcheck.kinesis_client(emulators.kinesis)


def test_without_the_fence_a_stalled_producer_that_resumes_after_a_take_over_is_reported(
    settings: ProducerSettings, kinesis: Any
) -> None:
    # GIVEN the signature fence off (KEO_PUT_FENCE=off: the documented bound), producer A
    # that stalls for longer than its lease right before its put leaves, after even the
    # send-time lease check (the one window no check on our side can close), and producer B
    settings = settings.model_copy(update={"put_fence": PutFence.OFF})
    stalled, b_done = threading.Event(), threading.Event()
    stack_a, stack_b = build_stack(settings), build_stack(settings)

    def stall(**_: Any) -> None:
        if not stalled.is_set():
            stalled.set()
            assert b_done.wait(timeout=60)  # A resumes only after B took over and delivered

    # registered after the lease deadline's handler: the stall comes after the check passed
    stack_a.writer.client.meta.events.register_last("before-send.kinesis.PutRecords", stall)
    message = Message("stalled-key", b"the payload")
    outcomes: dict[str, Any] = {}

    def run_a() -> None:
        with stack_a.producer(owner="producer-a") as producer:
            outcomes["a"] = producer.send([message])[0]

    thread = threading.Thread(target=run_a)
    # WHEN A stalls, B waits out A's lease, reads back (not there), takes over and sends
    thread.start()
    assert stalled.wait(timeout=30)
    with stack_b.producer(owner="producer-b") as producer:
        outcomes["b"] = producer.send([message])[0]
    b_done.set()
    thread.join(timeout=60)

    # THEN B's write is the canonical one, A's mark fails (TAKEN_OVER, never overwriting), and
    # the duplicate A wrote after resuming is in the stream, reported by the audit
    assert outcomes["b"].status is OutcomeStatus.SENT
    assert outcomes["a"].status is OutcomeStatus.TAKEN_OVER
    record = stack_b.ledger.get(settings.stream, message.key)
    assert record is not None
    assert record.position == outcomes["b"].position
    contents = streamcheck.read_stream(kinesis, settings.stream)
    assert contents.counts[message.key] == 2
    report = audit_stream(stack_b.reader, stack_b.ledger, expected=[message.key])
    assert list(report.duplicates) == [message.key]
    assert not report.clean


def _split_first_shard(client: Any, stream: str) -> None:
    shard = client.list_shards(StreamName=stream)["Shards"][0]
    low = int(shard["HashKeyRange"]["StartingHashKey"])
    high = int(shard["HashKeyRange"]["EndingHashKey"])
    client.split_shard(
        StreamName=stream, ShardToSplit=shard["ShardId"], NewStartingHashKey=str((low + high) // 2)
    )
    wait_active(client, stream, timeout_s=30)


def test_a_reshard_under_an_aggregating_producer_with_a_stale_shard_map(
    settings: ProducerSettings, kinesis: Any
) -> None:
    # GIVEN an aggregating producer that learned the shard map before a split
    stack = build_stack(settings.model_copy(update={"aggregate": True}))
    first = [Message(f"before-{i:03d}", b"x" * 40) for i in range(120)]
    second = [Message(f"after-{i:03d}", b"y" * 40) for i in range(120)]
    with stack.producer(owner="aggregator") as producer:
        assert Counter(o.status for o in producer.send(first)) == {OutcomeStatus.SENT: 120}
        # WHEN the first shard splits, and the producer sends again with its old map
        _split_first_shard(kinesis, settings.stream)
        outcomes = producer.send(second)
    # THEN every member of an aggregate that landed on a shard not covering all its members
    # (the KCL drops it whole) was sent again: a KCL consumer sees every key exactly once,
    # where the ledger says
    assert Counter(o.status for o in outcomes) == {OutcomeStatus.SENT: 120}
    seen = kcl_rule.read_stream(kinesis, settings.stream)
    assert seen.kcl_keys == Counter(m.key for m in first + second)
    records = stack.ledger.batch_get(settings.stream, [m.key for m in first + second])
    assert {r.position for r in records.values()} == {
        Position(r.shard_id, r.sequence_number, r.sub_sequence_number) for r in seen.kcl
    }
    # AND a consumer deaggregating without the KCL's filter sees the stray aggregate's members
    # too: the second batch's first put went whole to one child of the split
    assert seen.dropped_aggregates >= 1
    assert len(seen.unfiltered) > 240


def test_the_same_key_twice_in_one_batch_is_sent_once(
    settings: ProducerSettings, kinesis: Any
) -> None:
    # GIVEN a batch with a key repeated with the same data, and one repeated with other data
    stack: Stack = build_stack(settings)
    batch = [
        Message("twice", b"same"),
        Message("other", b"data"),
        Message("twice", b"same"),
        Message("other", b"changed"),
    ]
    # WHEN it is sent
    with stack.producer() as producer:
        statuses = [o.status for o in producer.send(batch)]
    # THEN the repeat is a DUPLICATE, the changed one a CONFLICT, and each key is there once
    assert statuses == [
        OutcomeStatus.SENT,
        OutcomeStatus.SENT,
        OutcomeStatus.DUPLICATE,
        OutcomeStatus.CONFLICT,
    ]
    contents = streamcheck.read_stream(kinesis, settings.stream)
    streamcheck.assert_exactly_once(contents, ["twice", "other"], stack.ledger)
    streamcheck.assert_only(contents, ["twice", "other"])


def test_an_aggregating_producer_crashed_before_its_marks_is_settled_by_the_reconciler(
    settings: ProducerSettings, kinesis: Any
) -> None:
    # GIVEN an aggregating producer that dies after its put, before any mark
    stack = build_stack(
        settings.model_copy(update={"aggregate": True}), hooks=Failpoints("before_mark=raise")
    )
    batch = [Message(f"agg-{i:03d}", f"payload {i}".encode()) for i in range(150)]
    with stack.producer(owner="crashing") as producer, pytest.raises(FailpointError):
        producer.send(batch)
    # WHEN the reconciler runs once the leases have expired for everyone
    later = build_stack(
        settings.model_copy(update={"aggregate": True}), clock=SkewedClock(SystemClock(), 30_000)
    )
    report = later.reconciler(owner="reconciler").run_once()
    # THEN it finds every user record inside its aggregate (sub-sequence numbers) and marks
    # it; a consumer sees each key once and the ledger points at each one
    assert (report.scanned, report.delivered, report.unresolved) == (150, 150, 0)
    contents = streamcheck.read_stream(kinesis, settings.stream)
    streamcheck.assert_exactly_once(contents, [m.key for m in batch], later.ledger)
    positions = [later.ledger.get(settings.stream, m.key) for m in batch]
    assert all(
        record is not None
        and record.position is not None
        and record.position.sub_sequence_number is not None
        for record in positions
    )
    assert audit_stream(later.reader, later.ledger, expected=[m.key for m in batch]).clean
