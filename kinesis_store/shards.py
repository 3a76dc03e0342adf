"""A stream's shards as plain data: hash ranges, lineage through reshards, what the stream
says of itself, and which user records a KCL consumer of a shard sees. No I/O:
:class:`kinesis_store.reader.KinesisReader` reads them from Kinesis.

A key's hash key routes it to the one open shard whose range covers it. After splits and
merges, every shard, open or closed, whose range covers the hash key is in the key's lineage:
a record of that key may sit in any of them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kinesis_store.entries import hash_key_of

if TYPE_CHECKING:
    from kinesis_store.kpl import UserRecord

__all__ = ["OpenShards", "Shard", "StreamInfo", "lineage", "open_shards", "visible_to_kcl"]


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


def visible_to_kcl(record: UserRecord, shard: Shard) -> bool:
    """KCL drops deaggregated user records whose hash key is outside the shard's range:
    such a record was written but is never delivered, so it does not count."""
    if not record.aggregated:
        return True
    hash_key = (
        int(record.explicit_hash_key)
        if record.explicit_hash_key
        else hash_key_of(record.partition_key)
    )
    return shard.covers(hash_key)


class OpenShards:
    """The stream's open shards as last read, for packing user records per shard. Read on
    first use and again after a reshard is noticed (:meth:`forget`, :meth:`landed_on`)."""

    def __init__(self, read: Callable[[], list[Shard]]) -> None:
        self._read = read
        self._open: list[Shard] | None = None

    def current(self) -> list[Shard]:
        shards = self._open
        if shards is None:
            shards = self._open = open_shards(self._read())
        return shards

    def forget(self) -> None:
        """The map is stale (a reshard): read it again next time."""
        self._open = None

    def landed_on(self, shard_id: str) -> Shard | None:
        """The shard an aggregate landed on, re-reading the map when it is a new one: the
        aggregate is delivered when the shard's range covers all its members, whatever our
        map said (the KCL takes an aggregate whole or not at all)."""
        known = next((s for s in self._open or [] if s.shard_id == shard_id), None)
        if known is not None:
            return known
        shards = self._read()
        self._open = open_shards(shards)
        return next((s for s in shards if s.shard_id == shard_id), None)
