"""Claim groups are pipelined: the next group opens and claims while the one before it puts and
settles, at most ``groups_in_flight`` at once, and every key is still delivered once.

Fake Kinesis and ledger. A put held open by the test shows what runs beside it; nothing here
waits on the wall clock but a fail-safe bound on an event the test expects to be set.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from fakes.kinesis import FakeKinesisClient
from fakes.ledger import InMemoryLedger

from dedupe_store.clock import ManualClock
from dedupe_store.records import ClaimRequest, ClaimResult, Group
from kinesis_store.writer import KinesisWriter
from producer.hooks import Step
from producer.key.producer import ExactlyOnceProducer, ProducerPolicy
from producer.outcomes import OutcomeStatus
from producer.protocol import LeasePolicy, Message

STREAM = "orders"
LEASE = LeasePolicy(lease_ms=60_000, put_timeout_ms=7_000, skew_ms=5_000)
GROUP_SIZE = 5
FAIL_SAFE_S = 60  # only bounds a hang when pipelining is broken; never reached when it works


def messages(count: int) -> list[Message]:
    return [Message(f"order-{i}", f"payload {i}".encode()) for i in range(count)]


class Journal:
    """What the producer did, in order, across its threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.entries: list[str] = []

    def add(self, entry: str) -> None:
        with self._lock:
            self.entries.append(entry)


class JournaledLedger(InMemoryLedger):
    """The fake ledger, journaling group opens, claims (by group number) and settles."""

    def __init__(self, journal: Journal) -> None:
        super().__init__(inflight_buckets=4)
        self._journal = journal
        self._numbers: dict[str, int] = {}
        self.claimed: dict[int, int] = {}
        self._claims_lock = threading.Lock()
        self.on_claim: Callable[[int, int], None] = lambda _group, _count: None

    def open_group(self, stream: str, members: Any, **kwargs: Any) -> Group:
        group = super().open_group(stream, members, **kwargs)
        number = self._numbers[group.group_id] = len(self._numbers) + 1
        self._journal.add(f"open {number}")
        return group

    def claim(self, request: ClaimRequest, group: Group, *, now_ms: int) -> ClaimResult:
        result = super().claim(request, group, now_ms=now_ms)
        number = self._numbers[group.group_id]
        with self._claims_lock:
            count = self.claimed[number] = self.claimed.get(number, 0) + 1
        self.on_claim(number, count)
        return result

    def record_positions(self, group: Group, *args: Any, **kwargs: Any) -> Any:
        self._journal.add(f"settle {self._numbers[group.group_id]}")
        return super().record_positions(group, *args, **kwargs)


class HeldPuts(FakeKinesisClient):
    """Fake Kinesis whose first PutRecords waits until the test lets it go."""

    def __init__(self, clock: ManualClock, journal: Journal) -> None:
        super().__init__(stream=STREAM, clock=clock)
        self._journal = journal
        self.first_put_started = threading.Event()
        self.let_first_put_go = threading.Event()
        self._puts = 0

    def put_records(self, **kwargs: Any) -> Any:
        self._puts += 1
        if self._puts == 1:
            self.first_put_started.set()
            assert self.let_first_put_go.wait(FAIL_SAFE_S), "the first put was never let go"
        self._journal.add(f"put {self._puts}")
        return super().put_records(**kwargs)


@pytest.fixture
def journal() -> Journal:
    return Journal()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def kinesis(clock: ManualClock, journal: Journal) -> HeldPuts:
    return HeldPuts(clock, journal)


@pytest.fixture
def ledger(journal: Journal) -> JournaledLedger:
    return JournaledLedger(journal)


def producer_over(
    kinesis: HeldPuts,
    ledger: JournaledLedger,
    clock: ManualClock,
    *,
    groups_in_flight: int,
    hooks: Any = None,
) -> ExactlyOnceProducer:
    extra = {} if hooks is None else {"hooks": hooks}
    return ExactlyOnceProducer(
        stream=STREAM,
        ledger=ledger,
        writer=KinesisWriter(kinesis, STREAM),
        clock=clock,
        policy=ProducerPolicy(
            lease=LEASE, group_size=GROUP_SIZE, groups_in_flight=groups_in_flight
        ),
        sleep=kinesis.sleep,
        **extra,
    )


