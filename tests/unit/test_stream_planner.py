"""The driver's side of a streaming read and the executors' range reads, on the in-memory
Kinesis (``FakeKinesisClient``): batches are run as Spark runs them (end offset, ranges, each
range read), with no Spark. Time is the fake's manual clock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import botocore.exceptions
import pytest
from fakes.kinesis import FakeKinesisClient

from dedupe_store.clock import ManualClock
from kinesis_store.entries import DEFAULT_MAX_RECORD_BYTES, put_entry
from kinesis_store.errors import ShardPositionLostError, StreamNotFoundError
from kinesis_store.kpl import Aggregate, UserRecord
from kinesis_store.reader import KinesisReader
from spark_jobs.stream_offsets import (
    ShardProgress,
    StartingPosition,
    StartingPositionKind,
    StreamOffset,
)
from spark_jobs.stream_planner import Budget, StreamPlanner, lost_records_policy

STREAM = "orders"
TRIM_HORIZON = StartingPosition(StartingPositionKind.TRIM_HORIZON)
HALF = 2**127
Batch = list[UserRecord]


class World:
    """One stream, a planner on the driver and a reader per executor task."""

    def __init__(
        self,
        *,
        starting: StartingPosition = TRIM_HORIZON,
        fail_on_data_loss: bool = True,
        client: Callable[[FakeKinesisClient], Any] = lambda fake: fake,
        shard_count: int = 2,
    ) -> None:
        self.clock = ManualClock()
        self.kinesis = FakeKinesisClient(stream=STREAM, clock=self.clock, shard_count=shard_count)
        self.client = client(self.kinesis)
        self.fail_on_data_loss = fail_on_data_loss
        self.starting = starting
        self.planner = self.new_planner()

    def new_planner(self) -> StreamPlanner:
        """A driver's planner, as a query (re)started makes one."""
        return StreamPlanner(
            KinesisReader(self.client, STREAM, sleep=self.kinesis.sleep),
            self.clock,
            starting_position=self.starting,
            fail_on_data_loss=self.fail_on_data_loss,
            margin_ms=500,
            idle_poll_ms=0,  # the tests move the clock themselves
        )

    def put(self, *keys: str, hash_key: int | None = None) -> None:
        entries = [
            put_entry(key, f"data of {key}".encode(), None if hash_key is None else str(hash_key))
            for key in keys
        ]
        self.kinesis.put_records(StreamName=STREAM, Records=entries)
        self.kinesis.advance(10)

    def put_aggregate(self, *keys: str, hash_key: int) -> None:
        aggregate = Aggregate(DEFAULT_MAX_RECORD_BYTES)
        for key in keys:
            assert aggregate.add(key, f"data of {key}".encode(), str(hash_key))
        self.kinesis.put_records(StreamName=STREAM, Records=[aggregate.entry()])
        self.kinesis.advance(10)

    def read(self, start: StreamOffset, end: StreamOffset) -> Batch:
        """What the batch's tasks read: every planned range, on a reader of its own."""
        records: Batch = []
        for shard_range in self.planner.ranges(start, end):
            executor = KinesisReader(self.client, STREAM, sleep=self.kinesis.sleep)
            records += executor.read_range(
                shard_range.shard.shard_id,
                shard_range.start,
                shard_range.through,
                on_lost=lost_records_policy(self.fail_on_data_loss),
            )
        return records

    def run(
        self,
        start: StreamOffset | None = None,
        budget: Budget | None = None,
        *,
        restarting: bool = False,
    ) -> tuple[list[Batch], StreamOffset]:
        """Batches until the end offset is the start (Spark then runs no batch); with
        ``restarting``, each batch by a new planner from the checkpoint's form of its start."""
        offset = start if start is not None else self.planner.initial()
        batches: list[Batch] = []
        for _ in range(100):
            if restarting:
                self.planner = self.new_planner()
                offset = StreamOffset.parse(offset.as_json(), stream=STREAM)
            end = self.planner.latest(offset, budget)
            if end.as_json() == offset.as_json():
                return batches, offset
            batches.append(self.read(offset, end))
            offset = end
        raise AssertionError("the query never caught up")


def keys(batches: list[Batch]) -> list[str]:
    return [record.partition_key for batch in batches for record in batch]


