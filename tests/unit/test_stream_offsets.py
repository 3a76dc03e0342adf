"""The offsets of a streaming read and the plans made from them: pure, no Kinesis, no Spark.

A batch is (start offset, end offset); Spark logs both before the batch runs and replays a
batch from them, so what a batch reads must be a function of the two offsets alone.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kinesis_store.positions import SeenRecord, ShardStart
from kinesis_store.shards import Shard
from spark_jobs.stream_offsets import (
    CheckpointMismatchError,
    ShardProgress,
    ShardRange,
    StreamOffset,
    Taken,
    allot,
    missing_from,
    plan,
    readable,
    with_listing,
)

STREAM = "orders"
TOP = 2**128 - 1
HALF = 2**127


def shard(
    shard_id: str,
    start: int = 0,
    end: int = TOP,
    *,
    parent: str | None = None,
    adjacent: str | None = None,
    closed: bool = False,
) -> Shard:
    return Shard(shard_id, start, end, parent, adjacent, "0", "99" if closed else None)


# shard 0 was split into 1 and 2; then 1 and 2 were merged into 3
S0 = shard("shardId-0", closed=True)
S1 = shard("shardId-1", 0, HALF - 1, parent="shardId-0", closed=True)
S2 = shard("shardId-2", HALF, TOP, parent="shardId-0", closed=True)
S3 = shard("shardId-3", parent="shardId-1", adjacent="shardId-2")


def offset(**shards: ShardProgress) -> StreamOffset:
    return StreamOffset(STREAM, {name.replace("_", "-"): p for name, p in shards.items()})


def ids(shards: list[Shard]) -> list[str]:
    return [s.shard_id for s in shards]


# --- the offset's form -----------------------------------------------------------------------


def test_an_offset_survives_the_checkpoint_as_json_in_one_canonical_form() -> None:
    # GIVEN an offset built in any order, with every kind of shard position
    built = StreamOffset(
        STREAM,
        {
            "shardId-2": ShardProgress(finished=True),
            "shardId-0": ShardProgress("4960", 1_700_000_000_000),
            "shardId-1": ShardProgress(at_ms=1_699_000_000_000),
            "shardId-3": ShardProgress(),
        },
    )
    # WHEN it goes through the checkpoint (JSON text) and back
    text = json.dumps(built.as_json())
    parsed = StreamOffset.parse(json.loads(text), stream=STREAM)
    # THEN it is the same offset, and equal offsets give the same text (Spark compares text)
    assert parsed == built
    assert json.dumps(parsed.as_json()) == text
    assert list(json.loads(text)["shards"]) == ["shardId-0", "shardId-1", "shardId-2", "shardId-3"]
    assert json.loads(text)["shards"]["shardId-2"] == {"finished": True}


def test_a_checkpoint_from_another_stream_is_refused_naming_both() -> None:
    # GIVEN the checkpoint of a query that read stream "payments"
    raw = StreamOffset("payments", {"shardId-0": ShardProgress()}).as_json()
    # WHEN a query of stream "orders" starts from it
    with pytest.raises(CheckpointMismatchError) as refused:
        StreamOffset.parse(raw, stream=STREAM)
    # THEN it is refused, saying which stream the checkpoint is of and what to do
    assert refused.value.found == "payments"
    assert "'payments'" in str(refused.value)
    assert "checkpointLocation" in str(refused.value)


def test_an_offset_of_an_unknown_format_is_refused() -> None:
    with pytest.raises(CheckpointMismatchError, match="not one this version reads"):
        StreamOffset.parse({"version": 99, "stream": STREAM, "shards": {}}, stream=STREAM)
    with pytest.raises(CheckpointMismatchError):
        StreamOffset.parse({"0": 12}, stream=STREAM)


def test_a_shard_starts_where_its_progress_says() -> None:
    assert ShardProgress().start == ShardStart.trim_horizon()
    assert ShardProgress(at_ms=5).start == ShardStart.at_timestamp(5)
    assert ShardProgress("42", 7).start == ShardStart.after("42", 7)
    # moving on compares sequence numbers as integers, and never moves back
    moved = ShardProgress("99").advanced_to(SeenRecord("100", 1))
    assert moved == ShardProgress("100", 1)
    assert moved.advanced_to(SeenRecord("99", 0)) == moved
    assert moved.advanced_to(None, finished=True) == ShardProgress("100", 1, finished=True)


# --- lineage: the KCL's order ----------------------------------------------------------------


def test_children_are_read_only_once_every_parent_is_finished() -> None:
    listed = [S0, S1, S2, S3]
    # GIVEN nothing read yet: only the root can be read
    start, _ = with_listing(StreamOffset(STREAM, {}), listed)
    assert ids(readable(start, listed)) == ["shardId-0"]
    # WHEN the split parent is finished, THEN both children can be read, not the merge
    after_split = start.with_progress({"shardId-0": ShardProgress(finished=True)})
    assert ids(readable(after_split, listed)) == ["shardId-1", "shardId-2"]
    # WHEN one merge parent is finished, THEN the merged shard still waits for the other
    one = after_split.with_progress({"shardId-1": ShardProgress(finished=True)})
    assert ids(readable(one, listed)) == ["shardId-2"]
    # WHEN both are, THEN it is read
    both = one.with_progress({"shardId-2": ShardProgress(finished=True)})
    assert ids(readable(both, listed)) == ["shardId-3"]


def test_a_parent_gone_past_the_retention_does_not_hold_its_children_back() -> None:
    # GIVEN a stream that no longer lists the split parent (past its retention)
    listed = [S1, S2]
    start, gone = with_listing(StreamOffset(STREAM, {}), listed)
    # THEN its children are read at once
    assert gone == []
    assert ids(readable(start, listed)) == ["shardId-1", "shardId-2"]


def test_the_listing_adds_new_shards_drops_finished_ones_gone_and_reports_unfinished_ones_gone() -> (
    None
):
    # GIVEN an offset with a finished shard and an unfinished one, both no longer listed
    start = offset(shardId_0=ShardProgress(finished=True), shardId_1=ShardProgress("7"))
    # WHEN the stream lists only a new shard
    updated, gone = with_listing(start, [S3])
    # THEN the new shard is added unread, the finished one leaves, the unfinished one is lost
    assert updated.shards == {"shardId-3": ShardProgress()}
    assert gone == ["shardId-1"]
    # AND a finished shard the stream still lists stays finished (it is never read again)
    kept, _ = with_listing(start, [S0, S3])
    assert kept.progress("shardId-0").finished


# --- plans: a function of two offsets --------------------------------------------------------


def test_a_batch_plans_one_range_per_shard_that_moved() -> None:
    listed = {s.shard_id: s for s in (S0, S1, S2, S3)}
    start = offset(
        shardId_0=ShardProgress(finished=True),
        shardId_1=ShardProgress("10", 1),
        shardId_2=ShardProgress(at_ms=5),
        shardId_3=ShardProgress(),
    )
    end = start.with_progress(
        {"shardId-1": ShardProgress("20", 2, finished=True), "shardId-2": ShardProgress("30", 3)}
    )
    # WHEN the batch is planned
    ranges = plan(start, end, listed)
    # THEN a finished shard reads to its end, a moved one through its new end, from where each
    # started; the finished root and the unmoved merge child get nothing
    assert ranges == [
        ShardRange(S1, ShardStart.after("10", 1), None),
        ShardRange(S2, ShardStart.at_timestamp(5), "30"),
    ]


def test_a_replay_plans_the_same_partitions() -> None:
    # GIVEN a batch's two offsets as Spark logged them (JSON), and the shard map
    listed = {s.shard_id: s for s in (S1, S2, S3)}
    start = offset(shardId_1=ShardProgress("10", 1), shardId_2=ShardProgress())
    end = offset(shardId_1=ShardProgress("12", 2), shardId_2=ShardProgress("40", 4))
    logged = (json.dumps(start.as_json()), json.dumps(end.as_json()))
    first = plan(start, end, listed)
    # WHEN the batch is replayed after a restart: offsets read back, the map in another order
    again = plan(
        StreamOffset.parse(json.loads(logged[0]), stream=STREAM),
        StreamOffset.parse(json.loads(logged[1]), stream=STREAM),
        dict(reversed(listed.items())),
    )
    # THEN it plans the same ranges
    assert again == first
    assert [r.through for r in first] == ["12", "40"]


def test_an_empty_batch_plans_nothing() -> None:
    start = offset(shardId_1=ShardProgress("10"), shardId_2=ShardProgress(finished=True))
    assert plan(start, start, {s.shard_id: s for s in (S1, S2)}) == []


def test_a_shard_gone_between_planning_and_reading_is_reported() -> None:
    start = offset(shardId_1=ShardProgress("10"))
    end = offset(shardId_1=ShardProgress("12"))
    assert missing_from(start, end, {}) == ["shardId-1"]
    assert plan(start, end, {}) == []


# --- the budget of a bounded batch -----------------------------------------------------------


class Shards:
    """Shards with so many user records left, each Kinesis record holding ``sizes`` of them.
    ``take`` is the reader's rule: whole records while they fit in the share, or one record
    that does not, alone, when it holds at most ``whole_up_to`` (None: however many)."""

    def __init__(self, **records: list[int]) -> None:
        self.records = {name: list(sizes) for name, sizes in records.items()}
        self.taken: dict[str, int] = dict.fromkeys(records, 0)
        self.calls: list[tuple[str, int, int | None]] = []
        self.takes: list[tuple[str, list[int]]] = []  # the records of each take that got some

    def take(self, shard_id: str, share: int, whole_up_to: int | None) -> Taken:
        self.calls.append((shard_id, share, whole_up_to))
        queue, got = self.records[shard_id], []
        while queue and (
            sum(got) + queue[0] <= share
            or (not got and (whole_up_to is None or queue[0] <= whole_up_to))
        ):
            got.append(queue.pop(0))
            if sum(got) >= share:
                break
        if got:
            self.takes.append((shard_id, got))
        self.taken[shard_id] += sum(got)
        return Taken(sum(got), more=bool(queue))


@dataclass(frozen=True)
class Batch:
    """What one batch took: user records by shard, and its takes in the order made."""

    user_records: dict[str, int]
    takes: list[tuple[str, list[int]]]


def batches(shards: Shards, total: int | None, per_shard: int | None, count: int) -> list[Batch]:
    """``count`` batches one after the other, each starting its rounds at the shard the one
    before named (the turn an offset carries from batch to batch)."""
    turn: str | None = None
    out: list[Batch] = []
    for _ in range(count):
        before, takes_before = dict(shards.taken), len(shards.takes)
        turn = allot(list(shards.records), total, per_shard, shards.take, turn=turn)
        took = {name: shards.taken[name] - before[name] for name in shards.taken}
        out.append(Batch(took, shards.takes[takes_before:]))
    return out


def longest_wait(shards: dict[str, list[int]], run: list[Batch]) -> int:
    """The most batches in a row in which a shard that still had records took none of them
    (the batch it finally moves in not counted)."""
    left = {name: sum(sizes) for name, sizes in shards.items()}
    waiting, longest = dict.fromkeys(shards, 0), 0
    for batch in run:
        for name, took in batch.user_records.items():
            if left[name] and not took:
                waiting[name] += 1
                longest = max(longest, waiting[name])
            else:
                waiting[name] = 0
            left[name] -= took
    return longest


def test_a_budget_is_shared_fairly_and_what_one_shard_leaves_goes_to_the_others() -> None:
    # GIVEN three shards, one with little left
    shards = Shards(a=[1] * 50, b=[1] * 2, c=[1] * 50)
    # WHEN a batch of 30 user records is allotted
    allot(["a", "b", "c"], 30, None, shards.take)
    # THEN the short shard gives its 2, the others share the rest evenly, 30 in all
    assert shards.taken == {"a": 14, "b": 2, "c": 14}


def test_a_per_shard_bound_holds_with_or_without_a_total() -> None:
    shards = Shards(a=[1] * 50, b=[1] * 50)
    allot(["a", "b"], None, 7, shards.take)
    assert shards.taken == {"a": 7, "b": 7}
    bounded = Shards(a=[1] * 50, b=[1] * 50)
    allot(["a", "b"], 10, 3, bounded.take)
    assert bounded.taken == {"a": 3, "b": 3}


def test_aggregates_are_never_split_and_one_bigger_than_the_budget_is_read_alone() -> None:
    # GIVEN a shard whose next record is an aggregate of 25 user records
    shards = Shards(a=[25, 1, 1], b=[1] * 10)
    # WHEN a batch of 10 is allotted
    allot(["a", "b"], 10, None, shards.take)
    # THEN the aggregate is taken alone (the query must move on), and nothing else
    assert shards.taken == {"a": 25, "b": 0}
    # AND in the next batch, an aggregate that does not fit waits, the others go on
    later = Shards(a=[1, 5], b=[1] * 10)
    allot(["a", "b"], 6, None, later.take)
    assert later.taken == {"a": 1, "b": 5}


def test_a_budget_smaller_than_the_shard_count_still_moves() -> None:
    shards = Shards(a=[1] * 5, b=[1] * 5, c=[1] * 5)
    allot(["a", "b", "c"], 2, None, shards.take)
    assert shards.taken == {"a": 1, "b": 1, "c": 0}


def test_shards_of_aggregates_bigger_than_their_share_each_move_within_as_many_batches_as_shards() -> (
    None
):
    # GIVEN three shards of KPL aggregates of 60 user records, more than a third of the limit
    backlog = {"a": [60] * 8, "b": [60] * 8, "c": [60] * 8}
    # WHEN 8 batches of at most 100 user records are allotted
    run = batches(Shards(**backlog), 100, None, 8)
    # THEN every shard moves, none waits 3 batches, and no batch holds more than the limit
    assert [sum(b.user_records.values()) for b in run] == [60] * 8
    assert {name: sum(b.user_records[name] for b in run) for name in backlog} == {
        "a": 180,
        "b": 180,
        "c": 120,
    }
    assert longest_wait(backlog, run) <= 2


def test_a_limit_below_the_shard_count_moves_every_shard_within_shards_over_limit_batches() -> None:
    # GIVEN five shards of plain records and a limit of 2 user records a batch
    backlog = {name: [1] * 4 for name in "abcde"}
    # WHEN 10 batches are allotted
    run = batches(Shards(**backlog), 2, None, 10)
    # THEN each batch takes 2, and every shard moves at least once in every 3 (5 / 2) batches
    assert [sum(b.user_records.values()) for b in run] == [2] * 10
    assert longest_wait(backlog, run) <= 2
    assert all(sum(b.user_records[name] for b in run) == 4 for name in backlog)


def test_a_shard_takes_one_record_bigger_than_its_share_when_it_fits_what_the_batch_has_left() -> (
    None
):
    # GIVEN a shard of aggregates of 40 between two of plain records
    shards = Shards(a=[1] * 50, b=[40] * 3, c=[1] * 50)
    # WHEN a batch of 100 is allotted (a share of 33 each)
    allot(["a", "b", "c"], 100, None, shards.take)
    # THEN the aggregate is taken whole, and the others share what it leaves: 100 in all
    assert shards.taken == {"a": 33, "b": 40, "c": 27}


def test_the_turn_stays_when_nothing_is_taken_so_a_caught_up_offset_does_not_change() -> None:
    # GIVEN shards with nothing left, and a turn at the second
    shards = Shards(a=[], b=[], c=[])
    # WHEN a batch is allotted
    turn = allot(["a", "b", "c"], 10, None, shards.take, turn="b")
    # THEN it takes nothing and the turn is the same: the end offset equals the start
    assert shards.taken == {"a": 0, "b": 0, "c": 0}
    assert turn == "b"
    # AND a batch's rounds start at the turn, then go on in shard-id order
    assert [call[0] for call in shards.calls] == ["b", "c", "a"]


# shards' records, each of so many user records; a batch's limits (a total, per shard, or both)
BACKLOGS = st.lists(st.lists(st.integers(1, 40), max_size=10), min_size=1, max_size=6)
LIMITS = st.tuples(st.none() | st.integers(1, 60), st.none() | st.integers(1, 30)).map(
    lambda limits: (None, 1) if limits == (None, None) else limits
)


@given(backlog=BACKLOGS, limits=LIMITS)
def test_every_shard_with_a_backlog_moves_within_as_many_batches_as_shards_and_limits_hold(
    backlog: list[list[int]], limits: tuple[int | None, int | None]
) -> None:
    total, per_shard = limits
    # GIVEN shards holding records of any sizes, and any limits
    records = {f"s{i}": sizes for i, sizes in enumerate(backlog)}
    shards = Shards(**records)
    # WHEN batches are allotted one after the other until every shard is read
    run = batches(shards, total, per_shard, sum(len(sizes) for sizes in backlog))
    # THEN everything is read: every batch took something until then (no stall)
    assert not any(shards.records.values())
    moved = [bool(b.takes) for b in run]
    assert moved == sorted(moved, reverse=True)
    for batch in run:
        # AND a batch holds at most the limit, unless it is one record alone (the first take)
        taken = sum(batch.user_records.values())
        if total is not None:
            assert taken <= total or (len(batch.takes) == 1 and len(batch.takes[0][1]) == 1)
        # AND a shard takes at most its bound, unless with one record, the batch's first take
        if per_shard is not None:
            for name, took in batch.user_records.items():
                mine = [t for t in batch.takes if t[0] == name]
                assert took <= per_shard or (mine == [batch.takes[0]] and len(mine[0][1]) == 1)
    # AND no shard with records waits as many batches as there are shards
    assert longest_wait(records, run) < len(records)


@given(backlog=BACKLOGS, limits=LIMITS)
def test_each_round_says_first_what_it_may_offer_each_shard_and_offers_no_more(
    backlog: list[list[int]], limits: tuple[int | None, int | None]
) -> None:
    total, per_shard = limits
    # GIVEN shards holding records of any sizes, and any limits
    shards = Shards(**{f"s{i}": sizes for i, sizes in enumerate(backlog)})
    rounds: list[tuple[dict[str, int], list[tuple[str, int]]]] = []

    def take(shard_id: str, share: int, whole_up_to: int | None) -> Taken:
        rounds[-1][1].append((shard_id, share))
        return shards.take(shard_id, share, whole_up_to)

    # WHEN a batch is allotted, each round told to the caller before its takes
    allot(
        list(shards.records),
        total,
        per_shard,
        take,
        on_round=lambda offers: rounds.append((dict(offers), [])),
    )
    # THEN every take was told of first, in the order told, and offered no more than told
    assert sum(len(takes) for _, takes in rounds) == len(shards.calls)
    for offers, takes in rounds:
        assert [shard_id for shard_id, _ in takes] == list(offers)[: len(takes)]
        assert all(share <= offers[shard_id] for shard_id, share in takes)


def test_how_far_a_start_is_behind_the_tail_is_told_in_arrival_time_when_the_start_has_one() -> (
    None
):
    tail = SeenRecord("900", 50_000)
    # a start after a record read: the tail's arrival less that record's
    assert ShardProgress(after="100", after_ms=20_000).millis_behind(tail) == 30_000
    # a starting timestamp: less the timestamp
    assert ShardProgress(at_ms=45_000).millis_behind(tail) == 5_000
    # caught up: the tail is the start, or the shard holds nothing after it
    assert ShardProgress(after="900", after_ms=50_000).millis_behind(tail) == 0
    assert ShardProgress(after="100", after_ms=20_000).millis_behind(None) == 0
    # arrival times out of order never make a lag below 0
    assert ShardProgress(after="100", after_ms=60_000).millis_behind(tail) == 0
    # the trim horizon, or an offset with no time: not known
    assert ShardProgress().millis_behind(tail) is None
    assert ShardProgress(after="100").millis_behind(tail) is None
