"""The produce path end to end against kinesalite and a DynamoDB, with injected faults.

Each test runs on dynalite and on Amazon's DynamoDB Local (the module's ``emulators`` is the
session's stack with one or the other as its DynamoDB, ``keo`` subprocesses included), except
those marked ``one_dynamodb``, to which DynamoDB's own answers do not matter (Kinesis's faults,
or a ledger fault injected before its request leaves): dynalite alone keeps CI's time.

Every test ends the same way: read the whole stream back (``streamcheck``, independent of the
product's reader) and check that every key is there exactly once (at most once where the
outcome says IN_FLIGHT) and that the ledger's DELIVERED position is the record's position.

Leases are short so that read-back waits are short: put timeouts 1 s + 1 s, skew 0.5 s, lease
4 s. The signature fence is on, as by default, with a 1 s window (the emulators do not check
signatures: the fence's own check runs on every put here, the window is enforced by the fault
proxy in ``test_signature_fence.py``); the lease is then exactly its minimum, 1 + 2 + 2 x 0.5,
and a put leaves while 1.5 s of it are left, so a claim made on a slow machine still needs no
renewal before its put (which would change the attempt numbers these tests look at).

Ledger schema v2: a producer opens one claim group per chunk (500 keys by default), claims each
key for it with one write, and settles the group with every position in one write. Tests that
need several settles in one send ask for small groups (``group_size``).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import botocore.exceptions
import pytest
import stacks
import streamcheck
from prometheus_client import REGISTRY

from dedupe_store.clock import Clock, ManualClock
from dedupe_store.settings import BatchClaims
from dedupe_store.states import LedgerState
from devstack import emulators as local_stack
from devstack.faults import FaultInjector, FaultKind, UpdateTarget
from producer.key.producer import ExactlyOnceProducer
from producer.outcomes import Outcome, OutcomeStatus
from producer.protocol import Message, batches, prepare
from producer.settings import ProducerSettings
from producer.wiring import Stack, build_stack, ledger_from, policy_from

if TYPE_CHECKING:
    from conftest import Names

KEO = str(Path(sys.executable).with_name("keo"))
SHARDS = 4
FAST: dict[str, Any] = {
    "put_connect_timeout_s": 1.0,
    "put_read_timeout_s": 1.0,
    "clock_skew_s": 0.5,
    "lease_s": 4.0,
    "signature_window_s": 1.0,
    "wait_initial_s": 0.05,
    "wait_max_s": 0.5,
    # one try per ledger call: each injected DynamoDB fault is then one failed call
    "ledger_max_retry_attempts": 0,
}
FAST_ENV = {
    "KEO_PUT_CONNECT_TIMEOUT_S": "1",
    "KEO_PUT_READ_TIMEOUT_S": "1",
    "KEO_CLOCK_SKEW_S": "0.5",
    "KEO_LEASE_S": "4",
    "KEO_SIGNATURE_WINDOW_S": "1",
    "KEO_WAIT_INITIAL_S": "0.05",
    "KEO_WAIT_MAX_S": "0.5",
}

StackFactory = Callable[..., Stack]


# --- fixtures and helpers -----------------------------------------------------------------------


def settings_for(
    emulators: local_stack.Endpoints, names: Names, **overrides: Any
) -> ProducerSettings:
    return stacks.settings_for(emulators, names, FAST, **overrides)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "emulators" not in metafunc.fixturenames:
        return
    one_dynamodb = metafunc.definition.get_closest_marker("one_dynamodb") is not None
    dynamodbs = [local_stack.DYNALITE] if one_dynamodb else list(local_stack.DYNAMODB_EMULATORS)
    metafunc.parametrize("emulators", dynamodbs, indirect=True)


@pytest.fixture
def emulators(
    request: pytest.FixtureRequest, emulators: local_stack.Endpoints
) -> local_stack.Endpoints:
    """The session's stack, its DynamoDB the one this run of the test is on."""
    if request.param == local_stack.DYNALITE:
        return emulators
    endpoint: str = request.getfixturevalue("dynamodb_local_endpoint")
    return dataclasses.replace(emulators, dynamodb=endpoint, dynamodb_emulator=request.param)


@pytest.fixture
def make_stack(emulators: local_stack.Endpoints, names: Names) -> StackFactory:
    """Stacks (clients and producer wiring) on this test's stream and table, created once."""
    created = False

    def make(*, clock: Clock | None = None, **overrides: Any) -> Stack:
        nonlocal created
        settings = settings_for(emulators, names, **overrides)
        if not created:
            stacks.create_stream_and_table(settings, SHARDS)
            created = True
        return build_stack(settings, clock=clock)

    return make


@pytest.fixture
def stack(make_stack: StackFactory) -> Stack:
    return make_stack()


@pytest.fixture
def kinesis(emulators: local_stack.Endpoints) -> Any:
    return streamcheck.kinesis_client(emulators.kinesis)


def messages(count: int, prefix: str = "order", *, routed: bool = False) -> list[Message]:
    """``routed``: every other message is routed by a customer key instead of its own key."""
    return [
        Message(
            f"{prefix}-{i:05d}",
            json.dumps({"order": i, "total": i * 7}).encode(),
            routing_key=f"customer-{i % 7}" if routed and i % 2 else None,
        )
        for i in range(count)
    ]


