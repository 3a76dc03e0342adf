"""A stream's shards as plain data: hash ranges, lineage through reshards, what the stream
says of itself, and which user records a KCL consumer of a shard gets (:func:`kcl_view`). No I/O:
:class:`kinesis_store.reader.KinesisReader` reads them from Kinesis.

A key's hash key routes it to the one open shard whose range covers it. After splits and
merges, every shard, open or closed, whose range covers the hash key is in the key's lineage:
a record of that key may sit in any of them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kinesis_store.entries import hash_key_of

if TYPE_CHECKING:
    from kinesis_store.kpl import UserRecord

__all__ = [
    "SHARD_MAP_MAX_AGE_S",
    "ListedShards",
    "OpenShards",
    "Shard",
    "StreamInfo",
    "kcl_delivers_whole",
    "kcl_view",
    "lineage",
    "open_shards",
]


@dataclass(frozen=True, slots=True)
class Shard:
    shard_id: str
    starting_hash_key: int
    ending_hash_key: int
    parent_shard_id: str | None
    adjacent_parent_shard_id: str | None
    starting_sequence_number: str
    ending_sequence_number: str | None

    @property
    def closed(self) -> bool:
        return self.ending_sequence_number is not None

    def covers(self, hash_key: int) -> bool:
        return self.starting_hash_key <= hash_key <= self.ending_hash_key


@dataclass(frozen=True, slots=True)
class StreamInfo:
    name: str
    retention_hours: int
    max_record_bytes: int
    open_shard_count: int


def open_shards(shards: Iterable[Shard]) -> list[Shard]:
    """The shards that take writes now."""
    return [shard for shard in shards if not shard.closed]


def lineage(shards: Sequence[Shard], hash_key: int) -> list[Shard]:
    """Every shard, open or closed, whose hash range covers ``hash_key``: the key's lineage
    through splits and merges (each parent and child covering it)."""
    return [shard for shard in shards if shard.covers(hash_key)]


def kcl_view(records: Iterable[UserRecord], shard: Shard) -> Iterator[tuple[UserRecord, bool]]:
    """Each user record read from ``shard`` (as the reader gives them: an aggregate's members
    one after another), with whether a KCL consumer of the shard gets it.

    The KCL's rule (amazon-kinesis-client, software/amazon/kinesis/retrieval/
    AggregatorUtil.java ``deaggregate``, called with the shard's hash range by
    ``ProcessTask``; KCL 1.x ``UserRecord.deaggregate`` the same): a raw record is always
    delivered; an aggregate's members are delivered all or none: as soon as one hashes outside
    the shard's range, the members before it are taken back and the rest are not read. So a
    stray aggregate (put by a stale shard map across a split) is not delivered at all, even
    its members inside the range. An aggregate's members are held until its last one is seen.
    """
    members: list[UserRecord] = []
    for record in records:
        if members and not _same_aggregate(members[0], record):
            yield from _whole_or_none(members, shard)
            members = []
        if record.aggregated:
            members.append(record)
        else:
            yield record, True
    yield from _whole_or_none(members, shard)


def _same_aggregate(first: UserRecord, record: UserRecord) -> bool:
    return (
        record.aggregated
        and record.sequence_number == first.sequence_number
        and record.shard_id == first.shard_id
    )


def kcl_delivers_whole(shard: Shard | None, hash_keys: Iterable[int]) -> bool:
    """Whether a KCL consumer of ``shard`` (the shard an aggregate was read from or landed on;
    None: unknown) gets the aggregate whose members have ``hash_keys``: all of them, or none
    (:func:`kcl_view`). The put loop asks it of each aggregate it put, the readers of each
    aggregate they read."""
    return shard is not None and all(shard.covers(hash_key) for hash_key in hash_keys)


def _whole_or_none(members: list[UserRecord], shard: Shard) -> Iterator[tuple[UserRecord, bool]]:
    delivered = kcl_delivers_whole(shard, map(_hash_key, members))
    for member in members:
        yield member, delivered


def _hash_key(record: UserRecord) -> int:
    if record.explicit_hash_key is not None:
        return int(record.explicit_hash_key)
    return hash_key_of(record.partition_key)


# how long a writer trusts its shard map: a reshard is followed within it (ListShards takes
# 1,000 calls a second per stream: one a minute a writer is nothing)
SHARD_MAP_MAX_AGE_S = 60.0


@dataclass(frozen=True, slots=True)
class ListedShards:
    """A stream's open shards as one listing read them, and when (epoch seconds): what a
    driver read for a write, shipped to its tasks (:meth:`OpenShards.offer`)."""

    shards: tuple[Shard, ...]
    listed_at_s: float


class OpenShards:
    """The stream's open shards as last read, for pacing puts and packing user records per
    shard. Read on first use, again once ``max_age_s`` old (a reshard is followed within it)
    and after a reshard is noticed (:meth:`forget`, :meth:`landed_on`); or taken from a
    listing read elsewhere (:meth:`offer`: a Spark write's driver lists once for all its
    tasks, so that the calls do not grow with the workers)."""

    def __init__(
        self,
        read: Callable[[], list[Shard]],
        *,
        max_age_s: float | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._read = read
        self._max_age_s = max_age_s
        self._clock = clock
        self._listed: ListedShards | None = None
        self._stale_before_s = float("-inf")  # a listing older than this missed a reshard

    def current(self) -> Sequence[Shard]:
        return self.listed().shards

    def listed(self) -> ListedShards:
        """The open shards and when they were listed; read now when there is no listing or
        it is past its age."""
        listed = self._listed
        if listed is None or (
            self._max_age_s is not None and self._clock() - listed.listed_at_s > self._max_age_s
        ):
            listed = self._keep(self._read())
        return listed

    def offer(self, listed: ListedShards) -> None:
        """A listing read elsewhere, kept when it is newer than this one's and than the last
        reshard noticed here. A listing stamped later than this clock (another host's clock
        ahead of ours) counts as listed now: its age starts here, not minutes from now."""
        now_s = self._clock()
        if listed.listed_at_s > now_s:
            listed = ListedShards(listed.shards, now_s)
        mine = self._listed
        if listed.listed_at_s > self._stale_before_s and (
            mine is None or listed.listed_at_s > mine.listed_at_s
        ):
            self._listed = listed

    def forget(self) -> None:
        """The map is stale (a reshard): read it again next time."""
        self._listed = None
        self._stale_before_s = self._clock()

    def landed_on(self, shard_id: str) -> Shard | None:
        """The shard an aggregate landed on, re-reading the map when it is a new one: the
        aggregate is delivered when the shard's range covers all its members, whatever our
        map said (the KCL takes an aggregate whole or not at all)."""
        listed = self._listed
        known = next((s for s in (listed.shards if listed else ()) if s.shard_id == shard_id), None)
        if known is not None:
            return known
        shards = self._read()
        self._keep(shards)
        return next((s for s in shards if s.shard_id == shard_id), None)

    def _keep(self, shards: list[Shard]) -> ListedShards:
        """``shards``, just read, as the map: the open ones, listed now."""
        listed = self._listed = ListedShards(tuple(open_shards(shards)), self._clock())
        return listed
