"""Replay mode's producer (``dedupe=replay``) over the repository's fakes: ``InMemoryLedger``,
``FakeKinesisClient`` and a ``ManualClock`` that only the producer's own sleeps move.

The stream must end up holding exactly the rows of a run without failures, as a multiset of
``(key, data)``, however the run's attempts fail and replay; the integration tests
(``tests/integration/test_replay_send.py``) prove the same on the emulators with kills.
"""

from __future__ import annotations

import logging
import random
import uuid
from collections import Counter
from typing import Any

import pytest
from fakes.kinesis import FakeKinesisClient, PutFault
from fakes.ledger import InMemoryLedger, LedgerFault
from fakes.replay import replay_producer_over

from dedupe_store.clock import ManualClock
from dedupe_store.records import RunAttempt
from dedupe_store.states import RunState
from kinesis_store.reader import KinesisReader
from kinesis_store.shards import Shard, open_shards
from producer import metrics
from producer.errors import ReplayWindowTrimmedError
from producer.hooks import Step
from producer.outcomes import OutcomeStatus
from producer.protocol import LeasePolicy, Message
from producer.replay.context import ReplayTask
from producer.replay.lease import early_renewal_ms
from producer.replay.plan import RecoveryStep
from producer.replay.producer import ReplayProducer
from producer.replay.recovery import plan_reads, plan_reads_once_over
from producer.replay.shared_reads import PlannedReads, shared_by

STREAM = "orders"
LEASE = LeasePolicy(lease_ms=20_000, put_timeout_ms=7_000, skew_ms=2_000)
RUN = "query-a/7"


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def kinesis(clock: ManualClock) -> FakeKinesisClient:
    return FakeKinesisClient(stream=STREAM, clock=clock, put_timeout_ms=LEASE.put_timeout_ms)


@pytest.fixture
def ledger() -> InMemoryLedger:
    return InMemoryLedger(inflight_buckets=4)


def producer_over(
    ledger: InMemoryLedger, kinesis: FakeKinesisClient, clock: ManualClock, **policy: int
) -> ReplayProducer:
    return replay_producer_over(ledger, kinesis, clock, LEASE, **policy)


def rows(count: int, prefix: str = "k") -> list[Message]:
    return [Message(f"{prefix}{i}", f"data-{i}".encode()) for i in range(count)]


def in_stream(kinesis: FakeKinesisClient) -> Counter[tuple[str, bytes]]:
    return Counter((r.partition_key, r.data) for r in kinesis.visible())


def as_multiset(messages: list[Message]) -> Counter[tuple[str, bytes]]:
    return Counter((m.key, m.data) for m in messages)


def statuses(outcomes: list[object]) -> Counter[str]:
    return Counter(o.status.value for o in outcomes)  # type: ignore[attr-defined]


def test_a_first_attempt_puts_every_row_and_finishes(
    ledger: InMemoryLedger, kinesis: FakeKinesisClient, clock: ManualClock
) -> None:
    """GIVEN a run no one attempted WHEN an attempt sends 30 rows THEN each is SENT once, on
    the fast path, and its execution is finished when it is (a replay waits for nothing)."""
    producer = producer_over(ledger, kinesis, clock)
    messages = rows(30)
    with producer.attempt(ReplayTask(RUN, "exec-1")) as attempt:
        assert attempt.step is RecoveryStep.FAST_PATH
        outcomes = attempt.send(messages)
    assert statuses(outcomes) == {"SENT": 30}
    assert all(o.position is not None for o in outcomes)
    assert in_stream(kinesis) == as_multiset(messages)
    run = ledger.get_run(STREAM, RUN)
    assert run is not None
    assert run.state is RunState.OPEN
    assert (run.attempts, run.executions[0].finished) == (1, True)


def test_a_replay_after_the_puts_and_before_the_commit_finds_everything_and_sends_nothing(
    ledger: InMemoryLedger, kinesis: FakeKinesisClient, clock: ManualClock
) -> None:
    """GIVEN an attempt that put every row and died before the commit (its lease left running)
    WHEN another execution replays the run, its rows in another order THEN every row is
    DUPLICATE at its position, nothing is put, and nothing is waited for."""
    first = producer_over(ledger, kinesis, clock).attempt(ReplayTask(RUN, "exec-1"))
    messages = rows(40)
    first.send(messages)  # never finished: a driver killed after its puts
    puts_before, started_ms = kinesis.put_calls, clock.now_ms()

    replayed = list(reversed(messages))
    with producer_over(ledger, kinesis, clock).attempt(ReplayTask(RUN, "exec-2")) as second:
        assert second.step is RecoveryStep.WAIT
        outcomes = second.send(replayed)

    assert statuses(outcomes) == {"DUPLICATE": 40}
    assert kinesis.put_calls == puts_before
    assert clock.now_ms() == started_ms
    assert in_stream(kinesis) == as_multiset(messages)
    assert second.rows_found == 40


def test_a_replay_with_more_rows_waits_for_the_earlier_lease_then_sends_only_the_new_ones(
    ledger: InMemoryLedger, kinesis: FakeKinesisClient, clock: ManualClock
) -> None:
    """GIVEN an attempt that put 20 rows and died with its lease running WHEN a replay carries
    those 20 and 10 more (a non-deterministic source) THEN it waits out the earlier lease, and
    the stream holds the 30 rows of the replay, each once."""
    first = producer_over(ledger, kinesis, clock).attempt(ReplayTask(RUN, "exec-1"))
    first.send(rows(20))
    superset = rows(30)
    random.Random(3).shuffle(superset)

    with producer_over(ledger, kinesis, clock).attempt(ReplayTask(RUN, "exec-2")) as second:
        outcomes = second.send(superset)

    assert statuses(outcomes) == {"DUPLICATE": 20, "SENT": 10}
    assert in_stream(kinesis) == as_multiset(rows(30))
    earlier = first.me
    assert LEASE.expired_for_everyone(earlier.lease_expires_at_ms, clock.now_ms())


def test_a_replay_with_other_rows_than_the_first_attempt_leaves_the_union(
    ledger: InMemoryLedger, kinesis: FakeKinesisClient, clock: ManualClock
) -> None:
    """GIVEN a first attempt whose rows were {A, B}, which put both and died before its commit
    WHEN the replay's rows are {A, C} (a source that does not read the same records again)
    THEN A is found and not sent again, C is sent, and B stays: the stream holds A, B and C,
    the union of what the attempts carried, never a row twice. Nothing can take back B."""
    a, b, c = Message("A", b"a"), Message("B", b"b"), Message("C", b"c")
    first = producer_over(ledger, kinesis, clock).attempt(ReplayTask(RUN, "exec-1"))
    assert statuses(first.send([a, b])) == {"SENT": 2}  # killed here: no commit
    with producer_over(ledger, kinesis, clock).attempt(ReplayTask(RUN, "exec-2")) as replay:
        outcomes = replay.send([a, c])
    assert [o.status for o in outcomes] == [OutcomeStatus.DUPLICATE, OutcomeStatus.SENT]
    assert in_stream(kinesis) == as_multiset([a, b, c])