def payloads(batch: Sequence[Message]) -> dict[str, bytes]:
    return {m.key: m.data for m in batch}


def send(
    stack: Stack,
    batch: Sequence[Message],
    *,
    owner: str | None = None,
    group_size: int | None = None,
) -> list[Outcome]:
    """``group_size``: at most this many keys per claim group (one settle each)."""
    with producer_of(stack, owner=owner, group_size=group_size) as producer:
        return producer.send(batch)


def producer_of(
    stack: Stack, *, owner: str | None = None, group_size: int | None = None
) -> ExactlyOnceProducer:
    if group_size is None:
        return stack.producer(owner=owner)
    # Stack.producer's wiring, with smaller claim groups (no setting chooses the group size)
    return ExactlyOnceProducer(
        stream=stack.settings.stream,
        ledger=stack.ledger,
        writer=stack.writer,
        clock=stack.clock,
        policy=dataclasses.replace(policy_from(stack.settings), group_size=group_size),
        resolver=stack.resolver(),
        owner=owner or stack.settings.owner,
        max_record_bytes=stack.settings.max_record_bytes or stack.info.max_record_bytes,
        shard_map=stack.reader.shards if stack.settings.aggregate else None,
        hooks=stack.hooks,
    )


def statuses(outcomes: Sequence[Outcome]) -> Counter[OutcomeStatus]:
    return Counter(o.status for o in outcomes)


def keys_with(outcomes: Sequence[Outcome], status: OutcomeStatus) -> list[str]:
    return [str(o.key) for o in outcomes if o.status is status]


def read_backs(stream: str, resolution: str) -> float:
    value = REGISTRY.get_sample_value(
        "keo_read_backs_total", {"stream": stream, "resolution": resolution}
    )
    return value or 0.0


def assert_stream_is_exactly(
    kinesis: Any, stack: Stack, batch: Sequence[Message]
) -> streamcheck.StreamContents:
    """The stream holds each message of ``batch`` once, nothing else; the ledger agrees."""
    contents = streamcheck.read_stream(kinesis, stack.settings.stream)
    streamcheck.assert_exactly_once(
        contents, [m.key for m in batch], stack.ledger, payloads=payloads(batch)
    )
    streamcheck.assert_only(contents, [m.key for m in batch])
    return contents


# --- the happy path -----------------------------------------------------------------------------


def test_300_messages_are_delivered_once_and_a_resend_adds_nothing(
    make_stack: StackFactory, kinesis: Any
) -> None:
    # GIVEN 300 messages and a 4-shard stream (a longer lease: 300 claims take a while here)
    stack = make_stack(lease_s=15.0)
    batch = messages(300)
    # WHEN they are sent
    first = send(stack, batch)
    # THEN every one is SENT at a position, in input order, over all shards
    assert [o.key for o in first] == [m.key for m in batch]
    assert statuses(first) == {OutcomeStatus.SENT: 300}
    assert all(o.position is not None and o.attempt == 1 and o.ledger_marked for o in first)
    contents = assert_stream_is_exactly(kinesis, stack, batch)
    assert len(contents.per_shard()) == SHARDS
    # WHEN the same input is sent again
    second = send(stack, batch)
    # THEN all are DUPLICATE at the positions of the first send, and the stream is unchanged
    assert statuses(second) == {OutcomeStatus.DUPLICATE: 300}
    assert [o.position for o in second] == [o.position for o in first]
    again = assert_stream_is_exactly(kinesis, stack, batch)
    assert len(again.records) == 300


def test_a_resend_of_a_500_key_group_judges_its_keys_100_to_a_read(
    make_stack: StackFactory, kinesis: Any, emulators: local_stack.Endpoints
) -> None:
    # GIVEN 500 messages, one claim group (a longer lease: 500 claims take a while here)
    stack = make_stack(lease_s=15.0)
    batch = messages(500)
    operations: list[str] = []
    stack.ledger.client.meta.events.register(
        "before-call.dynamodb.*", lambda model, **_: operations.append(model.name)
    )
    # WHEN they are sent
    first = send(stack, batch)
    # THEN, on DynamoDB Local, the group of new keys is opened, claimed 25 to a request and
    # settled, and reads nothing
    assert statuses(first) == {OutcomeStatus.SENT: 500}
    batched = emulators.dynamodb_emulator == local_stack.DYNAMODB_LOCAL
    if batched:
        assert Counter(operations) == {"PutItem": 1, "BatchExecuteStatement": 20, "UpdateItem": 1}
    # WHEN they are sent again
    operations.clear()
    second = send(stack, batch)
    # THEN all are DUPLICATE: on DynamoDB Local the 20 batches' keys were judged together, 5
    # reads of 100 (20 of 25 before), and their group read once: 28 requests for 500 messages;
    # on dynalite (no PartiQL) a failed claim each
    assert statuses(second) == {OutcomeStatus.DUPLICATE: 500}
    assert Counter(operations) == (
        {"PutItem": 1, "BatchExecuteStatement": 20, "BatchGetItem": 5 + 1, "UpdateItem": 1}
        if batched
        else {"PutItem": 1, "UpdateItem": 500 + 1, "BatchGetItem": 1}
    )
    assert_stream_is_exactly(kinesis, stack, batch)


# --- PutRecords: whole-request faults -----------------------------------------------------------