def assert_in_shard_order(batches: list[Batch]) -> None:
    seen: dict[str, tuple[int, int]] = {}
    for batch in batches:
        for record in batch:
            place = (int(record.sequence_number), record.sub_sequence_number or 0)
            assert place > seen.get(record.shard_id, (-1, -1)), record
            seen[record.shard_id] = place


# --- every record once, in order --------------------------------------------------------------


def test_every_record_is_read_once_in_shard_order_and_a_restart_reads_only_new_ones() -> None:
    # GIVEN plain records on both shards and a KPL aggregate of three user records
    world = World()
    world.put(*(f"k{i:02d}" for i in range(20)))
    world.put_aggregate("agg-0", "agg-1", "agg-2", hash_key=5)
    # WHEN the query runs until it has caught up
    batches, offset = world.run()
    # THEN each user record was read once, in order within its shard
    assert sorted(keys(batches)) == sorted(
        [*(f"k{i:02d}" for i in range(20)), "agg-0", "agg-1", "agg-2"]
    )
    assert_in_shard_order(batches)
    # WHEN more records arrive and the query goes on from its last offset (a restart)
    world.put("new-0", "new-1", "new-2")
    more, _ = world.run(StreamOffset.parse(offset.as_json(), stream=STREAM))
    # THEN it reads those and nothing else
    assert sorted(keys(more)) == ["new-0", "new-1", "new-2"]


def test_an_empty_stream_has_no_batch_and_a_caught_up_query_stays_put() -> None:
    world = World()
    batches, offset = world.run()
    assert batches == []
    assert world.planner.latest(offset, None) == offset


def test_a_replayed_batch_reads_the_same_records_though_more_arrived_since() -> None:
    # GIVEN a batch planned and read
    world = World()
    world.put(*(f"k{i:02d}" for i in range(10)))
    start = world.planner.initial()
    end = world.planner.latest(start, None)
    first = world.read(start, end)
    # WHEN more records arrive and the batch is replayed from its logged offsets
    world.put(*(f"late-{i}" for i in range(10)))
    replayed = world.read(
        StreamOffset.parse(start.as_json(), stream=STREAM),
        StreamOffset.parse(end.as_json(), stream=STREAM),
    )
    # THEN it reads exactly the same records
    assert replayed == first
    assert len(first) == 10


# --- a bounded batch ----------------------------------------------------------------------------


def test_a_limit_bounds_each_batch_in_user_records_and_cuts_at_whole_records() -> None:
    # GIVEN 27 plain records and an aggregate of 4 after the 12th, all on one shard
    world = World()
    world.put(*(f"k{i:02d}" for i in range(12)), hash_key=5)
    world.put_aggregate(*(f"agg-{i}" for i in range(4)), hash_key=5)
    world.put(*(f"m{i:02d}" for i in range(15)), hash_key=5)
    # WHEN it is read 7 user records at most per batch
    batches, _ = world.run(budget=Budget(7, None))
    # THEN every batch holds 7 at most, the aggregate is never split, and all is read once
    assert [len(b) for b in batches] == [7, 5, 7, 7, 5]
    aggregate_batches = {i for i, b in enumerate(batches) for r in b if r.aggregated}
    assert len(aggregate_batches) == 1
    assert len(keys(batches)) == len(set(keys(batches))) == 31
    assert_in_shard_order(batches)


def test_a_bounded_batch_after_a_record_counts_its_share_with_one_get_records() -> None:
    # GIVEN a shard of 6 records whose first 3 a bounded batch has read
    world = World(shard_count=1)
    world.put(*(f"k{i}" for i in range(6)))
    budget = Budget(3, None)
    first = world.planner.latest(world.planner.initial(), budget)
    calls = world.kinesis.get_records_calls
    # WHEN the next batch's end is counted on from the first's last record
    end = world.planner.latest(first, budget)
    # THEN one GetRecords counted it: its page holds the record checked (the start) and 3 after
    # it, not 2 (a second call would wait for the shard's pace, a shard after another)
    assert world.kinesis.get_records_calls - calls == 1
    assert keys([world.read(first, end)]) == ["k3", "k4", "k5"]


