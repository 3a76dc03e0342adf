"""The shard map as plain data: which shards a hash key routes to now, and its lineage."""

from __future__ import annotations

from kinesis_store.shards import Shard, lineage, open_shards

HALF = 2**127


def shard(shard_id: str, start: int, end: int, *, closed: bool = False) -> Shard:
    return Shard(shard_id, start, end, None, None, "0", "9" if closed else None)


# a split: the parent covers everything and is closed; its children cover one half each
PARENT = shard("shardId-0", 0, 2**128 - 1, closed=True)
LOW = shard("shardId-1", 0, HALF - 1)
HIGH = shard("shardId-2", HALF, 2**128 - 1)


def test_a_hash_key_has_the_parent_and_the_child_covering_it_in_its_lineage() -> None:
    # GIVEN a stream whose only shard was split in two
    # WHEN the lineage of a hash key in the upper half is asked for
    found = lineage([PARENT, LOW, HIGH], HALF + 5)
    # THEN it holds the closed parent and the upper child, not the lower child
    assert found == [PARENT, HIGH]


def test_range_ends_are_inclusive() -> None:
    # GIVEN the two children of a split
    # WHEN the hash keys at the edges of their ranges are routed
    # THEN each edge belongs to exactly one child
    assert lineage([LOW, HIGH], HALF - 1) == [LOW]
    assert lineage([LOW, HIGH], HALF) == [HIGH]


def test_open_shards_leave_out_closed_ones() -> None:
    # GIVEN a split stream
    # WHEN asked where writes can go now
    # THEN the closed parent is left out
    assert open_shards([PARENT, LOW, HIGH]) == [LOW, HIGH]
    assert PARENT.closed
    assert not LOW.closed