@pytest.mark.one_dynamodb
@pytest.mark.parametrize(
    ("kind", "read_back"),
    [
        # written, but the caller cannot know: read back at once, found
        pytest.param(FaultKind.LOST_RESPONSE, "FOUND", id="response-lost-after-write"),
        # ... lost on the wire, where an SDK retry would write it again: the put client's
        # retries are off, so it is read back instead
        pytest.param(FaultKind.RESPONSE_LOST_IN_TRANSIT, "FOUND", id="response-lost-in-transit"),
        pytest.param(FaultKind.SERVER_ERROR_AFTER_WRITE, "FOUND", id="5xx-after-write"),
        # not written, but the caller cannot know: after the lease, not found, taken over
        pytest.param(FaultKind.TIMEOUT_BEFORE_SEND, "NOT_FOUND", id="timeout-before-send"),
        pytest.param(FaultKind.SERVER_ERROR_BEFORE_WRITE, "NOT_FOUND", id="5xx-before-write"),
    ],
)
def test_an_ambiguous_put_is_resolved_by_read_back(
    stack: Stack, kinesis: Any, kind: FaultKind, read_back: str
) -> None:
    # GIVEN the first PutRecords call of a send fails ambiguously (all of its 40 records,
    # half of them routed by another key than their own)
    batch = messages(40, routed=True)
    stream = stack.settings.stream
    with FaultInjector(stack.writer._client, seed=1) as faults:
        faults.add(kind, operations=["PutRecords"], count=1)
        # WHEN the messages are sent
        outcomes = send(stack, batch)
    # THEN the producer read the stream back instead of resending blindly, and every
    # message is SENT once: found where it was written, or sent again after its lease
    assert faults.injected == {kind.value: 1}
    assert statuses(outcomes) == {OutcomeStatus.SENT: 40}
    assert read_backs(stream, read_back) == 40
    if read_back == "FOUND":
        assert read_backs(stream, "NOT_FOUND") == 0
    else:
        assert all((o.attempt or 0) >= 2 for o in outcomes)  # a new attempt after take-over
    assert_stream_is_exactly(kinesis, stack, batch)


@pytest.mark.one_dynamodb
@pytest.mark.parametrize(
    "kind",
    [
        pytest.param(FaultKind.UNAVAILABLE, id="endpoint-unreachable"),
        pytest.param(FaultKind.THROTTLE, id="request-throttled-400"),
    ],
)
def test_a_put_that_never_left_is_resent_at_once(
    stack: Stack, kinesis: Any, kind: FaultKind
) -> None:
    # GIVEN the first two PutRecords calls fail in a way that proves nothing was written
    batch = messages(40)
    with FaultInjector(stack.writer._client, seed=2) as faults:
        faults.add(kind, operations=["PutRecords"], count=2)
        # WHEN the messages are sent
        outcomes = send(stack, batch)
    # THEN they are resent under the same claim, with no read-back, and delivered once
    assert faults.injected == {kind.value: 2}
    assert statuses(outcomes) == {OutcomeStatus.SENT: 40}
    assert read_backs(stack.settings.stream, "FOUND") == 0
    assert read_backs(stack.settings.stream, "NOT_FOUND") == 0
    assert_stream_is_exactly(kinesis, stack, batch)


@pytest.mark.one_dynamodb
def test_a_tls_error_during_a_put_is_ambiguous_and_resolved_by_read_back(
    stack: Stack, kinesis: Any
) -> None:
    # GIVEN the first PutRecords call dies with a TLS error (a reset while the request or the
    # response is on the wire: it may or may not have been applied)
    batch = messages(20)
    raised = threading.Event()

    def tls_error_once(request: Any, **_: Any) -> None:
        if not raised.is_set():
            raised.set()
            raise botocore.exceptions.SSLError(
                endpoint_url=request.url, error=OSError("EOF occurred in violation of protocol")
            )

    stack.writer._client.meta.events.register("before-send.kinesis.PutRecords", tls_error_once)
    # WHEN the messages are sent
    outcomes = send(stack, batch)
    # THEN it is treated as ambiguous: read back, taken over after the lease, delivered once
    assert statuses(outcomes) == {OutcomeStatus.SENT: 20}
    assert_stream_is_exactly(kinesis, stack, batch)


# --- PutRecords: per-record failures ------------------------------------------------------------


@pytest.mark.one_dynamodb
def test_records_throttled_or_failed_inside_a_put_are_resent_once(
    stack: Stack, kinesis: Any
) -> None:
    # GIVEN PutRecords calls where some records come back ProvisionedThroughputExceeded or
    # InternalFailure (and were truly not written), for several calls in a row
    batch = messages(120)
    with FaultInjector(stack.writer._client, seed=3) as faults:
        faults.partial_throttle(count=1, records=[0, 1, 2, 50, 119])
        faults.partial_internal_failure(count=1, records=[3, 60])
        faults.partial_throttle(probability=0.5, record_probability=0.2)
        # WHEN the messages are sent
        outcomes = send(stack, batch)
    # THEN the failed records were resent under the same claim until written, once each
    assert faults.failed_records[FaultKind.PARTIAL_THROTTLE.value] >= 5
    assert faults.failed_records[FaultKind.PARTIAL_INTERNAL_FAILURE.value] == 2
    assert statuses(outcomes) == {OutcomeStatus.SENT: 120}
    assert read_backs(stack.settings.stream, "FOUND") == 0
    assert read_backs(stack.settings.stream, "NOT_FOUND") == 0
    assert_stream_is_exactly(kinesis, stack, batch)


