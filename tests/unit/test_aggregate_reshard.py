"""An aggregate built on a stale shard map (a split between the producer's ListShards and its
PutRecords) that lands on a shard not covering all its members: the KCL drops the whole
aggregate, so none of it is written. Every member is sent again, re-aggregated on a fresh
shard map, in key mode and in replay mode; a consumer applying the KCL's rule
(``tests/kcl_rule.py``) sees each key once.

Fake Kinesis and ledger; the split happens at the ``before_put`` step, after the put's
aggregates were packed on the map the producer held.
"""

from __future__ import annotations

import random
from collections import Counter

import kcl_rule
import pytest
from fakes.kinesis import MAX_HASH_KEY, FakeKinesisClient
from fakes.ledger import InMemoryLedger
from fakes.replay import replay_producer_over

from dedupe_store.clock import ManualClock
from dedupe_store.records import Position
from kinesis_store.entries import DEFAULT_MAX_RECORD_BYTES, hash_key_of
from kinesis_store.kpl import Aggregate, deaggregate
from kinesis_store.reader import KinesisReader
from kinesis_store.shards import Shard, kcl_delivers_whole
from kinesis_store.writer import KinesisWriter
from producer.hooks import Step
from producer.key.producer import ExactlyOnceProducer, ProducerPolicy
from producer.outcomes import Outcome, OutcomeStatus
from producer.protocol import LeasePolicy, Message

STREAM = "orders"
LEASE = LeasePolicy(lease_ms=60_000, put_timeout_ms=7_000, skew_ms=5_000)
MESSAGES = [Message(f"order-{i:03d}", f"payload {i}".encode()) for i in range(60)]
SPLIT_AT = (MAX_HASH_KEY + 1) // 2


class SplitBeforeFirstPut:
    """Hooks that split the stream's one shard in two right before the first PutRecords
    leaves: that put's aggregates were packed on the one-shard map."""

    def __init__(self, kinesis: FakeKinesisClient) -> None:
        self._kinesis = kinesis
        self.split = False

    def at(self, step: Step, *, batch_id: int | None = None) -> None:  # noqa: ARG002
        if step is Step.BEFORE_PUT and not self.split:
            self.split = True
            (shard,) = self._kinesis.list_shards(StreamName=STREAM)["Shards"]
            self._kinesis.split_shard(shard["ShardId"], SPLIT_AT)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def kinesis(clock: ManualClock) -> FakeKinesisClient:
    return FakeKinesisClient(stream=STREAM, clock=clock, shard_count=1)


def assert_members_straddle_the_split() -> None:
    """The 60 keys hash on both sides of the split: the first aggregate cannot fit one child."""
    sides = Counter(hash_key_of(m.key) >= SPLIT_AT for m in MESSAGES)
    assert sides[True] > 0
    assert sides[False] > 0


def stray_aggregates(seen: kcl_rule.StreamAsSeen) -> set[tuple[str, str]]:
    """(shard, sequence number) of the aggregates the KCL drops whole."""
    kept = {(r.shard_id, r.sequence_number) for r in seen.kcl}
    return {
        (r.shard_id, r.sequence_number)
        for r in seen.unfiltered
        if r.sub_sequence_number is not None and (r.shard_id, r.sequence_number) not in kept
    }


def assert_no_position_in(outcomes: list[Outcome], strays: set[tuple[str, str]]) -> None:
    positions = [o.position for o in outcomes if o.position is not None]
    assert len(positions) == len(outcomes)
    assert not [p for p in positions if (p.shard_id, p.sequence_number) in strays]


def kcl_positions(seen: kcl_rule.StreamAsSeen) -> set[Position]:
    return {Position(r.shard_id, r.sequence_number, r.sub_sequence_number) for r in seen.kcl}


def test_key_mode_resends_every_member_of_an_aggregate_that_landed_across_a_split(
    kinesis: FakeKinesisClient, clock: ManualClock
) -> None:
    # GIVEN an aggregating producer whose shard map (one shard) goes stale as its first put
    # leaves: the shard is split in two
    assert_members_straddle_the_split()
    hooks = SplitBeforeFirstPut(kinesis)
    ledger = InMemoryLedger(inflight_buckets=4)
    producer = ExactlyOnceProducer(
        stream=STREAM,
        ledger=ledger,
        writer=KinesisWriter(kinesis, STREAM),
        clock=clock,
        policy=ProducerPolicy(lease=LEASE, put_max_attempts=3),
        sleep=kinesis.sleep,
        rng=random.Random(0),
        shard_map=KinesisReader(kinesis, STREAM).shards,
        hooks=hooks,
    )
    # WHEN 60 keys are sent
    with producer:
        outcomes = producer.send(MESSAGES)
    # THEN each is SENT, at a position a KCL consumer reads, none inside the stray aggregate
    assert hooks.split
    assert Counter(o.status for o in outcomes) == {OutcomeStatus.SENT: len(MESSAGES)}
    seen = kcl_rule.read_stream(kinesis, STREAM)
    strays = stray_aggregates(seen)
    assert strays, "the first put's aggregate landed on one child of the split"
    assert_no_position_in(outcomes, strays)
    assert {o.position for o in outcomes} <= kcl_positions(seen)
    # AND the KCL's rule sees every key exactly once
    assert seen.kcl_keys == Counter(m.key for m in MESSAGES)
    # AND a consumer without the KCL's filter also sees the stray aggregate's members again
    unfiltered = Counter(r.partition_key for r in seen.unfiltered)
    assert sum(unfiltered.values()) == len(MESSAGES) * 2  # one stray aggregate held them all
    assert set(unfiltered.values()) == {2}


