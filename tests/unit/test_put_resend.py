"""The put's resend loop: only records proven not written, and worth it, are sent again under
the same claim, after a jittered backoff, at most ``put_max_attempts`` times. A PutRecords is
never repeated whole.

Fake Kinesis and ledger; ``sleep`` moves the fake clock and records each wait.
"""

from __future__ import annotations

import random
from typing import Any

import botocore.exceptions
import pytest
from fakes.kinesis import FakeKinesisClient, PutFault
from fakes.ledger import InMemoryLedger

from dedupe_store.clock import ManualClock
from dedupe_store.states import LedgerState
from kinesis_store.writer import KinesisWriter
from producer.key.producer import ExactlyOnceProducer, ProducerPolicy
from producer.outcomes import OutcomeStatus
from producer.protocol import LeasePolicy, Message

STREAM = "orders"
LEASE = LeasePolicy(lease_ms=60_000, put_timeout_ms=7_000, skew_ms=5_000)
MESSAGES = [Message(f"order-{i}", f"payload {i}".encode()) for i in range(4)]


class Recorder:
    """Every wait asked for, passed on to ``sleep``."""

    def __init__(self, sleep: Any) -> None:
        self.sleep = sleep
        self.waits: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.sleep(seconds)


class Refusing:
    """A Kinesis client that refuses every PutRecords with a 403: nothing is ever written."""

    def __init__(self) -> None:
        self.put_calls = 0

    def put_records(self, **_: Any) -> Any:
        self.put_calls += 1
        raise botocore.exceptions.ClientError(
            {
                "Error": {"Code": "AccessDeniedException", "Message": "not allowed"},
                "ResponseMetadata": {"HTTPStatusCode": 403},
            },
            "PutRecords",
        )


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def kinesis(clock: ManualClock) -> FakeKinesisClient:
    return FakeKinesisClient(stream=STREAM, clock=clock, throttle_probability=1.0)


@pytest.fixture
def ledger() -> InMemoryLedger:
    return InMemoryLedger(inflight_buckets=4)


def producer_over(
    client: Any, ledger: InMemoryLedger, clock: ManualClock, sleep: Recorder
) -> ExactlyOnceProducer:
    return ExactlyOnceProducer(
        stream=STREAM,
        ledger=ledger,
        writer=KinesisWriter(client, STREAM),
        clock=clock,
        policy=ProducerPolicy(lease=LEASE, put_max_attempts=3),
        sleep=sleep,
        rng=random.Random(0),
    )


def test_records_throttled_every_time_are_put_three_times_then_released(
    kinesis: FakeKinesisClient, ledger: InMemoryLedger, clock: ManualClock
) -> None:
    # GIVEN Kinesis throttling every record of every put, and at most 3 attempts
    kinesis.script(*[PutFault.THROTTLED] * 5)
    sleep = Recorder(kinesis.sleep)
    # WHEN 4 messages are sent
    with producer_over(kinesis, ledger, clock, sleep) as producer:
        outcomes = producer.send(MESSAGES)
    # THEN 3 puts went out, with a backoff within 100 ms, then 200 ms, between them
    assert kinesis.put_calls == 3
    assert len(sleep.waits) == 2
    assert 0 <= sleep.waits[0] <= 0.1
    assert 0 <= sleep.waits[1] <= 0.2
    # AND every message failed with the throttle named, its claim released for a later send
    assert {o.status for o in outcomes} == {OutcomeStatus.FAILED}
    assert all("ProvisionedThroughputExceededException" in str(o.reason) for o in outcomes)
    assert {r.state for r in ledger.scan(STREAM)} == {LedgerState.RELEASED}
    assert kinesis.visible() == []


def test_a_throttled_record_is_resent_alone_and_delivered(
    kinesis: FakeKinesisClient, ledger: InMemoryLedger, clock: ManualClock
) -> None:
    # GIVEN a first put whose records are all throttled, then puts that go through
    kinesis.script(PutFault.THROTTLED, PutFault.WRITTEN)
    sleep = Recorder(kinesis.sleep)
    # WHEN 4 messages are sent
    with producer_over(kinesis, ledger, clock, sleep) as producer:
        outcomes = producer.send(MESSAGES)
    # THEN they are resent once, after one wait, and each is in the stream once
    assert (kinesis.put_calls, len(sleep.waits)) == (2, 1)
    assert {o.status for o in outcomes} == {OutcomeStatus.SENT}
    assert sorted(r.partition_key for r in kinesis.visible()) == [m.key for m in MESSAGES]


def test_the_waits_are_repeatable_with_a_seeded_random_source(clock: ManualClock) -> None:
    # GIVEN two runs against Kinesis that throttles every put, each producer seeded alike
    waits = []
    for _ in range(2):
        kinesis = FakeKinesisClient(stream=STREAM, clock=clock, throttle_probability=1.0)
        kinesis.script(*[PutFault.THROTTLED] * 3)
        sleep = Recorder(kinesis.sleep)
        with producer_over(kinesis, InMemoryLedger(), clock, sleep) as producer:
            producer.send(MESSAGES[:1])
        waits.append(sleep.waits)
    # WHEN their waits are compared
    # THEN they are the same
    assert waits[0] == waits[1]


def test_a_refusal_that_would_repeat_is_given_up_after_one_put(
    ledger: InMemoryLedger, clock: ManualClock
) -> None:
    # GIVEN Kinesis refusing every put with AccessDenied (not retriable)
    client = Refusing()
    sleep = Recorder(lambda _s: None)
    # WHEN 4 messages are sent
    with producer_over(client, ledger, clock, sleep) as producer:
        outcomes = producer.send(MESSAGES)
    # THEN one put went out, nobody waited, and each message failed naming the refusal
    assert (client.put_calls, sleep.waits) == (1, [])
    assert {o.status for o in outcomes} == {OutcomeStatus.FAILED}
    assert all("AccessDeniedException" in str(o.reason) for o in outcomes)


def test_an_ambiguous_put_is_never_resent(
    kinesis: FakeKinesisClient, ledger: InMemoryLedger, clock: ManualClock
) -> None:
    # GIVEN a put that was written but whose response was lost (no read-back configured)
    kinesis.script(PutFault.RESPONSE_LOST)
    sleep = Recorder(kinesis.sleep)
    # WHEN 4 messages are sent
    with producer_over(kinesis, ledger, clock, sleep) as producer:
        outcomes = producer.send(MESSAGES)
    # THEN the put is not repeated: the messages stay in flight, each in the stream once
    assert (kinesis.put_calls, sleep.waits) == (1, [])
    assert {o.status for o in outcomes} == {OutcomeStatus.IN_FLIGHT}
    assert len(kinesis.visible()) == len(MESSAGES)