def test_a_replay_of_a_finished_attempt_sends_its_new_rows_without_waiting(
    ledger: InMemoryLedger, kinesis: FakeKinesisClient, clock: ManualClock
) -> None:
    """GIVEN an attempt that finished (its lease ended) WHEN a replay carries more rows THEN it
    waits no longer than the skew and sends only the new rows."""
    with producer_over(ledger, kinesis, clock).attempt(ReplayTask(RUN, "exec-1")) as first:
        first.send(rows(10))
    started_ms = clock.now_ms()
    with producer_over(ledger, kinesis, clock).attempt(ReplayTask(RUN, "exec-2")) as second:
        outcomes = second.send(rows(15))
    assert statuses(outcomes) == {"DUPLICATE": 10, "SENT": 5}
    assert clock.now_ms() - started_ms <= LEASE.skew_ms
    assert in_stream(kinesis) == as_multiset(rows(15))


def test_identical_rows_are_two_records_and_a_replay_finds_both(
    ledger: InMemoryLedger, kinesis: FakeKinesisClient, clock: ManualClock
) -> None:
    """GIVEN a batch with the same row twice (and the same key with other data) WHEN it is put,
    then replayed with a third copy THEN the stream holds two copies after the first attempt
    and three after the replay: a row is counted, not deduplicated by key."""
    twice = [Message("k", b"same"), Message("k", b"same"), Message("k", b"other")]
    with producer_over(ledger, kinesis, clock).attempt(ReplayTask(RUN, "exec-1")) as first:
        assert statuses(first.send(twice)) == {"SENT": 3}
    assert in_stream(kinesis) == {("k", b"same"): 2, ("k", b"other"): 1}

    thrice = [*twice, Message("k", b"same")]
    with producer_over(ledger, kinesis, clock).attempt(ReplayTask(RUN, "exec-2")) as second:
        assert statuses(second.send(thrice)) == {"DUPLICATE": 3, "SENT": 1}
    assert in_stream(kinesis) == {("k", b"same"): 3, ("k", b"other"): 1}


def test_a_complete_run_sends_nothing(
    ledger: InMemoryLedger, kinesis: FakeKinesisClient, clock: ManualClock
) -> None:
    """GIVEN a run marked COMPLETE WHEN it is replayed THEN every row is DUPLICATE and nothing
    is read or put."""
    producer = producer_over(ledger, kinesis, clock)
    producer.send(ReplayTask(RUN, "exec-1"), rows(5))
    producer.complete(RUN, {"sent": 5})
    puts, reads = kinesis.put_calls, kinesis.get_records_calls

    with producer.attempt(ReplayTask(RUN, "exec-2")) as again:
        assert again.step is RecoveryStep.DONE
        outcomes = again.send(rows(5))
    assert statuses(outcomes) == {"DUPLICATE": 5}
    assert (kinesis.put_calls, kinesis.get_records_calls) == (puts, reads)


def test_a_sibling_task_is_not_earlier_but_a_retry_of_the_same_task_is(
    ledger: InMemoryLedger, kinesis: FakeKinesisClient, clock: ManualClock
) -> None:
    """GIVEN task 0 of an execution that put its rows WHEN task 1 of the same execution starts
    THEN it takes the fast path (its rows are others); WHEN task 0 is retried THEN it recovers
    and sends nothing again."""
    producer = producer_over(ledger, kinesis, clock)
    with producer.attempt(ReplayTask(RUN, "exec-1", task="0")) as task0:
        task0.send(rows(8, "a"))
    with producer.attempt(ReplayTask(RUN, "exec-1", task="1")) as task1:
        assert task1.step is RecoveryStep.FAST_PATH
        task1.send(rows(8, "b"))
    with producer.attempt(ReplayTask(RUN, "exec-1", task="0", task_attempt=1)) as retry:
        assert retry.step in {RecoveryStep.RECOVER, RecoveryStep.WAIT}
        assert statuses(retry.send(rows(8, "a"))) == {"DUPLICATE": 8}
    assert in_stream(kinesis) == as_multiset(rows(8, "a") + rows(8, "b"))


def test_a_lower_attempt_registering_after_a_higher_one_is_outranked_and_puts_nothing(
    ledger: InMemoryLedger, kinesis: FakeKinesisClient, clock: ManualClock
) -> None:
    """GIVEN attempt 11 of a task registered and put every row (its attempt 10's worker
    stalled before registering: GC, a slow start, an executor declared lost while alive)
    WHEN attempt 10 registers after it THEN 10 is outranked: it puts nothing, its rows FAILED,
    and the stream holds every row once (not 20 records for 10 rows)."""
    producer = producer_over(ledger, kinesis, clock)
    messages = rows(10)
    with producer.attempt(ReplayTask(RUN, "exec-1", task="0", task_attempt=11)) as later:
        assert later.step is RecoveryStep.FAST_PATH
        assert statuses(later.send(messages)) == {"SENT": 10}
    clock.advance(1_000)
    with producer.attempt(ReplayTask(RUN, "exec-1", task="0", task_attempt=10)) as stalled:
        assert stalled.step is RecoveryStep.SUPERSEDED
        outcomes = stalled.send(messages)
    assert statuses(outcomes) == {"FAILED": 10}
    assert "registered before this one" in (outcomes[0].reason or "")
    assert in_stream(kinesis) == as_multiset(messages)
    # AND the outranked attempt is not left open on its execution: a replay waits for none
    run = producer.run_of(RUN)
    assert run is not None
    assert all(e.finished for e in run.executions)


def test_a_higher_attempt_registering_while_a_lower_one_is_between_its_two_writes_wins(
    ledger: InMemoryLedger, kinesis: FakeKinesisClient, clock: ManualClock
) -> None:
    """GIVEN attempt 10 of a task has written the run item but not yet its task item
    WHEN attempt 11 registers both in between, and puts every row THEN 10's task write is
    refused (outranked): 10 sends nothing and the stream holds every row once."""
    producer = producer_over(ledger, kinesis, clock)
    messages = rows(10)
    raced: list[RecoveryStep] = []

    def race(attempt: RunAttempt) -> None:
        if attempt.task_attempt != 10:
            return
        with producer.attempt(ReplayTask(RUN, "exec-1", task="0", task_attempt=11)) as later:
            raced.append(later.step)
            assert statuses(later.send(messages)) == {"SENT": 10}

    ledger.between_registration_writes = race
    with producer.attempt(ReplayTask(RUN, "exec-1", task="0", task_attempt=10)) as stalled:
        outcomes = stalled.send(messages)
    assert raced == [RecoveryStep.FAST_PATH]
    assert stalled.step is RecoveryStep.SUPERSEDED
    assert statuses(outcomes) == {"FAILED": 10}
    assert in_stream(kinesis) == as_multiset(messages)


def test_a_higher_attempt_registering_after_a_lower_one_never_takes_the_fast_path(
    ledger: InMemoryLedger, kinesis: FakeKinesisClient, clock: ManualClock
) -> None:
    """GIVEN attempt 10 of a task registered and put every row WHEN attempt 11 registers
    after it, even in the middle of 10's registration THEN 11 recovers against 10 (never the
    fast path), finds every row and sends nothing again."""
    producer = producer_over(ledger, kinesis, clock)
    messages = rows(10)
    with producer.attempt(ReplayTask(RUN, "exec-1", task="0", task_attempt=10)) as first:
        assert first.step is RecoveryStep.FAST_PATH
        first.send(messages)
    with producer.attempt(ReplayTask(RUN, "exec-1", task="0", task_attempt=11)) as later:
        assert later.step in {RecoveryStep.RECOVER, RecoveryStep.WAIT}
        assert statuses(later.send(messages)) == {"DUPLICATE": 10}
    assert in_stream(kinesis) == as_multiset(messages)