def test_a_caught_up_bounded_query_counts_each_shard_with_one_get_records() -> None:
    # GIVEN a bounded query that has read both shards' records
    counting: list[Counting] = []
    world = World(client=lambda fake: counting.append(Counting(fake)) or counting[0])
    world.put(*(f"low-{i}" for i in range(5)), hash_key=5)
    world.put(*(f"high-{i}" for i in range(5)), hash_key=HALF + 5)
    budget = Budget(4, None)
    _, offset = world.run(budget=budget)
    counting[0].calls.clear()
    # WHEN its next batch is planned with nothing new on either shard
    end = world.planner.latest(offset, budget)
    # THEN it stays put, each shard counted with an iterator at its last record and one page,
    # which holds that record alone and is 0 ms behind the tip: no second, empty, page
    assert end.as_json() == offset.as_json()
    assert sorted(counting[0].calls) == [
        ("GetRecords", 3),  # a share of 2, and the record checked
        ("GetRecords", 3),
        ("GetShardIterator", "AT_SEQUENCE_NUMBER"),
        ("GetShardIterator", "AT_SEQUENCE_NUMBER"),
    ]
    # AND a record that arrives after is the next batch's, read once
    world.put("late", hash_key=5)
    batches, _ = world.run(offset, budget)
    assert keys(batches) == ["late"]