@pytest.mark.one_dynamodb
def test_a_put_whose_every_record_is_throttled_is_retried(stack: Stack, kinesis: Any) -> None:
    # GIVEN the first PutRecords call gets ProvisionedThroughputExceeded for every record
    batch = messages(10)
    with FaultInjector(stack.writer._client, seed=4) as faults:
        faults.partial_throttle(count=1)
        # WHEN the messages are sent
        outcomes = send(stack, batch)
    # THEN all are resent and delivered once
    assert faults.failed_records == {FaultKind.PARTIAL_THROTTLE.value: 10}
    assert statuses(outcomes) == {OutcomeStatus.SENT: 10}
    assert_stream_is_exactly(kinesis, stack, batch)


def test_throttling_that_outlasts_the_retries_releases_the_claims_for_a_later_send(
    make_stack: StackFactory, kinesis: Any
) -> None:
    # GIVEN every record of every PutRecords call is throttled, and 3 put attempts allowed
    # (a longer lease: no renewal may change the attempt numbers looked at)
    stack = make_stack(put_max_attempts=3, lease_s=10.0)
    batch = messages(10)
    with FaultInjector(stack.writer._client, seed=8) as faults:
        faults.partial_throttle(probability=1.0)
        # WHEN the messages are sent
        first = send(stack, batch)
    # THEN they are FAILED (not written, with the reason), their claims RELEASED, the stream empty
    assert faults.injected == {FaultKind.PARTIAL_THROTTLE.value: 3}
    assert statuses(first) == {OutcomeStatus.FAILED: 10}
    assert all("ProvisionedThroughputExceededException" in str(o.reason) for o in first)
    ledger = stack.ledger.batch_get(stack.settings.stream, [m.key for m in batch])
    assert {r.state for r in ledger.values()} == {LedgerState.RELEASED}
    assert streamcheck.read_stream(kinesis, stack.settings.stream).records == []
    # WHEN they are sent again, Kinesis healthy
    second = send(stack, batch)
    # THEN the released claims are claimed again (attempt 2) and delivered once
    assert statuses(second) == {OutcomeStatus.SENT: 10}
    assert all(o.attempt == 2 for o in second)
    assert_stream_is_exactly(kinesis, stack, batch)


class SteppingClock:
    """Wall-clock time plus an offset a test can move forward (a stalled producer)."""

    def __init__(self) -> None:
        self.offset_ms = 0

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000 + self.offset_ms


def test_claims_too_short_to_outlive_a_put_are_renewed_before_the_put(
    make_stack: StackFactory, kinesis: Any
) -> None:
    # GIVEN a producer that stalls between its claims and its put until its group's lease has
    # 1 s left: less than the fence's window + skew (1.5 s), more than the skew (0.5 s), so
    # that no claim may be put under it and the lease may still be renewed
    clock = SteppingClock()
    stack = make_stack(clock=clock)
    batch = messages(20)
    updates = Counter[str]()
    lock = threading.Lock()

    def stall_after_the_claims(model: Any, parsed: Any, **_: Any) -> None:
        # a claim is an UpdateItem, or a statement of a batch (PartiQL, on DynamoDB Local)
        batched = model.name == "BatchExecuteStatement"
        with lock:
            updates["claims"] += len(parsed.get("Responses", [])) if batched else 1
            if updates["claims"] == len(batch):
                claim = stack.ledger.get_claim(stack.settings.stream, batch[0].key)
                assert claim is not None
                group = stack.ledger.get_group(stack.settings.stream, claim.group_id)
                assert group is not None
                clock.offset_ms += group.lease_expires_at_ms - 1_000 - clock.now_ms()

    for operation in ("UpdateItem", "BatchExecuteStatement"):
        stack.ledger.client.meta.events.register(
            f"after-call.dynamodb.{operation}", stall_after_the_claims
        )
    # WHEN the messages are sent
    outcomes = send(stack, batch)
    # THEN the group's lease was renewed before the put, in one write for all 20 keys (its
    # epoch 2, the keys' attempt still 1), and the group settled: 20 claims, 1 renewal, 1 settle
    assert statuses(outcomes) == {OutcomeStatus.SENT: 20}
    assert {o.attempt for o in outcomes} == {1}
    records = stack.ledger.batch_get(stack.settings.stream, [m.key for m in batch])
    (group_id,) = {record.group_id for record in records.values()}
    assert group_id is not None
    group = stack.ledger.get_group(stack.settings.stream, group_id)
    assert group is not None
    assert (group.state.value, group.epoch) == ("SETTLED", 2)
    assert updates["claims"] == 20 + 1 + 1  # key writes: claims (one a request, or batched)
    assert_stream_is_exactly(kinesis, stack, batch)


# --- KPL aggregation ----------------------------------------------------------------------------


