"""Read-back across a reshard, against kinesis-local (kinesis-mock) and dynalite.

A stale claim's record may sit in a shard that was closed by a split or a merge (its parent)
or in the shard that replaced it (a child). The resolver follows the lineage (every shard,
open or closed, whose hash range covers the claim's hash key), so the reconciler finds each
record where it is, records that position in the claim's group, and the audit stays clean.

Stale claims are planted as a crashed producer leaves them (a claim group opened, its keys
claimed, their records put, the group never settled); the reconciler's injected clock stands
30 s later, so the groups' leases have expired for everyone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import planting
import pytest
import stacks
import streamcheck

from dedupe_store.clock import SkewedClock, SystemClock
from dedupe_store.states import LedgerState
from devstack import emulators as local_stack
from kinesis_store import provisioning as kinesis_admin
from kinesis_store.entries import DEFAULT_MAX_RECORD_BYTES
from kinesis_store.results import PutResultKind
from kinesis_store.shards import Shard, open_shards
from producer.audit.stream import audit_stream
from producer.errors import StreamUnavailableError
from producer.outcomes import OutcomeStatus
from producer.protocol import Message, prepare
from producer.reconcile.reconciler import Reconciler
from producer.replay.context import ReplayTask
from producer.settings import Dedupe, ProducerSettings
from producer.wiring import Stack, build_stack

if TYPE_CHECKING:
    from conftest import Names

LATER_MS = 30_000
# the planted groups' lease: their puts land inside it however slow the machine is, and it has
# expired for everyone by the reconciler's clock, LATER_MS ahead
PLANTED_LEASE_MS = 15_000
HALF = 2**127  # the middle of the 128-bit hash key space


@pytest.fixture
def kinesis_local(request: pytest.FixtureRequest) -> str:
    try:
        endpoint: str = request.getfixturevalue("kinesis_local_endpoint")
    except local_stack.EmulatorError as exc:
        pytest.skip(f"kinesis-local (kinesis-mock) is not available: {exc}")
    return endpoint


@pytest.fixture
def kinesis(kinesis_local: str) -> Any:
    return streamcheck.kinesis_client(kinesis_local)


def settings_for(emulators: local_stack.Endpoints, names: Names, endpoint: str) -> ProducerSettings:
    return ProducerSettings(
        stream=names.stream,
        table=names.table,
        kinesis_endpoint_url=endpoint,
        dynamodb_endpoint_url=emulators.dynamodb,
        region=local_stack.REGION,
        put_connect_timeout_s=1.0,
        put_read_timeout_s=1.0,
        clock_skew_s=0.5,
        lease_s=3.0,
        # the fence off: these tests plant puts with the writer, outside any group's lease,
        # and reconcile on a clock LATER_MS ahead of the one that signs requests
        put_fence="off",
    )


def wait_active(kinesis: Any, stream: str, timeout_s: float = 60) -> None:
    try:
        kinesis_admin.wait_active(kinesis, stream, timeout_s=timeout_s)
    except StreamUnavailableError as exc:
        pytest.skip(f"kinesis-local: {exc}")


@pytest.fixture
def settings(
    emulators: local_stack.Endpoints, names: Names, kinesis_local: str
) -> ProducerSettings:
    settings = settings_for(emulators, names, kinesis_local)
    stacks.create_table(settings)
    return settings


def create_stream(kinesis: Any, stream: str, shards: int) -> None:
    kinesis.create_stream(StreamName=stream, ShardCount=shards)
    wait_active(kinesis, stream)


def messages(prefix: str, count: int) -> list[Message]:
    return [Message(f"{prefix}-{i:03d}", f'{{"{prefix}": {i}}}'.encode()) for i in range(count)]


def deliver(stack: Stack, batch: Sequence[Message]) -> None:
    with stack.producer() as producer:
        outcomes = producer.send(batch)
    assert {o.status for o in outcomes} == {OutcomeStatus.SENT}, outcomes


def plant_stale_claims(stack: Stack, batch: Sequence[Message]) -> None:
    """What a producer that crashed after its put leaves: its claim group OPEN (never settled),
    the claims IN_FLIGHT, the records written."""
    prepared, rejected = prepare(batch, DEFAULT_MAX_RECORD_BYTES)
    assert not rejected
    planting.plant_claims(
        stack.ledger,
        stack.settings.stream,
        batch,
        owner="crashed-producer",
        now_ms=SystemClock().now_ms(),
        lease_ms=PLANTED_LEASE_MS,
    )
    # the crashed producer's put, sent while its lease allowed it
    results = stack.writer.put_entries(
        [item.entry() for item in prepared], lease_expires_at_ms=SystemClock().now_ms() + 60_000
    )
    assert all(r.kind is PutResultKind.WRITTEN for r in results), results
    assert set(states(stack, [m.key for m in batch]).values()) == {LedgerState.IN_FLIGHT}


def states(stack: Stack, keys: Sequence[str]) -> dict[str, LedgerState]:
    found = stack.ledger.batch_get(stack.settings.stream, keys)
    return {key: record.state for key, record in found.items()}


def reconcile(stack: Stack) -> Reconciler:
    later = build_stack(stack.settings, clock=SkewedClock(SystemClock(), LATER_MS))
    return Reconciler(
        stream=later.settings.stream,
        ledger=later.ledger,
        resolver=later.resolver(),
        writer=later.writer,
        clock=later.clock,
        lease=later.settings.lease_policy(),
        owner="reconciler-test",
    )


def covering(shards: Sequence[Shard], key: str, *, closed: bool) -> str:
    hash_key = int(prepare([Message(key, b"")], DEFAULT_MAX_RECORD_BYTES)[0][0].explicit_hash_key)
    (shard,) = [s for s in shards if s.covers(hash_key) and s.closed is closed]
    return shard.shard_id


def assert_found_where_they_are(
    stack: Stack, batch: Sequence[Message], shards: Sequence[Shard], *, closed: bool
) -> None:
    """Each key DELIVERED at a position in the parent (closed) or child (open) covering it."""
    records = stack.ledger.batch_get(stack.settings.stream, [m.key for m in batch])
    for message in batch:
        record = records[message.key]
        assert record.state is LedgerState.DELIVERED, record
        assert record.position is not None
        assert record.position.shard_id == covering(shards, message.key, closed=closed), record


def assert_clean(stack: Stack, kinesis: Any, keys: Sequence[str]) -> None:
    report = audit_stream(stack.reader, stack.ledger, expected=keys)
    assert report.clean, report.as_json()
    contents = streamcheck.read_stream(kinesis, stack.settings.stream)
    streamcheck.assert_exactly_once(contents, keys, stack.ledger)
    streamcheck.assert_only(contents, keys)


def test_stale_claims_are_found_in_the_parent_and_the_children_of_a_split(
    settings: ProducerSettings, kinesis: Any
) -> None:
    # GIVEN a 1-shard stream with delivered messages and stale claims whose records are in it
    create_stream(kinesis, settings.stream, 1)
    stack = build_stack(settings)
    (parent,) = stack.reader.shards()
    deliver(stack, messages("before", 10))
    in_parent = messages("parent", 12)
    plant_stale_claims(stack, in_parent)
    # and the shard is then split in two
    kinesis.split_shard(
        StreamName=settings.stream, ShardToSplit=parent.shard_id, NewStartingHashKey=str(HALF)
    )
    wait_active(kinesis, settings.stream)
    stack = build_stack(settings)
    shards = stack.reader.shards()
    children = [s for s in shards if s.parent_shard_id == parent.shard_id]
    assert len(children) == 2, shards
    # and more delivered messages and stale claims land in the children
    deliver(stack, messages("after", 10))
    in_children = messages("child", 12)
    plant_stale_claims(stack, in_children)

    # WHEN the reconciler runs
    report = reconcile(stack).run_once()

    # THEN every stale claim is found, its position recorded in its group: parent or child
    assert report.delivered == len(in_parent) + len(in_children), report
    assert report.unresolved == 0, report
    # one group taken over per crashed send, each of its claims resolved once
    assert (report.groups, report.scanned) == (2, len(in_parent) + len(in_children)), report
    assert report.lost_races == 0, report
    assert_found_where_they_are(stack, in_parent, shards, closed=True)
    assert_found_where_they_are(stack, in_children, shards, closed=False)
    assert {covering(shards, m.key, closed=False) for m in in_children} == {
        c.shard_id for c in children
    }
    # and the audit, over parent and children, finds each key exactly once
    everything = messages("before", 10) + in_parent + messages("after", 10) + in_children
    assert_clean(stack, kinesis, [m.key for m in everything])


def test_stale_claims_are_found_in_the_parents_and_the_child_of_a_merge(
    settings: ProducerSettings, kinesis: Any
) -> None:
    # GIVEN a 2-shard stream with delivered messages and stale claims in both shards
    create_stream(kinesis, settings.stream, 2)
    stack = build_stack(settings)
    parents = sorted(stack.reader.shards(), key=lambda s: s.starting_hash_key)
    deliver(stack, messages("before", 10))
    in_parents = messages("parent", 16)
    plant_stale_claims(stack, in_parents)
    # and the two shards are then merged into one
    kinesis.merge_shards(
        StreamName=settings.stream,
        ShardToMerge=parents[0].shard_id,
        AdjacentShardToMerge=parents[1].shard_id,
    )
    wait_active(kinesis, settings.stream)
    stack = build_stack(settings)
    shards = stack.reader.shards()
    (child,) = [s for s in shards if not s.closed]
    assert {child.parent_shard_id, child.adjacent_parent_shard_id} == {
        p.shard_id for p in parents
    }, shards
    # and more delivered messages and stale claims land in the merged shard
    deliver(stack, messages("after", 10))
    in_child = messages("child", 12)
    plant_stale_claims(stack, in_child)

    # WHEN the reconciler runs
    report = reconcile(stack).run_once()

    # THEN every stale claim is found, its position recorded in its group: a parent or the child
    assert report.delivered == len(in_parents) + len(in_child), report
    assert report.unresolved == 0, report
    # one group taken over per crashed send, each of its claims resolved once
    assert (report.groups, report.scanned) == (2, len(in_parents) + len(in_child)), report
    assert report.lost_races == 0, report
    assert_found_where_they_are(stack, in_parents, shards, closed=True)
    assert {covering(shards, m.key, closed=True) for m in in_parents} == {
        p.shard_id for p in parents
    }
    assert_found_where_they_are(stack, in_child, shards, closed=False)
    # and the audit, over parents and child, finds each key exactly once
    everything = messages("before", 10) + in_parents + messages("after", 10) + in_child
    assert_clean(stack, kinesis, [m.key for m in everything])


def test_a_task_retry_routed_by_a_listing_older_than_a_merge_finds_every_row_once(
    settings: ProducerSettings, kinesis: Any
) -> None:
    # GIVEN a 2-shard stream, its open shards listed as a Spark write's driver lists them
    # before its tasks start, and a replay-mode task whose first attempt put half its rows
    create_stream(kinesis, settings.stream, 2)
    stack = build_stack(settings.model_copy(update={"dedupe": Dedupe.REPLAY}))
    listed = open_shards(stack.reader.shards())
    rows = messages("row", 30)
    task = ReplayTask("query-a/3", "exec-1", task="0")
    producer = stack.replay_producer()
    with producer.attempt(task, listed_before=listed) as first:
        assert {o.status for o in first.send(rows[:15])} == {OutcomeStatus.SENT}
        # and the two listed shards then merged, the other half put on the child
        kinesis.merge_shards(
            StreamName=settings.stream,
            ShardToMerge=listed[0].shard_id,
            AdjacentShardToMerge=listed[1].shard_id,
        )
        wait_active(kinesis, settings.stream)
        assert {o.status for o in first.send(rows[15:])} == {OutcomeStatus.SENT}

    # WHEN the task is retried with the driver's listing, which holds neither the child
    retry = replace(task, task_attempt=1)
    with stack.replay_producer().attempt(retry, listed_before=listed) as second:
        outcomes = second.send(rows)

    # THEN its reads of the listed shards met their ends, it read the child, and found every
    # row: nothing sent again; a KCL consumer reads each row once
    assert {o.status for o in outcomes} == {OutcomeStatus.DUPLICATE}
    contents = streamcheck.read_stream(kinesis, settings.stream)
    assert all(contents.counts[m.key] == 1 for m in rows), contents.counts
    streamcheck.assert_only(contents, [m.key for m in rows])