@pytest.mark.parametrize("fault", [PutFault.RESPONSE_LOST, PutFault.NOT_WRITTEN])
def test_an_ambiguous_put_is_read_back_and_lands_once(
    ledger: InMemoryLedger, kinesis: FakeKinesisClient, clock: ManualClock, fault: PutFault
) -> None:
    """GIVEN the first PutRecords of an attempt is ambiguous (written with its response lost,
    or timed out unwritten) WHEN the attempt sends THEN every row is SENT and the stream holds
    each once: a lost response is found at once, a timeout is resent once its lease is over."""
    kinesis.script(fault)
    messages = rows(12)
    with producer_over(ledger, kinesis, clock).attempt(ReplayTask(RUN, "exec-1")) as attempt:
        outcomes = attempt.send(messages)
    assert statuses(outcomes) == {"SENT": 12}
    assert in_stream(kinesis) == as_multiset(messages)


def test_a_late_write_is_waited_for_not_sent_twice(
    ledger: InMemoryLedger, kinesis: FakeKinesisClient, clock: ManualClock
) -> None:
    """GIVEN a put that times out and lands later, within its lease WHEN the attempt reads it
    back THEN it waits for the lease, finds the late record, and sends nothing again."""
    kinesis.script(PutFault.LATE)
    messages = rows(6)
    with producer_over(ledger, kinesis, clock).attempt(ReplayTask(RUN, "exec-1")) as attempt:
        outcomes = attempt.send(messages)
    kinesis.land_all()
    assert statuses(outcomes) == {"SENT": 6}
    assert in_stream(kinesis) == as_multiset(messages)


def test_a_superseded_attempt_cannot_renew_and_puts_nothing_more(
    ledger: InMemoryLedger, kinesis: FakeKinesisClient, clock: ManualClock
) -> None:
    """GIVEN an attempt stalled past its fence margin WHEN a later attempt supersedes it and
    delivers the run THEN the stalled one, resumed, cannot renew: its rows are FAILED, not
    written a second time."""
    stalled = producer_over(ledger, kinesis, clock).attempt(ReplayTask(RUN, "exec-1"))
    clock.advance(LEASE.lease_ms - LEASE.put_timeout_ms)  # a put sent now could outlive it
    with producer_over(ledger, kinesis, clock).attempt(ReplayTask(RUN, "exec-2")) as later:
        assert statuses(later.send(rows(10))) == {"SENT": 10}
    outcomes = stalled.send(rows(10))
    assert statuses(outcomes) == {"FAILED": 10}
    assert in_stream(kinesis) == as_multiset(rows(10))


def test_an_interrupted_wait_leaves_the_rows_in_flight(
    ledger: InMemoryLedger, kinesis: FakeKinesisClient, clock: ManualClock
) -> None:
    """GIVEN a replay that would have to wait for an earlier lease WHEN the wait is capped
    below it THEN the rows not found are IN_FLIGHT (re-run later), and none is sent."""
    producer_over(ledger, kinesis, clock).attempt(ReplayTask(RUN, "exec-1")).send(rows(3))
    capped = producer_over(ledger, kinesis, clock, max_wait_ms=1_000)
    with capped.attempt(ReplayTask(RUN, "exec-2")) as second:
        outcomes = second.send(rows(5))
    assert statuses(outcomes) == {"DUPLICATE": 3, "IN_FLIGHT": 2}
    assert in_stream(kinesis) == as_multiset(rows(3))
    assert not second.completable


def test_rows_spread_over_calls_of_one_attempt_are_matched_as_one_multiset(
    ledger: InMemoryLedger, kinesis: FakeKinesisClient, clock: ManualClock
) -> None:
    """GIVEN an attempt that put 25 rows WHEN its retry sends 30 rows in chunks of 7 THEN the
    25 are found once each across the chunks and 5 are sent."""
    producer = producer_over(ledger, kinesis, clock)
    with producer.attempt(ReplayTask(RUN, "exec-1")) as first:
        first.send(rows(25))
    found: Counter[str] = Counter()
    with producer.attempt(ReplayTask(RUN, "exec-2")) as second:
        messages = rows(30)
        for start in range(0, 30, 7):
            found.update(statuses(second.send(messages[start : start + 7])))
    assert found == {"DUPLICATE": 25, "SENT": 5}
    assert in_stream(kinesis) == as_multiset(rows(30))


def test_invalid_rows_are_rejected_with_a_reason_and_the_rest_delivered(
    ledger: InMemoryLedger, kinesis: FakeKinesisClient, clock: ManualClock
) -> None:
    """GIVEN a batch with an empty key and an oversized record WHEN it is sent THEN both are
    REJECTED with a reason and the valid rows are SENT."""
    messages = [Message("", b"x"), Message("big", b"x" * (1024 * 1024 + 1)), *rows(3)]
    with producer_over(ledger, kinesis, clock).attempt(ReplayTask(RUN, "exec-1")) as attempt:
        outcomes = attempt.send(messages)
    assert [o.status for o in outcomes[:2]] == [OutcomeStatus.REJECTED] * 2
    assert all(o.reason for o in outcomes[:2])
    assert statuses(outcomes[2:]) == {"SENT": 3}
    assert attempt.completable


def test_send_run_completes_a_delivered_run_and_a_second_call_sends_nothing(
    ledger: InMemoryLedger, kinesis: FakeKinesisClient, clock: ManualClock
) -> None:
    """GIVEN the Python API's send_run WHEN a run is sent, then sent again THEN the first call
    SENT every row and completed the run, and the second sends nothing."""
    producer = producer_over(ledger, kinesis, clock)
    assert statuses(producer.send_run("nightly", rows(7))) == {"SENT": 7}
    run = producer.run_of("nightly")
    assert run is not None
    assert run.state is RunState.COMPLETE
    assert run.counts == {"SENT": 7}
    puts = kinesis.put_calls
    assert statuses(producer.send_run("nightly", rows(7))) == {"DUPLICATE": 7}
    assert kinesis.put_calls == puts


def test_send_run_leaves_a_run_with_a_rejected_row_open_for_a_fixed_re_run(
    ledger: InMemoryLedger, kinesis: FakeKinesisClient, clock: ManualClock
) -> None:
    """GIVEN a run with one invalid row WHEN it is sent THEN the run stays OPEN; WHEN it is
    sent again with the row fixed THEN only that row is sent and the run completes."""
    producer = producer_over(ledger, kinesis, clock)
    broken = [*rows(4), Message("", b"fixed later")]
    assert statuses(producer.send_run("nightly", broken)) == {"SENT": 4, "REJECTED": 1}
    assert producer.run_of("nightly").state is RunState.OPEN  # type: ignore[union-attr]
    fixed = [*rows(4), Message("k-fixed", b"fixed later")]
    assert statuses(producer.send_run("nightly", fixed)) == {"DUPLICATE": 4, "SENT": 1}
    assert producer.run_of("nightly").state is RunState.COMPLETE  # type: ignore[union-attr]
    assert in_stream(kinesis) == as_multiset(fixed)


