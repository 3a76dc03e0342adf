"""The two guarantees as objects (producer.guarantees): chosen once from the settings, each
gives a party its sender, says whether a batch is done before, records it complete, and names
the audit that proves its stream. Over the fakes: InMemoryLedger, FakeKinesisClient and a manual clock."""

from __future__ import annotations

from collections import Counter
from typing import Any, cast

import pytest
from fakes.kinesis import FakeKinesisClient
from fakes.ledger import InMemoryLedger

from dedupe_store.clock import ManualClock
from kinesis_store.reader import KinesisReader
from kinesis_store.shards import ListedShards, Shard, StreamInfo
from kinesis_store.writer import KinesisWriter
from producer.audit.auditors import AuditLimits
from producer.audit.rows import ExpectedRow
from producer.guarantees import (
    KEY,
    LISTING_ROUTES_S,
    REPLAY,
    DriverReads,
    Party,
    guarantee_of,
)
from producer.protocol import Message
from producer.settings import Dedupe, ProducerSettings
from producer.wiring import Stack

STREAM = "orders"


def stack_over(dedupe: Dedupe) -> tuple[Stack, FakeKinesisClient]:
    clock = ManualClock(1_700_000_000_000)
    kinesis = FakeKinesisClient(stream=STREAM, clock=clock, fault_weights={})
    settings = ProducerSettings(stream=STREAM, table="orders-ledger", dedupe=dedupe)
    stack = Stack(
        settings=settings,
        ledger=cast(Any, InMemoryLedger(inflight_buckets=4)),
        writer=KinesisWriter(kinesis, STREAM),
        reader=KinesisReader(kinesis, STREAM, sleep=kinesis.sleep),
        info=StreamInfo(STREAM, 24, 1024 * 1024, 2),
        clock=clock,
    )
    return stack, kinesis


def rows(count: int) -> list[Message]:
    return [Message(f"k{i}", f"data-{i}".encode()) for i in range(count)]


def statuses(outcomes: list[Any]) -> Counter[str]:
    return Counter(o.status.value for o in outcomes)


@pytest.mark.parametrize(("dedupe", "guarantee"), [(Dedupe.KEY, KEY), (Dedupe.REPLAY, REPLAY)])
def test_the_settings_choose_the_guarantee(dedupe: Dedupe, guarantee: object) -> None:
    settings = ProducerSettings(stream=STREAM, table="orders-ledger", dedupe=dedupe)
    assert guarantee_of(settings) is guarantee


def test_a_replay_party_that_sends_its_whole_run_completes_it_and_a_re_run_sends_nothing() -> None:
    # GIVEN the replay guarantee and a party that is a whole run (keo send --run-id)
    stack, kinesis = stack_over(Dedupe.REPLAY)
    guarantee = guarantee_of(stack.settings)
    # WHEN it sends its rows and settles its run, and the run is sent again
    with guarantee.sender(stack, Party("nightly", task="cli")) as sender:
        first = sender.send(rows(5))
        settled = sender.settle_run(statuses(first), delivered=True)
    with guarantee.sender(stack, Party("nightly", task="cli")) as again:
        second = again.send(rows(5))
        end = again.finish()
    # THEN the first sends every row and leaves the run COMPLETE; the second sends nothing,
    # says it skipped, and the stream holds each row once
    assert statuses(first) == {"SENT": 5}
    assert settled is not None
    assert settled.complete
    assert statuses(second) == {"DUPLICATE": 5}
    assert end.skipped
    assert len(kinesis.visible()) == 5
    # and a batch is never done before its tasks ask their run
    assert not guarantee.done_before(stack, "query", 0)


def test_a_key_party_sends_through_the_claims_and_a_completed_batch_is_done_before() -> None:
    # GIVEN the key guarantee, a party of a query's batch, and that batch's completer
    stack, kinesis = stack_over(Dedupe.KEY)
    guarantee = guarantee_of(stack.settings)
    complete = guarantee.completer(stack, query="query", run="query/3")
    assert complete is not None
    # WHEN the party sends rows, twice, and the batch is recorded complete
    with guarantee.sender(stack, Party("query/3", owner="task-0")) as sender:
        first = sender.send(rows(4))
        second = sender.send(rows(4))
        end = sender.finish()
        settled = sender.settle_run(statuses(first), delivered=True)
    before = guarantee.done_before(stack, "query", 3)
    complete(statuses(first), 3)
    # THEN each key is sent once (the repeat is DUPLICATE), key mode has no run to settle, and
    # the batch is done before once it is recorded (not for a write no query names)
    assert statuses(first) == {"SENT": 4}
    assert statuses(second) == {"DUPLICATE": 4}
    assert not end.skipped
    assert settled is None
    assert not before
    assert guarantee.done_before(stack, "query", 3)
    assert not guarantee.done_before(stack, None, 3)
    assert guarantee.completer(stack, query=None, run="write/x") is None
    assert len(kinesis.visible()) == 4