@pytest.mark.parametrize("caught_up", [False, True])
def test_the_counts_of_a_bounded_batch_read_every_shard_at_once(caught_up: bool) -> None:
    # GIVEN four shards holding records, read (caught up) or not yet (a backlog)
    world = World(shard_count=4)
    for index in range(4):
        world.put(*(f"s{index}-{i}" for i in range(3)), hash_key=index * (2**128 // 4) + 5)
    budget = Budget(8, None)
    offset = world.planner.initial()
    if caught_up:
        _, offset = world.run(offset, budget)
    # AND a planner (the query restarted) whose shards answer only once all four have asked
    world.client = MeetingShards(world.kinesis, shards=4)
    world.planner = world.new_planner()
    calls = world.kinesis.get_records_calls
    # WHEN the next batch's end is counted
    end = world.planner.latest(offset, budget)
    # THEN the four counts met (one shard after another, the first would have waited alone),
    # each with one GetRecords
    assert world.kinesis.get_records_calls - calls == 4
    if caught_up:
        assert end.as_json() == offset.as_json()
    else:
        assert len(keys([world.read(offset, end)])) == 8


def test_a_per_shard_limit_bounds_each_shard() -> None:
    world = World()
    world.put(*(f"low-{i}" for i in range(5)), hash_key=5)
    world.put(*(f"high-{i}" for i in range(9)), hash_key=HALF + 5)
    batches, _ = world.run(budget=Budget(None, 3))
    assert [len(b) for b in batches] == [6, 5, 3]
    assert len(set(keys(batches))) == 14


def test_shards_of_aggregates_bigger_than_their_share_take_turns_carried_by_the_checkpoint() -> (
    None
):
    # GIVEN three shards, each holding 4 KPL aggregates of 60 user records (more than 100 / 3)
    world = World(shard_count=3)
    for index in range(3):
        for n in range(4):
            world.put_aggregate(
                *(f"s{index}-{n}-{i:02d}" for i in range(60)),
                hash_key=index * (2**128 // 3) + 5,
            )
    # WHEN the query reads 100 user records a batch at most, restarted before every batch
    batches, _ = world.run(budget=Budget(100, None), restarting=True)
    # THEN each batch is one whole aggregate, the shards take turns, all is read once
    assert [len(b) for b in batches] == [60] * 12
    assert [b[0].shard_id[-1] for b in batches] == list("012" * 4)
    assert len(keys(batches)) == len(set(keys(batches))) == 720
    assert_in_shard_order(batches)


def test_a_limit_below_the_shard_count_moves_every_shard_every_other_batch() -> None:
    # GIVEN four shards of 3 plain records each
    world = World(shard_count=4)
    for index in range(4):
        world.put(*(f"s{index}-{i}" for i in range(3)), hash_key=index * (2**128 // 4) + 5)
    # WHEN the query reads 2 user records a batch at most
    batches, _ = world.run(budget=Budget(2, None))
    # THEN two shards move in one batch, the other two in the next, until all is read
    moved = [sorted({r.shard_id[-1] for r in b}) for b in batches]
    assert moved == [["0", "1"], ["2", "3"]] * 3
    assert len(set(keys(batches))) == 12


# --- lineage ------------------------------------------------------------------------------------


class EndingLate:
    """Kinesis as kinesalite answers for a closed shard: the page holding its last record gives
    a next iterator still, and only the empty page after it says the shard ended."""

    def __init__(self, fake: FakeKinesisClient) -> None:
        self.fake = fake

    def get_records(self, **kwargs: Any) -> Any:
        if kwargs["ShardIterator"] == "ended":
            return {"Records": [], "MillisBehindLatest": 0}
        page = self.fake.get_records(**kwargs)
        if page["Records"] and "NextShardIterator" not in page:
            page["NextShardIterator"] = "ended"
        return page

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fake, name)


@pytest.mark.parametrize("client", [lambda fake: fake, EndingLate], ids=["fake", "ending-late"])
def test_a_split_parent_is_read_to_its_end_before_its_children_nothing_lost_or_repeated(
    client: Callable[[FakeKinesisClient], Any],
) -> None:
    # GIVEN one shard with records, read in part (its end said on its last page, or after it)
    world = World(shard_count=1, client=client)
    world.put(*(f"before-{i}" for i in range(6)))
    start = world.planner.initial()
    first, offset = world.run(start, Budget(4, None))
    # WHEN more records land on it, it is split, and records land on both children
    world.put(*(f"parent-{i}" for i in range(3)))
    world.kinesis.split_shard("shardId-000000000000", HALF)
    world.put(*(f"child-{i}" for i in range(8)))
    rest, _ = world.run(offset, Budget(4, None))
    # THEN every record was read once, and every parent record in a batch before any child's
    batches = first + rest
    names = keys(batches)
    assert sorted(names) == sorted(
        [
            *(f"before-{i}" for i in range(6)),
            *(f"parent-{i}" for i in range(3)),
            *(f"child-{i}" for i in range(8)),
        ]
    )
    parent_batches = [i for i, b in enumerate(batches) for r in b if r.shard_id.endswith("0")]
    child_batches = [i for i, b in enumerate(batches) for r in b if not r.shard_id.endswith("0")]
    assert max(parent_batches) < min(child_batches)
    assert_in_shard_order(batches)


# --- where a query starts -------------------------------------------------------------------------


def test_latest_starts_after_what_the_stream_holds_when_the_query_starts() -> None:
    world = World(starting=StartingPosition(StartingPositionKind.LATEST))
    world.put(*(f"old-{i}" for i in range(5)))
    start = world.planner.initial()
    world.put(*(f"new-{i}" for i in range(5)))
    batches, _ = world.run(start)
    assert sorted(keys(batches)) == [f"new-{i}" for i in range(5)]


def test_a_starting_timestamp_starts_at_the_first_record_that_arrived_then() -> None:
    clock_start = ManualClock().now_ms()
    world = World(starting=StartingPosition(StartingPositionKind.AT_TIMESTAMP, clock_start + 1_000))
    world.put(*(f"old-{i}" for i in range(5)))
    world.kinesis.advance(2_000)
    world.put(*(f"new-{i}" for i in range(5)))
    batches, _ = world.run()
    assert sorted(keys(batches)) == [f"new-{i}" for i in range(5)]


def test_available_now_reads_what_the_stream_held_when_it_started_and_no_more() -> None:
    world = World()
    world.put(*(f"k{i}" for i in range(6)))
    world.planner.freeze()
    world.put(*(f"later-{i}" for i in range(6)))
    batches, _ = world.run(budget=Budget(4, None))
    assert sorted(keys(batches)) == [f"k{i}" for i in range(6)]


# --- the tail, cheaply --------------------------------------------------------------------------


class Counting:
    """A client that counts the records GetRecords returns, and keeps the calls made to read
    them in order (the iterator's type, or GetRecords' limit)."""

    def __init__(self, fake: FakeKinesisClient) -> None:
        self.fake = fake
        self.records_returned = 0
        self.calls: list[tuple[str, object]] = []

    def get_shard_iterator(self, **kwargs: Any) -> Any:
        self.calls.append(("GetShardIterator", kwargs["ShardIteratorType"]))
        return self.fake.get_shard_iterator(**kwargs)

    def get_records(self, **kwargs: Any) -> Any:
        self.calls.append(("GetRecords", kwargs.get("Limit")))
        page = self.fake.get_records(**kwargs)
        self.records_returned += len(page["Records"])
        return page

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fake, name)


def test_the_tail_of_a_busy_shard_is_found_reading_its_last_seconds_only() -> None:
    # GIVEN a shard with 500 records an hour old and 3 just now
    counting: list[Counting] = []
    world = World(shard_count=1, client=lambda fake: counting.append(Counting(fake)) or counting[0])
    world.put(*(f"old-{i}" for i in range(500)))
    world.kinesis.advance(3_600_000)
    world.put("new-0", "new-1", "new-2")
    offset = world.planner.initial()
    # WHEN the first batch's end is fixed
    end = world.planner.latest(offset, None)
    # THEN it is the last record, found by reading the last seconds, not the shard
    assert end.progress("shardId-000000000000").after == world.kinesis.visible()[-1].sequence_number
    assert counting[0].records_returned <= 3


def test_planning_a_batch_says_how_far_behind_its_tail_each_shard_starts() -> None:
    # GIVEN a query that read a shard's first record, and 3 more records 4 s later
    world = World(shard_count=1)
    world.put("k0")
    world.planner.latest(world.planner.initial(), None)
    assert world.planner.lags_ms == {}  # the first batch starts at the trim horizon: no time
    _, offset = world.run()
    assert world.planner.lags_ms == {"shardId-000000000000": 0}  # caught up
    world.kinesis.advance(4_000)
    world.put("k1", "k2")
    world.kinesis.advance(1_000)
    world.put("k3")
    # WHEN the next batch is planned
    world.planner.latest(offset, None)
    # THEN its start (k0) is behind the tail (k3) by their arrival times
    visible = world.kinesis.visible()
    assert world.planner.lags_ms == {
        "shardId-000000000000": visible[-1].arrival_ms - visible[0].arrival_ms
    }
    assert world.planner.lags_ms["shardId-000000000000"] >= 5_000


def test_a_page_short_of_what_was_asked_and_at_the_tip_ends_the_tail_search() -> None:
    # GIVEN a shard with 3 records just now
    world = World(shard_count=1)
    world.put("k0", "k1", "k2")
    # WHEN the first batch's end is fixed
    end = world.planner.latest(world.planner.initial(), None)
    # THEN one GetRecords found it: 3 records of the 1,000 asked for, 0 ms behind the tip
    assert end.progress("shardId-000000000000").after == world.kinesis.visible()[-1].sequence_number
    assert world.kinesis.get_records_calls == 1


def test_the_tail_of_a_shard_quiet_since_a_burst_is_found_without_reading_the_burst() -> None:
    # GIVEN a shard that took 5,000 records in 5 s, a minute ago, and nothing since
    counting: list[Counting] = []
    world = World(shard_count=1, client=lambda fake: counting.append(Counting(fake)) or counting[0])
    for burst in range(50):
        world.put(*(f"b{burst}-{i}" for i in range(100)))
        world.kinesis.advance(100)
    world.kinesis.advance(60_000)
    # WHEN the first batch's end is fixed
    end = world.planner.latest(world.planner.initial(), None)
    # THEN it is the last record, found by reading the burst's last second, not all of it
    assert end.progress("shardId-000000000000").after == world.kinesis.visible()[-1].sequence_number
    # (a page of 1,000 says the window holds more, then one record a step, then what arrived
    # from the last step's start, at most a second of the burst: 1,000 records)
    assert counting[0].records_returned <= 1_000 + 20 + 1_000
    # AND the last read went on from the last step's record, with no iterator of its own
    # (kinesalite scans the shard from its start for each AT_TIMESTAMP iterator)
    last_iterator = max(
        i for i, (op, _) in enumerate(counting[0].calls) if op == "GetShardIterator"
    )
    assert counting[0].calls[last_iterator + 1] == ("GetRecords", 1)  # the last step's
    assert all(op == "GetRecords" for op, _ in counting[0].calls[last_iterator + 1 :])
    # AND a batch reads every record of the burst
    batches, _ = world.run()
    assert len(keys(batches)) == 5_000


def test_a_running_query_finds_its_next_end_with_one_call_when_a_page_holds_what_follows() -> None:
    # GIVEN a query that read a busy shard to its tail (1,500 records in its last second)
    counting: list[Counting] = []
    world = World(shard_count=1, client=lambda fake: counting.append(Counting(fake)) or counting[0])
    for burst in range(15):
        world.put(*(f"old-{burst}-{i}" for i in range(100)))
        world.kinesis.advance(50)
    _, offset = world.run()
    # AND 300 more records since
    world.put(*(f"new-{i}" for i in range(300)))
    counting[0].calls.clear()
    # WHEN its next batch is planned
    end = world.planner.latest(offset, None)
    # THEN its end is the last record, found by reading on from the last end: no window, no
    # halving (an AT_TIMESTAMP iterator is a scan of the shard on kinesalite, a call on AWS)
    shard = "shardId-000000000000"
    assert end.progress(shard).after == world.kinesis.visible()[-1].sequence_number
    assert counting[0].calls == [
        ("GetShardIterator", "AFTER_SEQUENCE_NUMBER"),
        ("GetRecords", 1_000),
    ]
    # AND with nothing new, the batch after it is found empty the same way
    counting[0].calls.clear()
    assert world.planner.latest(end, None).as_json() == end.as_json()
    assert len(counting[0].calls) == 2


class RefusingPositions:
    """A client on which Kinesis refuses every position after a sequence number, as it may one
    past the trim horizon (InvalidArgumentException)."""

    def __init__(self, fake: FakeKinesisClient) -> None:
        self.fake = fake

    def get_shard_iterator(self, **kwargs: Any) -> Any:
        if kwargs["ShardIteratorType"] == "AFTER_SEQUENCE_NUMBER":
            raise botocore.exceptions.ClientError(
                {"Error": {"Code": "InvalidArgumentException", "Message": "too old"}},
                "GetShardIterator",
            )
        return self.fake.get_shard_iterator(**kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fake, name)


def test_a_start_kinesis_refuses_to_read_on_from_is_searched_for_from_the_last_seconds() -> None:
    # GIVEN a query that read a shard, 3 more records, and a Kinesis that refuses to read on
    # after the batch's start
    world = World(shard_count=1, client=RefusingPositions)
    world.put("k0", "k1")
    offset = world.planner.latest(world.planner.initial(), None)
    world.put("k2", "k3", "k4")
    # WHEN the next batch is planned
    end = world.planner.latest(offset, None)
    # THEN its end is still the last record (the executor's read says what was lost, if any)
    assert end.progress("shardId-000000000000").after == world.kinesis.visible()[-1].sequence_number


def test_the_tail_of_an_idle_shard_is_found_by_widening_the_window() -> None:
    world = World(shard_count=1)
    world.put(*(f"k{i}" for i in range(5)))
    world.kinesis.advance(5 * 3_600_000)  # quiet for 5 hours
    batches, _ = world.run()
    assert len(keys(batches)) == 5


class MeetingShards:
    """Each shard's first iterator is given only once every shard has asked for one: looked
    for one shard after another, the tails would never be found (the wait gives up after 5 s)."""

    def __init__(self, fake: FakeKinesisClient, shards: int = 2) -> None:
        self.fake = fake
        self._all_asked = threading.Barrier(shards, timeout=5)
        self._asked: set[str] = set()
        self._lock = threading.Lock()

    def get_shard_iterator(self, **kwargs: Any) -> Any:
        with self._lock:
            first = kwargs["ShardId"] not in self._asked
            self._asked.add(kwargs["ShardId"])
        if first:
            self._all_asked.wait()
        return self.fake.get_shard_iterator(**kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fake, name)


@pytest.mark.parametrize("available_now", [False, True])
def test_the_tails_of_all_shards_are_looked_for_at_once(available_now: bool) -> None:
    # GIVEN two shards holding records, whose tails can only be found together
    world = World(client=MeetingShards)
    world.put(*(f"k{i:02d}" for i in range(20)))
    world.kinesis.advance(60_000)
    # WHEN a batch's end is fixed (under AvailableNow, when the run starts)
    if available_now:
        world.planner.freeze()
    batches, _ = world.run()
    # THEN every record is read, each shard to its tail
    assert sorted(keys(batches)) == [f"k{i:02d}" for i in range(20)]
    assert {record.shard_id for batch in batches for record in batch} == {
        "shardId-000000000000",
        "shardId-000000000001",
    }


# --- faults -------------------------------------------------------------------------------------


class Flaky:
    """Every third GetRecords is throttled, every fifth finds its iterator expired."""

    def __init__(self, fake: FakeKinesisClient) -> None:
        self.fake = fake
        self.calls = 0

    def get_records(self, **kwargs: Any) -> Any:
        self.calls += 1
        for every, code in (
            (3, "ProvisionedThroughputExceededException"),
            (5, "ExpiredIteratorException"),
        ):
            if self.calls % every == 0:
                raise botocore.exceptions.ClientError(
                    {"Error": {"Code": code, "Message": code}}, "GetRecords"
                )
        return self.fake.get_records(**{**kwargs, "Limit": 2})

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fake, name)


def test_throttled_reads_and_expired_iterators_lose_and_repeat_nothing() -> None:
    world = World(client=Flaky)
    world.put(*(f"k{i:02d}" for i in range(25)))
    world.put_aggregate("agg-0", "agg-1", hash_key=5)
    batches, _ = world.run(budget=Budget(6, None))
    assert sorted(keys(batches)) == sorted([*(f"k{i:02d}" for i in range(25)), "agg-0", "agg-1"])
    assert_in_shard_order(batches)


def test_a_position_past_the_trim_horizon_fails_naming_the_shard_and_since_when() -> None:
    # GIVEN a query that read a shard, then stopped for longer than the retention (24 h)
    world = World(shard_count=1)
    world.put("k0", "k1")
    _, offset = world.run()
    world.put("unread-0")  # written after the last batch, trimmed before the next
    world.kinesis.advance(25 * 3_600_000)
    world.put("k2")
    end = world.planner.latest(offset, None)
    # WHEN its next batch is read
    with pytest.raises(ShardPositionLostError) as lost:
        world.read(offset, end)
    # THEN it fails naming the shard, the position and the first record still held
    error = lost.value
    assert error.shard_id == "shardId-000000000000"
    assert error.sequence_number == offset.progress("shardId-000000000000").after
    assert error.first_sequence_number == world.kinesis.visible()[-1].sequence_number
    assert "fail_on_data_loss=false" in "".join(getattr(error, "__notes__", []))


def test_with_fail_on_data_loss_off_the_read_goes_on_from_the_oldest_record_kept() -> None:
    world = World(shard_count=1, fail_on_data_loss=False)
    world.put("k0", "k1")
    _, offset = world.run()
    world.put("unread-0")
    world.kinesis.advance(25 * 3_600_000)
    world.put("k2")
    batches, _ = world.run(offset, Budget(5, None))
    assert keys(batches) == ["k2"]


def test_an_unfinished_shard_gone_from_the_stream_is_reported() -> None:
    world = World(shard_count=1)
    offset = StreamOffset(STREAM, {"shardId-999": ShardProgress("5", 1)})
    with pytest.raises(ShardPositionLostError, match="shardId-999"):
        world.planner.latest(offset, None)


def test_an_unknown_stream_fails_the_query_at_its_start_saying_so() -> None:
    world = World()
    planner = StreamPlanner(
        KinesisReader(world.kinesis, "no-such-stream"),
        world.clock,
        starting_position=TRIM_HORIZON,
        fail_on_data_loss=True,
        margin_ms=500,
    )
    with pytest.raises(StreamNotFoundError, match="'no-such-stream' does not exist"):
        planner.initial()


def test_a_stream_deleted_mid_query_fails_the_next_batch_saying_so() -> None:
    # GIVEN a query that has read a batch
    world = World()
    world.put("k1")
    batches, offset = world.run()
    assert keys(batches) == ["k1"]
    # WHEN the stream is deleted (every call naming it now gets ResourceNotFoundException)
    world.kinesis.stream = "deleted-meanwhile"
    # THEN the next batch's planning fails, naming the stream, instead of reading nothing
    with pytest.raises(StreamNotFoundError, match=f"'{STREAM}' does not exist"):
        world.planner.latest(offset, None)


def test_a_caught_up_query_asks_kinesis_again_only_once_a_second() -> None:
    # GIVEN a query that has read everything, its planner polling idle shards once a second
    world = World()
    world.planner = StreamPlanner(
        KinesisReader(world.client, STREAM, sleep=world.kinesis.sleep),
        world.clock,
        starting_position=TRIM_HORIZON,
        fail_on_data_loss=True,
        margin_ms=500,
    )
    world.put("k0", "k1")
    _, offset = world.run()
    calls = world.kinesis.get_records_calls
    # WHEN Spark's default trigger asks for the next batch again at once, then a record
    # arrives, and it asks again within the second, then after it
    assert world.planner.latest(offset, None) == offset
    world.put("late")
    within = world.planner.latest(offset, None)
    asked_within = world.kinesis.get_records_calls - calls
    world.clock.advance(1_000)
    after = world.planner.latest(offset, None)
    # THEN within the second the query stays put without a call; after it, it finds the record
    assert within == offset
    assert asked_within == 0
    assert after != offset
    assert keys([world.read(offset, after)]) == ["late"]