def test_the_next_group_claims_while_the_first_one_puts(
    kinesis: HeldPuts, ledger: JournaledLedger, clock: ManualClock
) -> None:
    # GIVEN two groups in flight, and a first put that is held until group 2 made its claims
    def release_when_group_two_claimed(group: int, count: int) -> None:
        if group == 2 and count == GROUP_SIZE:
            kinesis.let_first_put_go.set()

    ledger.on_claim = release_when_group_two_claimed
    # WHEN three groups' worth of messages are sent
    with producer_over(kinesis, ledger, clock, groups_in_flight=2) as producer:
        outcomes = producer.send(messages(3 * GROUP_SIZE))
    # THEN group 2 was claimed during group 1's put (else the put would never have been let go)
    assert ledger.claimed == {1: GROUP_SIZE, 2: GROUP_SIZE, 3: GROUP_SIZE}
    # AND every message is in the stream once, in input order of outcomes
    assert [o.status for o in outcomes] == [OutcomeStatus.SENT] * (3 * GROUP_SIZE)
    assert [o.key for o in outcomes] == [m.key for m in messages(3 * GROUP_SIZE)]
    keys = [record.partition_key for record in kinesis.visible()]
    assert sorted(keys) == sorted(m.key for m in messages(3 * GROUP_SIZE))


def test_one_group_in_flight_runs_the_groups_one_after_the_other(
    kinesis: HeldPuts, ledger: JournaledLedger, clock: ManualClock, journal: Journal
) -> None:
    # GIVEN one group in flight, and a first put let go as soon as it starts
    kinesis.let_first_put_go.set()
    # WHEN two groups' worth of messages are sent
    with producer_over(kinesis, ledger, clock, groups_in_flight=1) as producer:
        outcomes = producer.send(messages(2 * GROUP_SIZE))
    # THEN group 2 opened only after group 1 settled
    assert journal.entries == ["open 1", "put 1", "settle 1", "open 2", "put 2", "settle 2"]
    assert {o.status for o in outcomes} == {OutcomeStatus.SENT}


def test_groups_in_flight_are_bounded(
    kinesis: HeldPuts, ledger: JournaledLedger, clock: ManualClock, journal: Journal
) -> None:
    # GIVEN two groups in flight, and a first put held until group 2 has made its claims
    def release_when_group_two_claimed(group: int, count: int) -> None:
        if (group, count) == (2, GROUP_SIZE):
            kinesis.let_first_put_go.set()

    ledger.on_claim = release_when_group_two_claimed
    # WHEN three groups' worth of messages are sent
    with producer_over(kinesis, ledger, clock, groups_in_flight=2) as producer:
        producer.send(messages(3 * GROUP_SIZE))
    # THEN two groups were open at once, and never three: a group opened only once one of
    # the two before it had settled (read from the journal, whatever the threads' timing)
    open_at_once, most = 0, 0
    for entry in journal.entries:
        if entry.startswith("open"):
            open_at_once += 1
            most = max(most, open_at_once)
        elif entry.startswith("settle"):
            open_at_once -= 1
    assert most == 2, journal.entries
    assert ledger.claimed == {1: GROUP_SIZE, 2: GROUP_SIZE, 3: GROUP_SIZE}


class RaiseAfterFirstClaims:
    """Hooks that raise once, after the claims of the first group to finish them (``raised``
    is set then)."""

    def __init__(self) -> None:
        self.raised = threading.Event()

    def at(self, step: Step, *, batch_id: int | None = None) -> None:  # noqa: ARG002
        if step is Step.AFTER_CLAIM and not self.raised.is_set():
            self.raised.set()
            raise RuntimeError("injected after claims")


def test_a_group_that_raises_fails_the_send_after_the_other_groups_finish(
    kinesis: HeldPuts, ledger: JournaledLedger, clock: ManualClock, journal: Journal
) -> None:
    # GIVEN two groups in flight, the first raising right after its claims (group 2's claims
    # are held until then: else, on a busy machine, group 2 can finish its claims first)
    kinesis.let_first_put_go.set()
    hooks = RaiseAfterFirstClaims()

    def hold_group_two(group: int, _count: int) -> None:
        if group == 2:
            assert hooks.raised.wait(FAIL_SAFE_S), "group 1 never finished its claims"

    ledger.on_claim = hold_group_two
    producer = producer_over(kinesis, ledger, clock, groups_in_flight=2, hooks=hooks)
    # WHEN three groups' worth of messages are sent
    with producer, pytest.raises(RuntimeError, match="injected after claims"):
        producer.send(messages(3 * GROUP_SIZE))
    # THEN the group started beside the failed one finished its protocol (put and settled)
    assert "settle 2" in journal.entries
    # AND the failed group's keys stay claimed for the reconciler; none of them was put
    sent = {record.partition_key for record in kinesis.visible()}
    assert sent.isdisjoint(m.key for m in messages(GROUP_SIZE))