def test_a_recovery_the_driver_cannot_plan_is_left_to_the_tasks_not_a_failed_batch(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # GIVEN the replay guarantee and a ledger that cannot answer the driver's read of a run
    stack, _ = stack_over(Dedupe.REPLAY)
    cast(Any, stack.ledger).inject("get_run", "unavailable")
    # WHEN the driver plans the recovery of a batch it may replay
    with caplog.at_level("WARNING", logger="producer.guarantees"):
        planned = guarantee_of(stack.settings).plan_recovery(stack, ["query/4"])
    # THEN nothing is planned (the tasks read for themselves), and the log says why
    assert planned == ()
    assert "replay recovery not planned on the driver" in caplog.text
    # and key mode plans nothing, asking nothing
    assert KEY.plan_recovery(stack, ["query/4"]) == ()


class _Sources:
    """An audit's sources over the fakes, noting what the auditor asked for."""

    def __init__(self, stack: Stack, kinesis: FakeKinesisClient, sent: list[Message]) -> None:
        self._stack = stack
        self._kinesis = kinesis
        self._sent = sent
        self.asked: list[str] = []

    def expected_keys(self) -> list[str] | None:
        self.asked.append("expected_keys")
        return [m.key for m in self._sent]

    def expected_rows(self) -> list[ExpectedRow]:
        self.asked.append("expected_rows")
        return [ExpectedRow(m.key, m.data, line) for line, m in enumerate(self._sent, 1)]

    def reader(self, *, then: str) -> KinesisReader:  # noqa: ARG002 - no progress shown here
        self.asked.append("reader")
        return KinesisReader(self._kinesis, STREAM, sleep=self._kinesis.sleep)

    def ledger(self) -> Any:
        self.asked.append("ledger")
        return self._stack.ledger


@pytest.mark.parametrize(
    ("dedupe", "asked"),
    [
        (Dedupe.KEY, ["expected_keys", "reader", "ledger"]),
        (Dedupe.REPLAY, ["reader", "expected_rows"]),
    ],
)
def test_the_guarantee_chooses_the_audit_and_it_reads_only_what_it_needs(
    dedupe: Dedupe, asked: list[str]
) -> None:
    # GIVEN a stream written in one mode, each row once
    stack, kinesis = stack_over(dedupe)
    guarantee = guarantee_of(stack.settings)
    sent = rows(6)
    with guarantee.sender(stack, Party("nightly", task="cli")) as sender:
        sender.send(sent)
    # WHEN keo audit asks the guarantee's auditor
    sources = _Sources(stack, kinesis, sent)
    report = guarantee.auditor.audit(sources, AuditLimits(listed=10))
    # THEN the stream is clean, by the audit of its mode: keys against the ledger in key mode,
    # rows counted in replay mode (no ledger opened, no keys read)
    assert report.clean, report.summary(10)
    assert report.as_json()["clean"] is True
    assert guarantee.auditor.compares_rows is (dedupe is Dedupe.REPLAY)
    assert sources.asked == asked


def test_only_replay_mode_names_its_runs() -> None:
    # keo send's --run-id, format("keo")'s query_name (streaming) and run_id (a batch write)
    assert REPLAY.named_runs
    assert not KEY.named_runs


def test_a_drivers_listing_routes_read_backs_for_an_hour_then_the_stream_is_listed() -> None:
    # GIVEN what a driver read for its tasks, the stream's open shards listed at some second
    shards = (Shard("shardId-000000000000", 0, 2**128 - 1, None, None, "0", None),)
    listed_at_s = 1_700_000_000.0
    driver = DriverReads(shard_map=ListedShards(shards, listed_at_s))
    # THEN a read-back is routed by it within the hour (a streaming query ships the listing it
    # started with to every batch: a shard it holds that closed since is deleted once the
    # stream's retention is over)
    assert driver.listed_before(listed_at_s + LISTING_ROUTES_S) == shards
    # AND after it by the stream's listing, as where nothing was listed
    assert driver.listed_before(listed_at_s + LISTING_ROUTES_S + 1) is None
    assert DriverReads().listed_before(listed_at_s) is None
