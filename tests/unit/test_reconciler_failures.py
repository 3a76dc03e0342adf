"""A reconciler pass settles what it can: one failing read or write does not lose the rest;
and it reports the replay-mode runs left open, which it cannot settle.

Over the in-memory ledger and Kinesis of ``tests/fakes`` (the same fakes as the protocol
model), with the ledger made to fail at one operation.
"""

from __future__ import annotations

import logging

import pytest
from fakes.kinesis import FakeKinesisClient
from fakes.ledger import InMemoryLedger, LedgerFault
from planting import request_of
from prometheus_client import REGISTRY

from dedupe_store.clock import ManualClock
from dedupe_store.records import ClaimRequest, RunAttempt
from dedupe_store.states import RunState
from kinesis_store.reader import KinesisReader
from kinesis_store.writer import KinesisWriter
from producer.key.readback import ReadBackResolver
from producer.protocol import LeasePolicy, Message
from producer.reconcile.reconciler import Reconciler

STREAM = "orders"
LEASE = LeasePolicy(lease_ms=20_000, put_timeout_ms=7_000, skew_ms=5_000)
BUCKETS = 4


def stale_groups(ledger: InMemoryLedger, clock: ManualClock, count: int) -> list[str]:
    """``count`` one-key groups of a producer that died after claiming (nothing was put)."""
    ids = []
    for n in range(count):
        key = f"order-{n}"
        group = ledger.open_group(
            STREAM, [key], owner="crashed", now_ms=clock.now_ms(), lease_ms=LEASE.lease_ms
        )
        ledger.claim(request(key), group, now_ms=clock.now_ms())
        ids.append(group.group_id)
    clock.advance(LEASE.lease_ms + 2 * LEASE.skew_ms)
    return ids


def request(key: str) -> ClaimRequest:
    return request_of(STREAM, Message(key, b"data"))


def reconciler(ledger: InMemoryLedger, clock: ManualClock) -> Reconciler:
    kinesis = FakeKinesisClient(
        stream=STREAM, clock=clock, shard_count=2, put_timeout_ms=LEASE.put_timeout_ms
    )
    reader = KinesisReader(kinesis, STREAM, sleep=kinesis.sleep)
    return Reconciler(
        stream=STREAM,
        ledger=ledger,
        resolver=ReadBackResolver(reader, clock, LEASE, retention_hours=24),
        writer=KinesisWriter(kinesis, STREAM),
        clock=clock,
        lease=LEASE,
        owner="reconciler",
        sleep=kinesis.sleep,
    )


def test_a_bucket_that_cannot_be_read_is_reported_and_the_others_are_settled() -> None:
    # GIVEN 12 stale groups over 4 buckets, and the index unreadable for the first bucket
    # (every retry of it fails)
    clock = ManualClock(1_700_000_000_000)
    ledger = InMemoryLedger(inflight_buckets=BUCKETS)
    stale_groups(ledger, clock, 12)
    for _ in range(3):
        ledger.inject("stale_groups", LedgerFault.UNAVAILABLE)
    # WHEN the reconciler runs
    report = reconciler(ledger, clock).run_once()
    # THEN bucket 0 is reported failed; every group of the other buckets is settled (released:
    # nothing was put); the run is recorded; the report says it is not complete
    assert list(report.failed_buckets) == ["0"], report
    left = set(ledger.stale_groups(STREAM, now_ms=clock.now_ms()))
    assert report.groups == 12 - len(left)
    assert report.released == report.groups
    assert report.run_recorded
    assert not report.complete
    assert ledger.last_run(STREAM) is not None
    # AND the next run, the index readable again, settles what was left
    again = reconciler(ledger, clock).run_once()
    assert again.complete
    assert again.groups == len(left)
    assert list(ledger.stale_groups(STREAM, now_ms=clock.now_ms())) == []


def test_a_read_that_fails_once_is_tried_again() -> None:
    # GIVEN stale groups, and one failed read of their claims
    clock = ManualClock(1_700_000_000_000)
    ledger = InMemoryLedger(inflight_buckets=1)
    stale_groups(ledger, clock, 3)
    ledger.inject("batch_get_claims", LedgerFault.UNAVAILABLE)
    # WHEN the reconciler runs
    report = reconciler(ledger, clock).run_once()
    # THEN the read is tried again and every group is settled
    assert (report.groups, report.released, report.errors) == (3, 3, 0), report
    assert report.complete