def test_an_identical_row_put_ambiguously_in_a_later_call_is_not_taken_for_the_first(
    ledger: InMemoryLedger, kinesis: FakeKinesisClient, clock: ManualClock
) -> None:
    """GIVEN an attempt that wrote row r in one call WHEN a later call of the same attempt puts
    r again and that put times out unwritten THEN its read-back does not take the first copy
    for it: r is sent again, and the stream holds it twice, as the input does."""
    row = Message("k", b"same")
    with producer_over(ledger, kinesis, clock).attempt(ReplayTask(RUN, "exec-1")) as attempt:
        assert statuses(attempt.send([row])) == {"SENT": 1}
        kinesis.script(PutFault.NOT_WRITTEN)
        assert statuses(attempt.send([row])) == {"SENT": 1}
    assert in_stream(kinesis) == {("k", b"same"): 2}


def test_a_task_of_an_execution_a_replay_superseded_sends_nothing(
    ledger: InMemoryLedger, kinesis: FakeKinesisClient, clock: ManualClock
) -> None:
    """GIVEN task 0 of a first execution that put its rows, and a replay (another execution)
    that superseded it and delivered the run WHEN task 1 of the first execution starts late (a
    zombie driver's executor) THEN it cannot register: its rows are FAILED with the reason, none
    is put, and the attempt is not completable."""
    first = producer_over(ledger, kinesis, clock)
    with first.attempt(ReplayTask(RUN, "exec-1", task="0")) as task0:
        task0.send(rows(5, "a"))
    with producer_over(ledger, kinesis, clock).attempt(ReplayTask(RUN, "exec-2")) as replay:
        assert statuses(replay.send(rows(5, "a") + rows(5, "b"))) == {"DUPLICATE": 5, "SENT": 5}
    puts = kinesis.put_calls
    with first.attempt(ReplayTask(RUN, "exec-1", task="1")) as late:
        assert late.step is RecoveryStep.SUPERSEDED
        outcomes = late.send(rows(5, "b"))
    assert statuses(outcomes) == {"FAILED": 5}
    assert all("superseded" in (o.reason or "") for o in outcomes)
    assert not late.completable
    assert kinesis.put_calls == puts
    assert in_stream(kinesis) == as_multiset(rows(5, "a") + rows(5, "b"))