@pytest.mark.one_dynamodb
def test_aggregated_records_are_delivered_once_and_found_by_read_back(
    make_stack: StackFactory, kinesis: Any
) -> None:
    # GIVEN aggregation on, and the first PutRecords call's response lost after the write
    stack = make_stack(aggregate=True)
    batch = messages(60)
    with FaultInjector(stack.writer._client, seed=9) as faults:
        faults.lost_response(count=1)
        # WHEN the messages are sent
        outcomes = send(stack, batch)
    # THEN read-back finds every user record inside the aggregates: SENT at its sub-sequence
    assert faults.injected == {FaultKind.LOST_RESPONSE.value: 1}
    assert statuses(outcomes) == {OutcomeStatus.SENT: 60}
    assert read_backs(stack.settings.stream, "FOUND") == 60
    assert all(o.position and o.position.sub_sequence_number is not None for o in outcomes)
    contents = assert_stream_is_exactly(kinesis, stack, batch)
    assert all(r.aggregated for r in contents.records)
    # and a resend is all DUPLICATE at the same positions
    again = send(stack, batch)
    assert statuses(again) == {OutcomeStatus.DUPLICATE: 60}
    assert [o.position for o in again] == [o.position for o in outcomes]
    assert_stream_is_exactly(kinesis, stack, batch)


# --- DynamoDB faults at claim and at mark -------------------------------------------------------


@pytest.mark.parametrize("target", [UpdateTarget.CLAIM, UpdateTarget.MARK])
def test_an_sdk_retry_of_a_ledger_write_that_had_applied_is_recognised(
    make_stack: StackFactory, kinesis: Any, target: UpdateTarget
) -> None:
    # GIVEN the ledger's SDK retries once, and five claims (or group settles) are applied but
    # their responses are lost on the wire, so the SDK sends the very same request again
    # (a longer lease: the SDK's backoff must not make claims short enough to be renewed;
    # claims one a request: a batch's retry is test_ledger_contract.py's)
    stack = make_stack(
        ledger_max_retry_attempts=1, lease_s=30.0, ledger_batch_claims=BatchClaims.OFF
    )
    batch = messages(20)
    outcomes: list[Outcome] = []
    injected = Counter[str]()
    # WHEN the messages are sent, four at a time (one claim group each): one claim (or the
    # settle) of each send is hit. One fault at a time, so that only first tries are hit:
    # a retry can come at once (the SDK's backoff is random), before other first tries
    for start in range(0, len(batch), 4):
        with FaultInjector(stack.ledger.client, seed=10) as faults:
            faults.response_lost_in_transit(operations=["UpdateItem"], target=target, count=1)
            outcomes += send(stack, batch[start : start + 4])
        injected += faults.injected
    # THEN each retried write recognises its own first try (its condition now fails on its
    # own effect): claims won, settles applied, every message SENT once under attempt 1
    assert injected == {FaultKind.RESPONSE_LOST_IN_TRANSIT.value: 5}
    assert statuses(outcomes) == {OutcomeStatus.SENT: 20}
    assert all(o.attempt == 1 and o.ledger_marked for o in outcomes)
    assert_stream_is_exactly(kinesis, stack, batch)


@pytest.mark.parametrize(
    "kind",
    [
        pytest.param(FaultKind.THROTTLE, id="throttled"),
        pytest.param(FaultKind.UNAVAILABLE, id="unreachable"),
        # the claim applied, its response was lost: the key is held by a claim nobody sends
        pytest.param(FaultKind.LOST_RESPONSE, id="response-lost"),
    ],
)
def test_a_claim_that_fails_sends_nothing_and_a_second_send_delivers_once(
    make_stack: StackFactory, kinesis: Any, kind: FaultKind
) -> None:
    # GIVEN DynamoDB fails five claims, claimed one a request (a batch's faults:
    # test_ledger_contract.py's batch cases)
    stack = make_stack(ledger_batch_claims=BatchClaims.OFF)
    batch = messages(30)
    with FaultInjector(stack.ledger.client, seed=5) as faults:
        faults.add(kind, operations=["UpdateItem"], target=UpdateTarget.CLAIM, count=5)
        # WHEN the messages are sent
        first = send(stack, batch)
    # THEN those five are FAILED and not in the stream; the others are delivered once
    assert faults.injected == {kind.value: 5}
    failed = keys_with(first, OutcomeStatus.FAILED)
    assert len(failed) == 5
    assert all("ledger unavailable at claim" in str(o.reason) for o in first if o.key in failed)
    assert statuses(first)[OutcomeStatus.SENT] == 25
    contents = streamcheck.read_stream(kinesis, stack.settings.stream)
    streamcheck.assert_absent(contents, failed)
    sent = [m for m in batch if m.key not in failed]
    streamcheck.assert_exactly_once(contents, [m.key for m in sent], stack.ledger)
    # WHEN the same input is sent again, DynamoDB healthy
    second = send(stack, batch)
    # THEN the five are SENT (after the orphaned claim's lease, when one was left), the rest
    # are DUPLICATE, and every key is in the stream once
    assert sorted(keys_with(second, OutcomeStatus.SENT)) == sorted(failed)
    assert statuses(second)[OutcomeStatus.DUPLICATE] == 25
    assert_stream_is_exactly(kinesis, stack, batch)