def test_an_interrupt_leaves_the_groups_not_started_unclaimed(
    kinesis: HeldPuts, ledger: JournaledLedger, clock: ManualClock
) -> None:
    # GIVEN one group in flight, interrupted while its put is held
    with producer_over(kinesis, ledger, clock, groups_in_flight=1) as producer:
        result: list[Any] = []
        sender = threading.Thread(
            target=lambda: result.extend(producer.send(messages(3 * GROUP_SIZE)))
        )
        sender.start()
        assert kinesis.first_put_started.wait(FAIL_SAFE_S)
        # WHEN the send is interrupted, then the put goes through
        producer.interrupt()
        kinesis.let_first_put_go.set()
        sender.join(FAIL_SAFE_S)
    # THEN the first group is SENT, and the others FAILED with nothing claimed for them
    assert [o.status for o in result[:GROUP_SIZE]] == [OutcomeStatus.SENT] * GROUP_SIZE
    assert {o.status for o in result[GROUP_SIZE:]} == {OutcomeStatus.FAILED}
    assert all("before it was claimed" in str(o.reason) for o in result[GROUP_SIZE:])
    assert set(ledger.claimed) == {1}


def test_the_next_batch_claims_while_the_last_group_of_a_batch_puts(
    kinesis: HeldPuts, ledger: JournaledLedger, clock: ManualClock
) -> None:
    # GIVEN two groups in flight, and a first put held until batch 2's group made its claims
    def release_when_group_two_claimed(group: int, count: int) -> None:
        if (group, count) == (2, GROUP_SIZE):
            kinesis.let_first_put_go.set()

    ledger.on_claim = release_when_group_two_claimed
    batches = [messages(3 * GROUP_SIZE)[:GROUP_SIZE], messages(3 * GROUP_SIZE)[GROUP_SIZE:]]
    # WHEN two batches are sent, the first one group
    with producer_over(kinesis, ledger, clock, groups_in_flight=2) as producer:
        answers = list(producer.send_each(batches))
    # THEN batch 2's first group claimed during batch 1's only put (else it is never let go)
    assert ledger.claimed == {1: GROUP_SIZE, 2: GROUP_SIZE, 3: GROUP_SIZE}
    # AND each batch has its outcomes, in its order, every message in the stream once
    assert [[o.key for o in answer] for answer in answers] == [
        [m.key for m in batch] for batch in batches
    ]
    assert {o.status for answer in answers for o in answer} == {OutcomeStatus.SENT}
    keys = sorted(record.partition_key for record in kinesis.visible())
    assert keys == sorted(m.key for m in messages(3 * GROUP_SIZE))


def test_a_key_still_in_flight_from_an_earlier_batch_waits_for_it(
    kinesis: HeldPuts, ledger: JournaledLedger, clock: ManualClock, journal: Journal
) -> None:
    # GIVEN two groups in flight, the first put let go as soon as it starts
    kinesis.let_first_put_go.set()
    first = messages(GROUP_SIZE)
    # WHEN a second batch repeats a key of the first (the same data) beside new ones
    second = [first[0], *messages(GROUP_SIZE + 2)[GROUP_SIZE:]]
    with producer_over(kinesis, ledger, clock, groups_in_flight=2) as producer:
        answers = list(producer.send_each([first, second]))
    # THEN the second batch's group opened only once the first had settled
    assert journal.entries.index("settle 1") < journal.entries.index("open 2")
    # AND the repeated key was found delivered, and written once
    assert [o.status for o in answers[1]] == [
        OutcomeStatus.DUPLICATE,
        OutcomeStatus.SENT,
        OutcomeStatus.SENT,
    ]
    keys = [record.partition_key for record in kinesis.visible()]
    assert keys.count(first[0].key) == 1


def test_a_caller_that_stops_early_leaves_no_group_unfinished(
    kinesis: HeldPuts, ledger: JournaledLedger, clock: ManualClock, journal: Journal
) -> None:
    # GIVEN three batches of a group each, two groups in flight
    kinesis.let_first_put_go.set()
    batches = [messages(3 * GROUP_SIZE)[i : i + GROUP_SIZE] for i in range(0, 15, GROUP_SIZE)]
    with producer_over(kinesis, ledger, clock, groups_in_flight=2) as producer:
        sending = producer.send_each(iter(batches))
        # WHEN the caller takes the first batch's outcomes and stops
        first = next(sending)
        sending.close()
    # THEN every group that had opened settled
    opened = [e for e in journal.entries if e.startswith("open")]
    settled = [e for e in journal.entries if e.startswith("settle")]
    assert len(opened) == len(settled) >= 2
    assert {o.status for o in first} == {OutcomeStatus.SENT}