def test_a_recovery_read_longer_than_the_lease_keeps_the_attempts_lease(
    ledger: InMemoryLedger,
    kinesis: FakeKinesisClient,
    clock: ManualClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """GIVEN an attempt that put 3,000 rows and died, its lease over WHEN a replay's read-back
    of them outlasts its own lease (each GetRecords page of 500 takes 5 s) THEN it renews its
    lease while it reads, and sends its new rows (it used to find its lease over, and fail
    them)."""
    producer_over(ledger, kinesis, clock).attempt(ReplayTask(RUN, "exec-1")).send(rows(3_000))
    clock.advance(LEASE.lease_ms + LEASE.skew_ms)
    read = kinesis.get_records

    def slow_read(*, ShardIterator: str, Limit: int = 10_000) -> object:  # noqa: N803 - boto3's
        clock.advance(5_000)
        return read(ShardIterator=ShardIterator, Limit=min(Limit, 500))

    monkeypatch.setattr(kinesis, "get_records", slow_read)
    started_ms = clock.now_ms()
    with producer_over(ledger, kinesis, clock).attempt(ReplayTask(RUN, "exec-2")) as replay:
        assert replay.step is RecoveryStep.RECOVER
        outcomes = replay.send(rows(3_010))
    assert statuses(outcomes) == {"DUPLICATE": 3_000, "SENT": 10}
    assert clock.now_ms() - started_ms > 2 * LEASE.lease_ms
    assert in_stream(kinesis) == as_multiset(rows(3_010))


DAY_MS = 24 * 3_600_000


def test_a_replay_whose_earlier_window_is_past_the_streams_retention_fails_and_sends_nothing(
    ledger: InMemoryLedger, kinesis: FakeKinesisClient, clock: ManualClock
) -> None:
    """GIVEN a first execution that put half its rows and died, a day ago (the stream's
    retention: 24 h) WHEN the run is replayed THEN the replay cannot read what was put before
    the trim horizon: it fails with an error naming the run, sends nothing, and counts it;
    nothing is left open for a later replay to wait for."""
    producer = producer_over(ledger, kinesis, clock)
    messages = rows(10)
    first = producer.attempt(ReplayTask(RUN, "exec-1"))
    first.send(messages[:5])  # killed here: never finished
    clock.advance(DAY_MS)
    before = metrics.REPLAY_PAST_RETENTION.labels(STREAM, "failed")._value.get()
    with pytest.raises(ReplayWindowTrimmedError) as raised:
        producer.attempt(ReplayTask(RUN, "exec-2"))
    assert raised.value.run == RUN
    assert RUN in str(raised.value)
    assert "KEO_REPLAY_PAST_RETENTION" in str(raised.value)
    assert raised.value.window_start_ms < raised.value.trim_horizon_ms
    assert metrics.REPLAY_PAST_RETENTION.labels(STREAM, "failed")._value.get() == before + 1
    assert in_stream(kinesis) == as_multiset(messages[:5])
    run = producer.run_of(RUN)
    assert run is not None
    assert run.execution("exec-2") is not None
    assert run.execution("exec-2").finished  # type: ignore[union-attr]


def test_a_replay_past_retention_sends_the_rows_not_found_when_the_risk_is_accepted(
    ledger: InMemoryLedger, kinesis: FakeKinesisClient, clock: ManualClock
) -> None:
    """GIVEN the same replay a day after its first execution died WHEN the policy accepts the
    risk (``KEO_REPLAY_PAST_RETENTION=send``) THEN the rows it does not find are sent."""
    producer = producer_over(ledger, kinesis, clock)
    messages = rows(10)
    producer.attempt(ReplayTask(RUN, "exec-1")).send(messages[:5])
    clock.advance(DAY_MS)
    accepting = replay_producer_over(ledger, kinesis, clock, LEASE, send_past_retention=True)
    with accepting.attempt(ReplayTask(RUN, "exec-2")) as replay:
        assert replay.step is RecoveryStep.RECOVER
        outcomes = replay.send(messages)
    assert statuses(outcomes) == {"DUPLICATE": 5, "SENT": 5}


def test_a_run_lives_at_least_the_streams_retention(
    ledger: InMemoryLedger, kinesis: FakeKinesisClient, clock: ManualClock
) -> None:
    """GIVEN a stream kept 30 days, longer than the dedupe TTL (7 days) WHEN a run registers
    and completes THEN its item lives 30 days from its completion: a re-run of the COMPLETE
    run within the retention finds it and sends nothing."""
    producer = replay_producer_over(ledger, kinesis, clock, LEASE, retention_hours=30 * 24)
    producer.send_run(RUN, rows(4))
    run = producer.run_of(RUN)
    assert run is not None
    assert run.state is RunState.COMPLETE
    assert run.expires_at_s == clock.now_ms() // 1000 + 30 * 24 * 3600
    assert run.expires_at_s > clock.now_ms() // 1000 + ledger.dedupe_ttl_s


@pytest.mark.parametrize("writer", ["another run", "a sibling task"])
def test_an_ambiguous_put_is_not_matched_to_an_identical_row_written_before_it_was_sent(
    ledger: InMemoryLedger, kinesis: FakeKinesisClient, clock: ManualClock, writer: str
) -> None:
    """GIVEN an attempt that started, and another writer (another run, or a sibling task of the
    same execution) that then put row r WHEN the attempt puts r more than the skew later and
    that put times out before its write THEN its read-back starts at the put's own send time:
    the other writer's copy is not taken for it, r is sent again, and the stream holds both
    copies (it used to hold one: the read-back started at the attempt's start)."""
    row = Message("k", b"same")
    producer = producer_over(ledger, kinesis, clock)
    with producer.attempt(ReplayTask(RUN, "exec-1", task="0")) as attempt:
        clock.advance(1_000)
        other = (
            ReplayTask("query-a/6", "exec-0")
            if writer == "another run"
            else ReplayTask(RUN, "exec-1", task="1")
        )
        with producer_over(ledger, kinesis, clock).attempt(other) as theirs:
            assert statuses(theirs.send([row])) == {"SENT": 1}
        clock.advance(LEASE.skew_ms + 1)
        kinesis.script(PutFault.NOT_WRITTEN)
        assert statuses(attempt.send([row])) == {"SENT": 1}
        assert attempt.rows_matched_ambiguously == 0
    assert in_stream(kinesis) == {("k", b"same"): 2}


def test_a_recovery_match_beside_an_identical_record_of_another_writer_is_counted_and_warned(
    ledger: InMemoryLedger,
    kinesis: FakeKinesisClient,
    clock: ManualClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """GIVEN an attempt that put row r and died, and another run that put r inside that
    attempt's window WHEN a replay recovers r THEN it takes one copy (r is DUPLICATE), and
    counts the match as possibly another writer's: on the attempt, in
    keo_replay_rows_matched_ambiguously_total, and in one warning naming the stream and run."""
    row = Message("k", b"same")
    producer_over(ledger, kinesis, clock).attempt(ReplayTask(RUN, "exec-1")).send([row])
    with producer_over(ledger, kinesis, clock).attempt(ReplayTask("query-a/6", "x")) as other:
        other.send([row])
    before = metrics.REPLAY_ROWS_MATCHED_AMBIGUOUSLY.labels(STREAM)._value.get()
    with (
        caplog.at_level(logging.WARNING, logger="producer.replay.attempt"),
        producer_over(ledger, kinesis, clock).attempt(ReplayTask(RUN, "exec-2")) as replay,
    ):
        assert statuses(replay.send([row, *rows(2)])) == {"DUPLICATE": 1, "SENT": 2}
    assert replay.rows_matched_ambiguously == 1
    assert metrics.REPLAY_ROWS_MATCHED_AMBIGUOUSLY.labels(STREAM)._value.get() == before + 1
    warnings = [r.getMessage() for r in caplog.records if "another writer" in r.getMessage()]
    assert len(warnings) == 1
    assert f"stream={STREAM}" in warnings[0]
    assert f"run={RUN}" in warnings[0]
    assert "rows=1" in warnings[0]


def test_an_ambiguous_put_found_beside_another_writers_identical_row_is_counted(
    ledger: InMemoryLedger, kinesis: FakeKinesisClient, clock: ManualClock
) -> None:
    """GIVEN another run that put row r just as an attempt put r (inside the skew of its send)
    WHEN the attempt's put is written with its response lost THEN its read-back finds two
    copies, takes one for it (SENT, nothing resent), and counts the match as possibly another
    writer's; a row with one copy found is not counted."""
    row = Message("k", b"same")
    with producer_over(ledger, kinesis, clock).attempt(ReplayTask(RUN, "exec-1")) as attempt:
        with producer_over(ledger, kinesis, clock).attempt(ReplayTask("query-a/6", "x")) as other:
            other.send([row])
        kinesis.script(PutFault.RESPONSE_LOST)
        assert statuses(attempt.send([row, Message("u", b"unique")])) == {"SENT": 2}
        assert attempt.rows_matched_ambiguously == 1
    assert in_stream(kinesis) == {("k", b"same"): 2, ("u", b"unique"): 1}


class SiblingPutsAfterMyPut:
    """Hooks for task 0: right after its first PutRecords, sibling task 1 of its execution
    puts ``rows`` (before task 0 reads its ambiguous put back)."""

    def __init__(self, producer: ReplayProducer, rows: list[Message]) -> None:
        self._producer, self._rows = producer, rows

    def at(self, step: Step, *, batch_id: int | None = None) -> None:  # noqa: ARG002
        if step is Step.AFTER_PUT and self._rows:
            rows, self._rows = self._rows, []
            with self._producer.attempt(ReplayTask(RUN, "exec-1", task="1")) as sibling:
                assert statuses(sibling.send(rows)) == {"SENT": 1}


def test_a_late_put_settled_by_a_siblings_identical_record_is_waited_for_only_by_its_row(
    ledger: InMemoryLedger, kinesis: FakeKinesisClient, clock: ManualClock
) -> None:
    """GIVEN task 0 whose put of row r times out and lands later, and its sibling task 1 that
    puts r just after: task 0 reads back, takes the sibling's copy for its own (SENT), and
    finishes with r listed as a late row WHEN a replay carries row u (never put), then both
    r THEN u is sent with no wait; the second r is not found at once, so the replay waits
    for the execution's lease, finds the late copy, and sends nothing more: r twice, u once
    (it used to send r a third time)."""
    row, unique = Message("k", b"same"), Message("u", b"unique")
    sibling = producer_over(ledger, kinesis, clock)
    kinesis.script(PutFault.LATE)
    first = replay_producer_over(
        ledger, kinesis, clock, LEASE, hooks=SiblingPutsAfterMyPut(sibling, [row])
    )
    with first.attempt(ReplayTask(RUN, "exec-1", task="0")) as task0:
        assert statuses(task0.send([row])) == {"SENT": 1}
    run = ledger.get_run(STREAM, RUN)
    assert run is not None
    assert run.executions[0].finished
    assert len(run.executions[0].late_rows) == 1
    assert in_stream(kinesis) == {("k", b"same"): 1}  # task 0's put has not landed yet

    started_ms = clock.now_ms()
    with producer_over(ledger, kinesis, clock).attempt(ReplayTask(RUN, "exec-2")) as replay:
        assert statuses(replay.send([unique])) == {"SENT": 1}
        assert clock.now_ms() == started_ms
        assert statuses(replay.send([row, row])) == {"DUPLICATE": 2}
    kinesis.land_all()
    assert in_stream(kinesis) == {("k", b"same"): 2, ("u", b"unique"): 1}
    assert LEASE.expired_for_everyone(task0.me.lease_expires_at_ms, clock.now_ms())


def test_a_recovery_that_waits_past_the_trim_horizon_fails_before_reading_again(
    ledger: InMemoryLedger, kinesis: FakeKinesisClient, clock: ManualClock
) -> None:
    """GIVEN a first execution that put half its rows and died almost a retention ago, and a
    second one still running WHEN a third starts inside the retention, finds rows missing and
    waits for the second's lease THEN, the first's window now past the trim horizon, it fails
    before it reads again and sends nothing (it would resend rows it can no longer see)."""
    producer = producer_over(ledger, kinesis, clock)
    messages = rows(10)
    producer.attempt(ReplayTask(RUN, "exec-1")).send(messages[:5])  # killed: never finished
    clock.advance(DAY_MS - 10_000)
    producer.attempt(ReplayTask(RUN, "exec-2")).send(messages[5:6])  # running, its lease on
    clock.advance(1_000)
    third = producer.attempt(ReplayTask(RUN, "exec-3"))
    assert third.step is RecoveryStep.WAIT
    with pytest.raises(ReplayWindowTrimmedError):
        third.send(messages)
    assert in_stream(kinesis) == as_multiset(messages[:6])


def test_a_replayed_batchs_tasks_in_one_worker_read_each_shard_and_list_the_shards_once(
    ledger: InMemoryLedger, kinesis: FakeKinesisClient, clock: ManualClock
) -> None:
    """GIVEN an execution whose 6 tasks put their rows on both shards and died (the driver
    killed), their leases since over WHEN a replay runs the 6 tasks one after another in one
    worker (one reader, as a Spark Python worker keeps one client set) THEN each recovers its
    own rows (DUPLICATE), and the worker listed the shards once and read each shard's windows
    once, not once per task (issue 39: T tasks read each shard T times)."""
    first = producer_over(ledger, kinesis, clock)
    for task in range(6):
        first.attempt(ReplayTask(RUN, "exec-1", task=str(task))).send(rows(10, f"t{task}-"))
    clock.advance(3 * LEASE.lease_ms)
    worker = producer_over(ledger, kinesis, clock)

    found = Counter[str]()
    reads: list[int] = []  # GetRecords calls, per task
    for task in range(6):
        reads_before = kinesis.get_records_calls
        with worker.attempt(ReplayTask(RUN, "exec-2", task=str(task))) as replay:
            found += statuses(replay.send(rows(10, f"t{task}-")))
        reads.append(kinesis.get_records_calls - reads_before)

    shared = shared_by(worker._context.reader)
    assert found == {"DUPLICATE": 60}
    assert shared.listings == 1
    assert shared.reads == len(kinesis.list_shards(StreamName=STREAM)["Shards"])
    assert reads[0] > 0
    assert reads[1:] == [0] * 5
    assert in_stream(kinesis) == sum((as_multiset(rows(10, f"t{t}-")) for t in range(6)), Counter())


def test_a_replay_planned_on_the_driver_is_read_once_there_and_its_tasks_read_nothing(
    ledger: InMemoryLedger, kinesis: FakeKinesisClient, clock: ManualClock
) -> None:
    """GIVEN an execution whose 6 tasks put their rows and died, and a driver that starts the
    replay while one of their leases still runs, then again once they are over WHEN it plans
    the replay's recovery (plan_reads), and a worker seeded with the plan runs the 6 tasks
    THEN no plan is made while a lease runs (a later read could find more); once they are
    over the driver reads each shard once, and the tasks recover every row reading nothing."""
    first = producer_over(ledger, kinesis, clock)
    for task in range(6):
        first.attempt(ReplayTask(RUN, "exec-1", task=str(task))).send(rows(10, f"t{task}-"))
    driver = KinesisReader(kinesis, STREAM, sleep=kinesis.sleep)
    early = plan_reads(ledger, driver, clock, LEASE, RUN)
    clock.advance(3 * LEASE.lease_ms)
    reads_before = kinesis.get_records_calls
    planned = plan_reads(ledger, driver, clock, LEASE, RUN)
    driver_reads = kinesis.get_records_calls - reads_before
    assert early is None
    assert planned is not None
    assert planned.records == 60
    assert 0 < driver_reads <= 2 * len(planned.shards)  # a page and the tip, a shard

    found, reads = _six_tasks_seeded_with(planned, ledger, kinesis, clock)
    assert found == {"DUPLICATE": 60}
    assert reads == 0


def test_a_replay_started_while_a_killed_execution_may_still_put_is_planned_once_it_is_over(
    ledger: InMemoryLedger, kinesis: FakeKinesisClient, clock: ManualClock
) -> None:
    """GIVEN an execution whose 6 tasks put their rows and died unfinished (a driver killed in
    the middle of its batch), and a driver restarted within their lease WHEN it plans the
    replay's recovery (plan_reads_once_over), and a worker seeded with the plan runs the 6
    tasks THEN the driver superseded the killed execution (its lease can no longer grow),
    waited until that lease was over for every clock, read each shard once, and the tasks
    recovered every row reading nothing; no task waited."""
    first = producer_over(ledger, kinesis, clock)
    for task in range(6):
        first.attempt(ReplayTask(RUN, "exec-1", task=str(task))).send(rows(10, f"t{task}-"))
    killed = ledger.get_run(STREAM, RUN)
    assert killed is not None
    lease_end_ms = killed.executions[0].lease_expires_at_ms
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock.advance(int(seconds * 1000))

    driver = KinesisReader(kinesis, STREAM, sleep=kinesis.sleep)
    planned = plan_reads_once_over(ledger, driver, clock, LEASE, RUN, sleep=sleep)
    assert planned is not None
    assert planned.records == 60
    run = ledger.get_run(STREAM, RUN)
    assert run is not None
    assert [e.superseded for e in run.executions] == [True]
    assert LEASE.expired_for_everyone(lease_end_ms, clock.now_ms())
    assert clock.now_ms() <= lease_end_ms + 2 * LEASE.skew_ms + 1000  # no longer than that

    found, reads = _six_tasks_seeded_with(planned, ledger, kinesis, clock)
    assert found == {"DUPLICATE": 60}
    assert reads == 0


def test_a_replay_of_an_execution_that_finished_is_not_waited_for_on_the_driver(
    ledger: InMemoryLedger, kinesis: FakeKinesisClient, clock: ManualClock
) -> None:
    """GIVEN an execution whose tasks put their rows and finished (a driver killed in its
    commit) WHEN a driver restarted within their lease plans the replay THEN it neither waits
    nor supersedes: the tasks find every row at once, without a wait of their own."""
    first = producer_over(ledger, kinesis, clock)
    for task in range(2):
        with first.attempt(ReplayTask(RUN, "exec-1", task=str(task))) as attempt:
            attempt.send(rows(10, f"t{task}-"))
    driver = KinesisReader(kinesis, STREAM, sleep=kinesis.sleep)
    planned = plan_reads_once_over(
        ledger, driver, clock, LEASE, RUN, sleep=lambda s: pytest.fail(f"slept {s} s")
    )
    assert planned is None
    run = ledger.get_run(STREAM, RUN)
    assert run is not None
    assert [e.superseded for e in run.executions] == [False]


def _six_tasks_seeded_with(
    planned: PlannedReads, ledger: InMemoryLedger, kinesis: FakeKinesisClient, clock: ManualClock
) -> tuple[Counter[str], int]:
    """A worker seeded with a driver's plan runs the replay's 6 tasks (10 rows each, as the
    killed execution's): what they found, and the GetRecords calls they made."""
    worker = producer_over(ledger, kinesis, clock)
    shared_by(worker._context.reader).seed(planned)
    reads_before = kinesis.get_records_calls
    found = Counter[str]()
    for task in range(6):
        with worker.attempt(ReplayTask(RUN, "exec-2", task=str(task))) as replay:
            found += statuses(replay.send(rows(10, f"t{task}-")))
    return found, kinesis.get_records_calls - reads_before


# --- a read-back routed by the driver's listing (issue 39: a retry wave listed once a retry) --


def _counting_listings(kinesis: FakeKinesisClient, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The stream's ListShards calls from now on, counted in a one-item list."""
    calls = [0]
    list_shards = kinesis.list_shards

    def counted(**kwargs: Any) -> Any:
        calls[0] += 1
        return list_shards(**kwargs)

    monkeypatch.setattr(kinesis, "list_shards", counted)
    return calls


def _listed_open(kinesis: FakeKinesisClient) -> list[Shard]:
    """The stream's open shards as a driver lists them before its write's tasks start."""
    return open_shards(KinesisReader(kinesis, STREAM).shards())


def _split_each(kinesis: FakeKinesisClient, shards: list[Shard]) -> None:
    """Each of ``shards`` split a quarter of the hash space past its start."""
    for shard in shards:
        kinesis.split_shard(shard.shard_id, shard.starting_hash_key + 2**125)


def test_a_task_retry_reads_back_by_the_drivers_listing_and_lists_nothing(
    ledger: InMemoryLedger,
    kinesis: FakeKinesisClient,
    clock: ManualClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """GIVEN the open shards a driver listed before its execution's tasks started, and a task
    whose first attempt put its rows and failed (its lease left running) WHEN the task is
    retried with that listing THEN its first read, made while that lease runs, finds every row
    (DUPLICATE) without listing the stream: a read that is not final proves nothing and needs
    to prove nothing (a row it missed would be waited for and read again)."""
    listed = _listed_open(kinesis)
    producer = producer_over(ledger, kinesis, clock)
    first = producer.attempt(ReplayTask(RUN, "exec-1", task="0"), listed_before=listed)
    first.send(rows(20))  # never finished: the task failed after its puts
    listings = _counting_listings(kinesis, monkeypatch)
    retry_task = ReplayTask(RUN, "exec-1", task="0", task_attempt=1)
    with producer.attempt(retry_task, listed_before=listed) as retry:
        found = statuses(retry.send(rows(20)))
    assert found == {"DUPLICATE": 20}
    assert listings == [0]
    assert in_stream(kinesis) == as_multiset(rows(20))


def test_a_final_read_back_routed_by_the_drivers_listing_lists_nothing_when_later_records_prove_it(
    ledger: InMemoryLedger,
    kinesis: FakeKinesisClient,
    clock: ManualClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """GIVEN the driver's listing, a first attempt that put half its rows and failed (its lease
    left running), and records that arrived on every shard after that lease (the batch's other
    tasks, the stream's traffic) WHEN the task is retried with that listing THEN it waits for
    the lease, and its final reads each stop at a record past the window, proving every listed
    shard open through it: the half put is found, the rest sent, and the stream not listed."""
    listed = _listed_open(kinesis)
    producer = producer_over(ledger, kinesis, clock)
    messages = rows(20)
    first = producer.attempt(ReplayTask(RUN, "exec-1", task="0"), listed_before=listed)
    first.send(messages[:10])  # never finished: the task failed half way
    clock.advance(LEASE.lease_ms + 2 * LEASE.skew_ms + 1_000)
    traffic = [
        {"PartitionKey": "other", "Data": b"x", "ExplicitHashKey": str(s.starting_hash_key)}
        for s in listed
    ]
    kinesis.put_records(StreamName=STREAM, Records=traffic)
    listings = _counting_listings(kinesis, monkeypatch)
    retry_task = ReplayTask(RUN, "exec-1", task="0", task_attempt=1)
    with producer.attempt(retry_task, listed_before=listed) as retry:
        found = statuses(retry.send(messages))
    assert found == {"DUPLICATE": 10, "SENT": 10}
    assert listings == [0]
    assert in_stream(kinesis) - Counter({("other", b"x"): len(listed)}) == as_multiset(messages)


@pytest.mark.parametrize("tip_page_before_end", [False, True])
def test_a_task_retry_whose_reads_end_at_the_tip_lists_the_stream_and_finds_rows_on_children(
    ledger: InMemoryLedger,
    kinesis: FakeKinesisClient,
    clock: ManualClock,
    monkeypatch: pytest.MonkeyPatch,
    tip_page_before_end: bool,
) -> None:
    """GIVEN the driver's listing, a first attempt that put half its rows, a shard the listing
    holds split more than a second later, the other half put (some on the children), and a
    Kinesis that may answer an empty page at a closed shard's tip before its end (kinesalite)
    WHEN the task is retried with that listing and nothing arrived after the window THEN no
    read proves its shard open (each ends at a tip or an end), so it lists the stream and
    reads the children: every row found, none sent twice."""
    kinesis.tip_page_before_end = tip_page_before_end
    listed = _listed_open(kinesis)
    producer = producer_over(ledger, kinesis, clock)
    messages = rows(40)
    with producer.attempt(ReplayTask(RUN, "exec-1", task="0"), listed_before=listed) as first:
        first.send(messages[:20])
        clock.advance(1_500)
        kinesis.split_shard(listed[0].shard_id, listed[0].starting_hash_key + 2**125)
        first.send(messages[20:])
    children = {s.shard_id for s in _listed_open(kinesis)} - {s.shard_id for s in listed}
    assert {r.shard_id for r in kinesis.visible()} & children  # rows the listing cannot route
    listings = _counting_listings(kinesis, monkeypatch)
    retry_task = ReplayTask(RUN, "exec-1", task="0", task_attempt=1)
    with producer.attempt(retry_task, listed_before=listed) as retry:
        found = statuses(retry.send(messages))
    assert found == {"DUPLICATE": 40}
    assert listings == [1]
    assert in_stream(kinesis) == as_multiset(messages)


def test_an_ambiguous_put_on_a_child_born_since_the_drivers_listing_is_found_not_resent(
    ledger: InMemoryLedger,
    kinesis: FakeKinesisClient,
    clock: ManualClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """GIVEN the driver's listing, then a split of every shard it holds WHEN an attempt's first
    PutRecords is written with its response lost THEN its own read-back, routed by the listing,
    meets the split shards' ends and reads the children: every row SENT, each once."""
    listed = _listed_open(kinesis)
    _split_each(kinesis, listed)
    clock.advance(1_000)
    kinesis.script(PutFault.RESPONSE_LOST)
    listings = _counting_listings(kinesis, monkeypatch)
    messages = rows(12)
    producer = producer_over(ledger, kinesis, clock)
    with producer.attempt(ReplayTask(RUN, "exec-1"), listed_before=listed) as attempt:
        outcomes = attempt.send(messages)
    assert statuses(outcomes) == {"SENT": 12}
    assert listings == [1]
    assert in_stream(kinesis) == as_multiset(messages)


def test_a_replay_of_another_execution_never_routes_by_the_drivers_listing(
    ledger: InMemoryLedger,
    kinesis: FakeKinesisClient,
    clock: ManualClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """GIVEN an execution that put its rows, then a split of every shard, and a new execution
    whose driver listed the open shards after it (the children only) WHEN the new execution's
    task replays the run with that listing THEN it lists the stream (the earlier execution's
    puts came before the listing: on shards it does not hold) and finds every row."""
    producer = producer_over(ledger, kinesis, clock)
    with producer.attempt(ReplayTask(RUN, "exec-1", task="0")) as first:
        first.send(rows(20))
    _split_each(kinesis, _listed_open(kinesis))
    clock.advance(3 * LEASE.lease_ms)
    listed = _listed_open(kinesis)
    listings = _counting_listings(kinesis, monkeypatch)
    with producer.attempt(ReplayTask(RUN, "exec-2", task="0"), listed_before=listed) as replay:
        found = statuses(replay.send(rows(20)))
    assert found == {"DUPLICATE": 20}
    assert listings[0] >= 1
    assert in_stream(kinesis) == as_multiset(rows(20))


def test_a_listing_that_does_not_cover_a_rows_hash_key_is_not_trusted(
    ledger: InMemoryLedger,
    kinesis: FakeKinesisClient,
    clock: ManualClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """GIVEN a task whose first attempt put its rows on both shards WHEN its retry is given a
    listing that holds only one of them (not the stream's open shards) THEN the rows it does
    not cover are routed by the stream's listing: found, not sent again."""
    producer = producer_over(ledger, kinesis, clock)
    with producer.attempt(ReplayTask(RUN, "exec-1", task="0")) as first:
        first.send(rows(20))
    assert len({r.shard_id for r in kinesis.visible()}) == 2
    half = _listed_open(kinesis)[:1]
    listings = _counting_listings(kinesis, monkeypatch)
    retry_task = ReplayTask(RUN, "exec-1", task="0", task_attempt=1)
    with producer.attempt(retry_task, listed_before=half) as retry:
        found = statuses(retry.send(rows(20)))
    assert found == {"DUPLICATE": 20}
    assert listings == [1]
    assert in_stream(kinesis) == as_multiset(rows(20))


class RaiseAfterPut:
    """Hooks that raise right after a PutRecords came back (a worker failing mid-send)."""

    def at(self, step: Step, *, batch_id: int | None = None) -> None:  # noqa: ARG002
        if step is Step.AFTER_PUT:
            raise RuntimeError("failed right after a put")


def test_a_task_whose_send_raised_keeps_its_lease_for_its_retry_to_wait_out(
    ledger: InMemoryLedger, kinesis: FakeKinesisClient, clock: ManualClock
) -> None:
    """GIVEN a task attempt whose send raised while putting (a request may be in flight)
    WHEN the task is retried THEN the failed attempt is not finished: the retry waits for its
    lease before it decides a row it did not find; each row once."""
    producer = replay_producer_over(ledger, kinesis, clock, LEASE, hooks=RaiseAfterPut())
    messages = rows(10)
    with pytest.raises(RuntimeError), producer.attempt(ReplayTask(RUN, "exec-1")) as first:
        first.send(messages)
    retry_producer = producer_over(ledger, kinesis, clock)
    with retry_producer.attempt(ReplayTask(RUN, "exec-1", task_attempt=1)) as retry:
        assert retry.step is RecoveryStep.WAIT
        assert statuses(retry.send(messages)) == {"DUPLICATE": 10}
    assert in_stream(kinesis) == as_multiset(messages)


# --- renewals spread (issue 39: every renewal writes the run item) ----------------------------


def test_early_renewals_of_2000_attempts_spread_over_half_the_fences_slack() -> None:
    """GIVEN the fence's default lease (360 s, a 300 s window, 5 s of skew: a slack of 55 s)
    WHEN 2,000 attempts that started together take their early renewal THEN each renews up to
    half the slack early, and no second of that half holds more than 5 times its even share:
    not the 2,000 writes on the run item in one second that renewing together would be."""
    fenced = LeasePolicy(
        lease_ms=360_000, put_timeout_ms=7_000, skew_ms=5_000, signature_window_ms=300_000
    )
    slack_ms = fenced.lease_ms - fenced.send_margin_ms
    early = [early_renewal_ms(fenced, f"{i:032x}") for i in range(2_000)]
    assert slack_ms == 55_000
    assert all(0 <= e < slack_ms // 2 for e in early)
    per_second = Counter(e // 1_000 for e in early)
    assert len(per_second) == slack_ms // 2_000 + 1
    assert max(per_second.values()) <= 5 * 2_000 // 28


def test_attempts_started_together_renew_in_different_seconds_and_keep_their_leases(
    ledger: InMemoryLedger,
    kinesis: FakeKinesisClient,
    clock: ManualClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """GIVEN 100 attempts of one execution registered in the same instant (ids drawn from a
    fixed seed: 100 random ids put 28 renewals in one second in about a third of the draws)
    WHEN their leases are kept through two leases, each looked at every 250 ms THEN none was
    lost, each renewed, and their renewals spread over the seconds of half the slack (at most
    a quarter in any second), not all in one."""
    draw = random.Random(39)
    monkeypatch.setattr(uuid, "uuid4", lambda: uuid.UUID(int=draw.getrandbits(128)))
    producer = producer_over(ledger, kinesis, clock)
    attempts = [producer.attempt(ReplayTask(RUN, "exec-1", task=str(t))) for t in range(100)]
    renewed_at: list[int] = []
    renew = ledger.renew_attempt

    def counted(*args: Any, **kwargs: Any) -> Any:
        renewed_at.append(clock.now_ms())
        return renew(*args, **kwargs)

    ledger.renew_attempt = counted  # type: ignore[method-assign]
    for _ in range(2 * LEASE.lease_ms // 250):
        clock.advance(250)
        assert all(a._lease.keep() for a in attempts)
    per_second = Counter(at // 1_000 for at in renewed_at)
    assert len(renewed_at) >= len(attempts)
    assert max(per_second.values()) <= len(attempts) // 4


def test_an_early_renewal_the_ledger_fails_keeps_the_lease_while_it_is_safe(
    ledger: InMemoryLedger, kinesis: FakeKinesisClient, clock: ManualClock
) -> None:
    """GIVEN an attempt whose lease is in its early-renewal span, and the ledger failing the
    renewal WHEN the lease is kept THEN it still is (a put sent now cannot outlive it), and the
    renewal is tried again a second later, not at every put."""
    producer = producer_over(ledger, kinesis, clock)
    attempt = next(
        a
        for t in range(50)
        if early_renewal_ms(
            LEASE, (a := producer.attempt(ReplayTask(RUN, "e", task=str(t)))).me.attempt_id
        )
        > 2_000
    )
    lease = attempt._lease
    clock.advance(attempt.me.lease_expires_at_ms - LEASE.send_margin_ms - clock.now_ms() - 1_000)
    ledger.inject("renew_attempt", LedgerFault.UNAVAILABLE)
    assert lease.keep()
    assert ledger.pending_faults() == 0
    ledger.inject("renew_attempt", LedgerFault.UNAVAILABLE)
    assert lease.keep()  # within the second: not tried again
    assert ledger.pending_faults() == 1
    ledger.clear_faults()
    clock.advance(1_000)
    before_ms = lease.end_ms
    assert lease.keep()
    assert lease.end_ms > before_ms
