"""What a process's replay attempts share of their recovery reads (producer.replay.shared_reads):
a read of windows that can no longer change answers a later ask for them, or for windows inside
them (its records there), and a shard map is reused only while it was listed after the windows
ended."""

from __future__ import annotations

from typing import Any

from dedupe_store.clock import ManualClock
from dedupe_store.records import Position
from producer.replay.shared_reads import PlannedReads, RecordRead, SharedReads


def record(arrival_ms: int) -> RecordRead:
    return ("k", b"d" * 16), Position("shardId-0", str(arrival_ms), 0), arrival_ms


def test_a_read_answers_the_same_windows_and_windows_inside_them_with_their_records() -> None:
    # GIVEN a shard's read of [0, 100], records that arrived at 5, 30 and 90
    shared = SharedReads()
    reads: list[str] = []

    def read() -> list[RecordRead]:
        reads.append("read")
        return [record(5), record(30), record(90)]

    shared.records("shardId-0", [(0, 100)], read)
    # WHEN the same windows, windows inside them, and windows past them are asked for
    same = shared.records("shardId-0", [(0, 100)], read)
    inside = shared.records("shardId-0", [(10, 50), (80, 95)], read)
    past = shared.records("shardId-0", [(50, 150)], read)
    other_shard = shared.records("shardId-1", [(0, 100)], read)
    # THEN the first two come from the read before (inside: only its records there); windows
    # reaching past it, or another shard's, are read
    assert [r[2] for r in same] == [5, 30, 90]
    assert [r[2] for r in inside] == [30, 90]
    assert len(past) == 3
    assert len(other_shard) == 3
    assert reads == ["read", "read", "read"]
    assert shared.reads == 3


class _Reader:
    def __init__(self) -> None:
        self.listings = 0

    def shards(self) -> list[Any]:
        self.listings += 1
        return []


def test_a_shard_map_is_reused_only_while_it_was_listed_after_the_windows_ended() -> None:
    # GIVEN a map listed at 10,000 ms (skew 500 ms)
    clock = ManualClock(10_000)
    shared = SharedReads()
    reader: Any = _Reader()
    shared.shard_map(reader, clock, until_ms=9_000, skew_ms=500)
    # WHEN windows that ended before the listing, then one that ends after it, ask for a map
    clock.advance(5_000)
    shared.shard_map(reader, clock, until_ms=9_400, skew_ms=500)
    shared.shard_map(reader, clock, until_ms=9_600, skew_ms=500)
    # THEN the first is answered by the map listed before (a shard created since holds only
    # later records); the second lists again (one created since may hold its records)
    assert reader.listings == 2


def test_a_driver_s_plan_seeds_the_map_and_the_reads() -> None:
    # GIVEN a plan a driver made of one shard's windows
    shared = SharedReads()
    planned = PlannedReads(
        run="q/1", listed_at_ms=50_000, shards=(), windows=((0, 100),), reads={"s": (record(7),)}
    )
    # WHEN a worker is seeded with it
    shared.seed(planned)
    # THEN the shard's reads of those windows come from it, read by no one here
    found = shared.records("s", [(0, 100)], list)
    assert [r[2] for r in found] == [7]
    assert shared.reads == 0
    assert shared.shard_map(_Reader(), ManualClock(60_000), until_ms=100, skew_ms=0) == []