def test_replay_mode_resends_every_member_of_an_aggregate_that_landed_across_a_split(
    kinesis: FakeKinesisClient, clock: ManualClock
) -> None:
    # GIVEN an aggregating replay producer whose shard map goes stale as its first put leaves
    assert_members_straddle_the_split()
    hooks = SplitBeforeFirstPut(kinesis)
    producer = replay_producer_over(
        InMemoryLedger(inflight_buckets=4),
        kinesis,
        clock,
        LEASE,
        hooks=hooks,
        shard_map=KinesisReader(kinesis, STREAM).shards,
        put_max_attempts=3,
    )
    rows = [*MESSAGES, *MESSAGES[:5]]  # a row twice is two records
    # WHEN the run's rows are sent
    outcomes = producer.send_run("nightly", rows)
    # THEN each row is SENT, at a position a KCL consumer reads, none inside the stray aggregate
    assert hooks.split
    assert Counter(o.status for o in outcomes) == {OutcomeStatus.SENT: len(rows)}
    seen = kcl_rule.read_stream(kinesis, STREAM)
    strays = stray_aggregates(seen)
    assert strays
    assert_no_position_in(outcomes, strays)
    assert {o.position for o in outcomes} <= kcl_positions(seen)
    # AND the KCL's rule sees every row once, as a multiset
    assert seen.kcl_rows == Counter((m.key, m.data) for m in rows)
    assert producer.run_of("nightly") is not None


# --- the rule, and the oracle that audits it ------------------------------------------------------


def _shard(start: int, end: int) -> Shard:
    return Shard("shardId-000000000001", start, end, None, None, "0", None)


@pytest.mark.parametrize(
    ("hash_keys", "delivered"),
    [([10, 20, 30], True), ([10, 20, 31], False), ([9, 20], False), ([], True)],
)
def test_an_aggregate_is_delivered_whole_or_not_at_all(
    hash_keys: list[int], delivered: bool
) -> None:
    # GIVEN an aggregate that landed on a shard covering hash keys 10 to 30
    # WHEN asked whether a KCL consumer gets it
    # THEN only when every member is inside: one member outside and none of it is delivered
    assert kcl_delivers_whole(_shard(10, 30), hash_keys) is delivered
    assert kcl_delivers_whole(None, hash_keys) is False


def test_the_kcl_oracle_drops_an_aggregate_with_one_member_off_its_shard_whole() -> None:
    # GIVEN one aggregate of 20 keys on both sides of the middle of the hash range, and a
    # plain record
    aggregate = Aggregate(DEFAULT_MAX_RECORD_BYTES)
    for message in MESSAGES[:20]:
        assert aggregate.add(message.key, message.data, str(hash_key_of(message.key)))
    entry = aggregate.entry()
    record = {**entry, "SequenceNumber": "7"}
    plain = {"Data": b"x", "PartitionKey": "plain", "SequenceNumber": "8"}
    whole = kcl_rule.KclShard("s", 0, MAX_HASH_KEY)
    half = kcl_rule.KclShard("s", 0, SPLIT_AT - 1)
    # WHEN a KCL consumer of the whole range, and one of half of it, deaggregate them
    # THEN the first sees the 20 members as the product's deaggregation does; the second none
    # of them, though an unfiltered deaggregation still finds all 20; plain records pass
    assert [
        (r.partition_key, r.data, r.sub_sequence_number)
        for r in kcl_rule.kcl_deaggregate(whole, record)
    ] == [
        (u.partition_key, u.data, u.sub_sequence_number) for u in deaggregate("s", record).records
    ]
    assert kcl_rule.kcl_deaggregate(half, record) == []
    assert len(kcl_rule.deaggregate_unfiltered(half, record)) == 20
    assert [r.partition_key for r in kcl_rule.kcl_deaggregate(half, plain)] == ["plain"]