@pytest.mark.one_dynamodb
@pytest.mark.parametrize(
    "kind",
    [
        pytest.param(FaultKind.THROTTLE, id="throttled"),
        pytest.param(FaultKind.UNAVAILABLE, id="unreachable"),
        pytest.param(FaultKind.SERVER_ERROR_BEFORE_WRITE, id="5xx"),
    ],
)
def test_a_mark_that_fails_leaves_the_record_once_and_a_resend_reads_it_back(
    stack: Stack, kinesis: Any, kind: FaultKind
) -> None:
    # GIVEN DynamoDB fails the settle of one claim group of five keys (its records are already
    # in the stream), of six groups
    batch = messages(30)
    with FaultInjector(stack.ledger.client, seed=6) as faults:
        faults.add(kind, operations=["UpdateItem"], target=UpdateTarget.MARK, count=1)
        # WHEN the messages are sent
        first = send(stack, batch, group_size=5)
    # THEN all are SENT; five say the ledger was not marked; each key is in the stream once
    assert faults.injected == {kind.value: 1}
    assert statuses(first) == {OutcomeStatus.SENT: 30}
    unmarked = [str(o.key) for o in first if not o.ledger_marked]
    assert len(unmarked) == 5
    contents = streamcheck.read_stream(kinesis, stack.settings.stream)
    assert all(contents.counts[m.key] == 1 for m in batch)
    in_flight = stack.ledger.batch_get(stack.settings.stream, unmarked)
    assert {r.state for r in in_flight.values()} == {LedgerState.IN_FLIGHT}
    # WHEN the same input is sent again by another producer
    second = send(stack, batch)
    # THEN nothing is written again: the five are found by read-back once their lease is
    # over and reported DUPLICATE at the positions of the first send
    assert statuses(second) == {OutcomeStatus.DUPLICATE: 30}
    assert read_backs(stack.settings.stream, "FOUND") == 5
    assert {o.key: o.position for o in second} == {o.key: o.position for o in first}
    contents = streamcheck.read_stream(kinesis, stack.settings.stream)
    assert all(contents.counts[m.key] == 1 for m in batch)
    # WHEN the reconciler runs (in v2 the group's owner or the reconciler records positions
    # in a group: a producer that finds another's record reports it and writes nothing)
    report = stack.reconciler(owner="reconciler").run_once()
    # THEN the ledger names every position, and the stream is unchanged
    assert (report.groups, report.delivered, report.unresolved) == (1, 5, 0), report.as_json()
    assert_stream_is_exactly(kinesis, stack, batch)


def test_a_mark_whose_response_is_lost_is_already_delivered(stack: Stack, kinesis: Any) -> None:
    # GIVEN the settle of one claim group of five keys, of four, is applied but its response
    # is lost
    batch = messages(20)
    with FaultInjector(stack.ledger.client, seed=7) as faults:
        faults.lost_response(operations=["UpdateItem"], target=UpdateTarget.MARK, count=1)
        first = send(stack, batch, group_size=5)
    # THEN they are SENT, reported unmarked (the producer cannot know), yet the ledger has them
    assert faults.injected == {FaultKind.LOST_RESPONSE.value: 1}
    assert statuses(first) == {OutcomeStatus.SENT: 20}
    assert sum(1 for o in first if not o.ledger_marked) == 5
    assert_stream_is_exactly(kinesis, stack, batch)
    # and a resend is DUPLICATE at once
    assert statuses(send(stack, batch)) == {OutcomeStatus.DUPLICATE: 20}
    assert_stream_is_exactly(kinesis, stack, batch)


# --- concurrency --------------------------------------------------------------------------------


def test_two_producers_sending_the_same_keys_at_once_deliver_each_once(
    make_stack: StackFactory, kinesis: Any
) -> None:
    # GIVEN two producers (own clients, own identities) and the same 200 messages
    batch = messages(200)
    stacks = [make_stack(lease_s=15.0), make_stack(lease_s=15.0)]
    start = threading.Barrier(2)

    def run(index: int) -> list[Outcome]:
        start.wait()
        return send(stacks[index], batch, owner=f"producer-{index}")

    # WHEN both send at the same moment
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(run, [0, 1]))
    # THEN each key was SENT by exactly one of them and is a DUPLICATE for the other
    for index, outcome in enumerate(results[0]):
        other = results[1][index]
        assert {outcome.status, other.status} == {OutcomeStatus.SENT, OutcomeStatus.DUPLICATE}, (
            outcome,
            other,
        )
        assert outcome.position == other.position
    assert_stream_is_exactly(kinesis, stacks[0], batch)