def test_a_run_that_cannot_be_recorded_keeps_what_it_settled_and_says_so() -> None:
    # GIVEN stale groups, and the ledger refusing the run's record (every retry)
    clock = ManualClock(1_700_000_000_000)
    ledger = InMemoryLedger(inflight_buckets=1)
    stale_groups(ledger, clock, 3)
    for _ in range(3):
        ledger.inject("record_run", LedgerFault.UNAVAILABLE)
    # WHEN the reconciler runs
    report = reconciler(ledger, clock).run_once()
    # THEN its settlements stand, and the report says the run was not recorded
    assert (report.groups, report.released) == (3, 3)
    assert not report.run_recorded
    assert ledger.last_run(STREAM) is None
    assert list(ledger.stale_groups(STREAM, now_ms=clock.now_ms())) == []


# --- replay-mode runs left open -------------------------------------------------------------------


def register(ledger: InMemoryLedger, run: str, attempt_id: str, *, started_at_ms: int) -> None:
    """An attempt of a replay-mode run (a Spark task), with a lease from ``started_at_ms``."""
    ledger.register_attempt(
        STREAM,
        run,
        RunAttempt(
            attempt_id=attempt_id,
            execution_id="exec-1",
            task="0",
            task_attempt=0,
            started_at_ms=started_at_ms,
            lease_expires_at_ms=started_at_ms + LEASE.lease_ms,
        ),
    )


def test_a_replay_run_left_open_past_its_leases_is_reported_and_left_as_it_is(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # GIVEN a run whose driver died before its commit (its attempt's lease long over), a run
    # whose attempt still puts, a committed run, and a stale claim group
    clock = ManualClock(1_700_000_000_000)
    ledger = InMemoryLedger(inflight_buckets=BUCKETS)
    register(ledger, "query-a/7", "crashed", started_at_ms=clock.now_ms())
    register(ledger, "query-a/6", "committed", started_at_ms=clock.now_ms())
    ledger.complete_run(STREAM, "query-a/6", counts={"sent": 4}, now_ms=clock.now_ms())
    stale_groups(ledger, clock, 1)
    register(ledger, "query-a/8", "running", started_at_ms=clock.now_ms())
    # WHEN the reconciler runs
    with caplog.at_level(logging.WARNING, logger="producer.reconcile.reconciler"):
        report = reconciler(ledger, clock).run_once()
    # THEN the run left open is reported by name, with a warning, in the run's record and the
    # gauge; the group is settled as ever; nothing is unresolved (the reconciler cannot act)
    assert report.open_runs == ["query-a/7"]
    assert (report.groups, report.released, report.unresolved) == (1, 1, 0)
    assert report.complete
    (warning,) = [r for r in caplog.records if r.getMessage().startswith("replay run left open")]
    assert warning.levelno == logging.WARNING
    assert warning.getMessage() == (
        f"replay run left open stream={STREAM} run=query-a/7 attempts=1 "
        f"last_lease_expires_at_ms={1_700_000_000_000 + LEASE.lease_ms}"
    )
    recorded = ledger.last_run(STREAM)
    assert recorded is not None
    assert recorded.outcomes["open_runs"] == 1
    assert REGISTRY.get_sample_value("keo_replay_runs_open", {"stream": STREAM}) == 1
    # AND the run is as its attempts left it: OPEN, for a replay to recover and commit
    left = ledger.get_run(STREAM, "query-a/7")
    assert left is not None
    assert left.state is RunState.OPEN
    assert report.as_json()["open_runs"] == ["query-a/7"]


def test_a_bucket_whose_runs_cannot_be_read_is_reported_and_its_groups_are_settled() -> None:
    # GIVEN a stale group and a run left open, and the runs of the index unreadable (every
    # retry of every bucket fails)
    clock = ManualClock(1_700_000_000_000)
    ledger = InMemoryLedger(inflight_buckets=1)
    register(ledger, "query-a/7", "crashed", started_at_ms=clock.now_ms())
    stale_groups(ledger, clock, 1)
    for _ in range(3):
        ledger.inject("open_runs", LedgerFault.UNAVAILABLE)
    # WHEN the reconciler runs
    report = reconciler(ledger, clock).run_once()
    # THEN the group is settled, the bucket is reported failed, and no run is named
    assert (report.groups, report.released) == (1, 1)
    assert list(report.failed_buckets) == ["0"]
    assert report.open_runs == []
    # AND the next pass, the index readable again, reports the run
    assert reconciler(ledger, clock).run_once().open_runs == ["query-a/7"]
