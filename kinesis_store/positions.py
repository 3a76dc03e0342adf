"""Positions in a shard, as plain data: where a read starts, the last record a read saw, and
what counting records forward found. No I/O: :class:`kinesis_store.reader.KinesisReader`
turns a :class:`ShardStart` into a shard iterator.

Sequence numbers are unique per shard only and grow within it; they are compared as integers
(:func:`sequence_key`), never as strings.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

__all__ = ["Counted", "SeenRecord", "ShardStart", "StartKind", "sequence_key"]


def sequence_key(sequence_number: str) -> int:
    """A sequence number's place in its shard."""
    return int(sequence_number)


class StartKind(StrEnum):
    TRIM_HORIZON = "trim_horizon"  # the oldest record the shard still holds
    AT_TIMESTAMP = "at_timestamp"  # the first record that arrived at or after a time
    AFTER_SEQUENCE_NUMBER = "after_sequence_number"  # right after a record already read


@dataclass(frozen=True, slots=True)
class ShardStart:
    """Where a read of one shard starts (exclusive of ``sequence_number``).

    ``timestamp_ms`` is the time of an AT_TIMESTAMP start; after a sequence number, that
    record's arrival time when known (it bounds how far back the tail of the shard is looked
    for, and says since when records are missing if the record was trimmed).
    """

    kind: StartKind
    sequence_number: str | None = None
    timestamp_ms: int | None = None

    def __post_init__(self) -> None:
        if (self.kind is StartKind.AFTER_SEQUENCE_NUMBER) != (self.sequence_number is not None):
            raise ValueError(f"a {self.kind} start takes a sequence number only after one")
        if self.kind is StartKind.AT_TIMESTAMP and self.timestamp_ms is None:
            raise ValueError("an at_timestamp start needs its time")

    @classmethod
    def trim_horizon(cls) -> ShardStart:
        return cls(StartKind.TRIM_HORIZON)

    @classmethod
    def at_timestamp(cls, timestamp_ms: int) -> ShardStart:
        return cls(StartKind.AT_TIMESTAMP, timestamp_ms=timestamp_ms)

    @classmethod
    def after(cls, sequence_number: str, arrival_ms: int | None = None) -> ShardStart:
        return cls(StartKind.AFTER_SEQUENCE_NUMBER, sequence_number, arrival_ms)

    def iterator_arguments(self) -> dict[str, Any]:
        """GetShardIterator's arguments for this start (AFTER_SEQUENCE_NUMBER as given: the
        reader checks a resumed position is still there with AT_SEQUENCE_NUMBER itself)."""
        if self.kind is StartKind.AT_TIMESTAMP and self.timestamp_ms is not None:
            moment = datetime.fromtimestamp(self.timestamp_ms / 1000, tz=UTC)
            return {"ShardIteratorType": "AT_TIMESTAMP", "Timestamp": moment}
        if self.kind is StartKind.AFTER_SEQUENCE_NUMBER:
            return {
                "ShardIteratorType": "AFTER_SEQUENCE_NUMBER",
                "StartingSequenceNumber": self.sequence_number,
            }
        return {"ShardIteratorType": "TRIM_HORIZON"}

    def is_before(self, sequence_number: str) -> bool:
        """Whether the record ``sequence_number`` comes after this start (a timestamp start
        cannot tell: records are compared by position, so it says yes)."""
        if self.sequence_number is None:
            return True
        return sequence_key(sequence_number) > sequence_key(self.sequence_number)


@dataclass(frozen=True, slots=True)
class SeenRecord:
    """A Kinesis record a read saw: its sequence number and arrival time."""

    sequence_number: str
    arrival_ms: int


@dataclass(frozen=True, slots=True)
class Counted:
    """What counting a shard's records forward from a start found.

    ``last`` is the last Kinesis record taken (None: none), ``user_records`` how many user
    records those held (an aggregate counts its user records), ``ended`` that the shard is
    closed and was read to its end, ``full`` that the count stopped because the next record
    did not fit (the shard holds more).
    """

    last: SeenRecord | None
    user_records: int
    ended: bool
    full: bool