def test_two_processes_sending_the_same_file_at_once_deliver_each_once(
    stack: Stack, kinesis: Any, env: dict[str, str], tmp_path: Path
) -> None:
    # GIVEN a file of 60 messages and two `keo send` processes on the same stream and table
    batch = messages(60)
    source = write_jsonl(tmp_path / "orders.jsonl", batch)
    command = [KEO, "send", "--input", str(source), "--stream", stack.settings.stream]
    command += ["--table", stack.settings.table, "--no-progress"]
    process_env = {**env, **FAST_ENV}
    # WHEN both run at once
    processes = [
        subprocess.Popen(command, env=process_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        for _ in range(2)
    ]
    results = [p.communicate(timeout=120) for p in processes]
    # THEN both succeed; every key is SENT by one and DUPLICATE for the other
    for process, (_, stderr) in zip(processes, results, strict=True):
        assert process.returncode == 0, stderr.decode()
    outcomes = [parse_outcomes(stdout) for stdout, _ in results]
    for line_a, line_b in zip(*outcomes, strict=True):
        assert {line_a["status"], line_b["status"]} == {"SENT", "DUPLICATE"}, (line_a, line_b)
    assert_stream_is_exactly(kinesis, stack, batch)


def test_two_producers_with_one_owner_claiming_in_the_same_millisecond_deliver_once(
    make_stack: StackFactory, kinesis: Any
) -> None:
    # GIVEN two producers configured with the same owner (KEO_OWNER set fleet-wide, e.g. two
    # speculative Spark tasks of one batch); the clock stands still so that their claims fall
    # in the same millisecond, which real clocks do now and then
    clock = ManualClock(time.time_ns() // 1_000_000)
    # the fence off: it compares a request's signing time (the wall clock's) with a lease
    # told by this clock, which stands still while the wall clock runs on
    stack_a = make_stack(clock=clock, put_fence="off")
    stack_b = make_stack(clock=clock, put_fence="off")
    batch = messages(10)
    # ... and A, having claimed, is held just before its put until B has made its claims
    a_at_put, b_claimed = threading.Event(), threading.Event()
    b_claims = Counter[str]()
    lock = threading.Lock()

    def hold_a(**_: Any) -> None:
        a_at_put.set()
        b_claimed.wait(timeout=30)

    def count_b(model: Any, parsed: dict[str, Any], **_: Any) -> None:
        # a claim is an UpdateItem, or one statement of a BatchExecuteStatement where the
        # backend runs PartiQL (DynamoDB Local): B has claimed once it has tried every key
        with lock:
            if model.name == "BatchExecuteStatement":
                b_claims["tried"] += len(parsed.get("Responses", []))
            else:
                b_claims["tried"] += 1
            if b_claims["tried"] >= len(batch):
                b_claimed.set()

    stack_a.writer._client.meta.events.register("before-send.kinesis.PutRecords", hold_a)
    for claim in ("UpdateItem", "BatchExecuteStatement"):
        stack_b.ledger.client.meta.events.register(f"after-call.dynamodb.{claim}", count_b)
    # WHEN both send the same messages
    with ThreadPoolExecutor(2) as pool:
        run_a = pool.submit(send, stack_a, batch, owner="orders-job")
        assert a_at_put.wait(timeout=30)
        run_b = pool.submit(send, stack_b, batch, owner="orders-job")
        outcomes_a, outcomes_b = run_a.result(timeout=60), run_b.result(timeout=60)
    assert b_claimed.is_set(), f"A put before B had claimed every key: {b_claims}"
    # THEN each key is in the stream once, SENT by one producer and DUPLICATE for the other
    # (before 79702c0 both won the claim, as "our own retried request", and both put: every
    # key was in the stream twice, one producer reporting SENT and the other TAKEN_OVER)
    assert_stream_is_exactly(kinesis, stack_a, batch)
    for a, b in zip(outcomes_a, outcomes_b, strict=True):
        assert {a.status, b.status} == {OutcomeStatus.SENT, OutcomeStatus.DUPLICATE}, (a, b)


# --- Kinesis reads failing during read-back -----------------------------------------------------


@pytest.mark.one_dynamodb
def test_a_read_back_that_cannot_read_the_stream_leaves_keys_in_flight_and_keeps_the_rest(
    make_stack: StackFactory, kinesis: Any
) -> None:
    # (5 MiB requests: a read timeout long enough that only the injected fault times out)
    stack = make_stack(put_read_timeout_s=5.0, lease_s=20.0)
    # GIVEN a role that may put but not list shards (AccessDenied), 6 messages of ~1 MiB (two
    # PutRecords calls under the 5 MiB request limit), and the first call's response lost
    # after the write
    size = stack.info.max_record_bytes - 16
    batch = [Message(f"big-{i}", bytes([65 + i]) * size) for i in range(6)]
    with (
        FaultInjector(stack.writer._client, seed=11) as put_faults,
        FaultInjector(stack.reader._client, seed=12) as read_faults,
    ):
        put_faults.lost_response(count=1)
        read_faults.rejected(operations=["ListShards"], probability=1.0)
        # WHEN the messages are sent
        outcomes = send(stack, batch)
    # THEN the call still answers for every message: the second call's records SENT, the
    # ambiguous ones IN_FLIGHT (for the reconciler), and none of them twice in the stream
    first_request = len(next(batches(prepare(batch, stack.info.max_record_bytes)[0])))
    assert statuses(outcomes) == {
        OutcomeStatus.IN_FLIGHT: first_request,
        OutcomeStatus.SENT: len(batch) - first_request,
    }
    contents = streamcheck.read_stream(kinesis, stack.settings.stream)
    sent = keys_with(outcomes, OutcomeStatus.SENT)
    streamcheck.assert_exactly_once(contents, sent, stack.ledger)
    streamcheck.assert_at_most_once(
        contents, keys_with(outcomes, OutcomeStatus.IN_FLIGHT), stack.ledger
    )


# --- input the producer must not send -----------------------------------------------------------


def test_a_key_reused_for_another_payload_is_a_conflict_and_nothing_is_sent(
    stack: Stack, kinesis: Any
) -> None:
    # GIVEN 10 delivered messages
    batch = messages(10)
    assert statuses(send(stack, batch)) == {OutcomeStatus.SENT: 10}
    # WHEN the same keys come again with other data, other routing, or twice in one input
    other_data = [Message(m.key, m.data + b"!") for m in batch[:4]]
    other_routing = [Message(m.key, m.data, routing_key="elsewhere") for m in batch[4:6]]
    fresh = messages(2, prefix="fresh")
    repeated = [fresh[0], Message(fresh[0].key, b"not the same"), fresh[1]]
    outcomes = send(stack, [*other_data, *other_routing, *repeated])
    # THEN the reused keys are CONFLICT with the delivered position, nothing more is written,
    # and the first occurrence of a key repeated in one input wins
    assert [o.status for o in outcomes] == [OutcomeStatus.CONFLICT] * 6 + [
        OutcomeStatus.SENT,
        OutcomeStatus.CONFLICT,
        OutcomeStatus.SENT,
    ]
    assert all(o.position is not None for o in outcomes[:6])
    assert "another payload" in str(outcomes[0].reason)
    assert "earlier in this input" in str(outcomes[7].reason)
    assert_stream_is_exactly(kinesis, stack, [*batch, *fresh])


@pytest.mark.one_dynamodb
def test_invalid_and_oversized_messages_are_rejected_and_the_rest_delivered(
    stack: Stack, kinesis: Any
) -> None:
    # GIVEN valid messages mixed with ones Kinesis can never take
    limit = stack.info.max_record_bytes
    valid = [
        *messages(5, prefix="ok"),
        Message("é" * 256, b"the longest key: 256 characters"),
        Message("at-the-limit", b"x" * (limit - len(b"at-the-limit"))),
        Message("routed", b"routed by another key", routing_key="customer-7"),
    ]
    invalid = [
        (Message("", b"empty key"), "key is empty"),
        (Message("k" * 257, b"too long"), "257 characters"),
        (Message("bad-\udc80", b"lone surrogate"), "unpaired surrogate"),
        (Message("one-byte-too-big", b"x" * (limit + 1 - len(b"one-byte-too-big"))), "bytes"),
        (Message("bad-routing", b"d", routing_key=""), "routing_key"),
    ]
    batch = [valid[0], invalid[0][0], valid[1], invalid[1][0], *valid[2:5], invalid[2][0]]
    batch += [valid[5], invalid[3][0], valid[6], invalid[4][0], valid[7]]
    # WHEN they are sent together
    outcomes = send(stack, batch)
    # THEN each invalid one is REJECTED with its reason, each valid one is SENT once
    by_index = {o.index: o for o in outcomes}
    for message, reason in invalid:
        (outcome,) = [by_index[i] for i, m in enumerate(batch) if m is message]
        assert outcome.status is OutcomeStatus.REJECTED
        assert reason in str(outcome.reason)
    assert statuses(outcomes) == {OutcomeStatus.SENT: len(valid), OutcomeStatus.REJECTED: 5}
    assert_stream_is_exactly(kinesis, stack, valid)


# --- acceptance: the CLI, twice -----------------------------------------------------------------


def test_keo_send_of_2000_messages_twice_writes_2000_records(
    names: Names, env: dict[str, str], kinesis: Any, tmp_path: Path
) -> None:
    # GIVEN `keo init` made a 4-shard stream and a ledger, and a file of 2,000 messages
    where = ["--stream", names.stream, "--table", names.table]
    init = subprocess.run(
        [KEO, "init", *where, "--shards", str(SHARDS)],
        env=env,
        check=False,
        capture_output=True,
        timeout=120,
    )
    assert init.returncode == 0, init.stderr.decode()
    batch = messages(2_000)
    source = write_jsonl(tmp_path / "orders.jsonl", batch)
    command = [KEO, "send", "--input", str(source), *where, "--no-progress"]
    # WHEN `keo send` runs twice
    first = subprocess.run(command, env=env, check=False, capture_output=True, timeout=300)
    second = subprocess.run(command, env=env, check=False, capture_output=True, timeout=300)
    # THEN both exit 0; the first sent 2,000, the second reports 2,000 DUPLICATE
    assert first.returncode == 0, first.stderr.decode()[-2000:]
    assert second.returncode == 0, second.stderr.decode()[-2000:]
    assert Counter(o["status"] for o in parse_outcomes(first.stdout)) == {"SENT": 2_000}
    assert Counter(o["status"] for o in parse_outcomes(second.stdout)) == {"DUPLICATE": 2_000}
    assert "DUPLICATE 2000" in second.stderr.decode()
    # and the stream holds exactly 2,000 records, one per key, where the ledger says
    contents = streamcheck.read_stream(kinesis, names.stream)
    assert len(contents.records) == 2_000
    ledger = ledger_from(settings_for_cli(env, names))
    streamcheck.assert_exactly_once(
        contents, [m.key for m in batch], ledger, payloads=payloads(batch)
    )


def settings_for_cli(env: dict[str, str], names: Names) -> ProducerSettings:
    return ProducerSettings(
        stream=names.stream,
        table=names.table,
        kinesis_endpoint_url=env["KEO_KINESIS_ENDPOINT_URL"],
        dynamodb_endpoint_url=env["KEO_DYNAMODB_ENDPOINT_URL"],
        region=local_stack.REGION,
    )


def write_jsonl(path: Path, batch: Sequence[Message]) -> Path:
    with path.open("w", encoding="utf-8") as out:
        for m in batch:
            out.write(json.dumps({"key": m.key, "data": m.data.decode()}) + "\n")
    return path


def parse_outcomes(stdout: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.decode().splitlines() if line.strip()]
