"""The rows ``format("keo")`` reads, batch and streaming alike (pure: no pyspark): one per
user record as a KCL consumer sees it, its schema, and KCL's hash-range filter."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from typing import Any, Final

from kinesis_store.kpl import UserRecord
from kinesis_store.shards import Shard, visible_to_kcl

__all__ = ["READ_SCHEMA", "UNFILTERED_READ_SCHEMA", "read_schema", "rows_of"]

READ_SCHEMA: Final = (
    "key string, data binary, shard_id string, sequence_number string, "
    "sub_sequence_number long, approximate_arrival_timestamp timestamp"
)
UNFILTERED_READ_SCHEMA: Final = f"{READ_SCHEMA}, visible_to_kcl boolean"


def read_schema(kcl_filter: bool) -> str:
    """The read's columns: with ``kcl_filter=false``, a ``visible_to_kcl`` column too."""
    return READ_SCHEMA if kcl_filter else UNFILTERED_READ_SCHEMA


def rows_of(
    records: Iterable[UserRecord], shard: Shard, *, kcl_filter: bool
) -> Iterator[tuple[Any, ...]]:
    """One row per user record of ``shard``; with ``kcl_filter``, only those KCL delivers
    (an aggregated user record whose hash key is outside the shard's range is dropped)."""
    for record in records:
        visible = visible_to_kcl(record, shard)
        if kcl_filter:
            if visible:
                yield _row(record)
        else:
            yield (*_row(record), visible)


def _row(record: UserRecord) -> tuple[Any, ...]:
    return (
        record.partition_key,
        record.data,
        record.shard_id,
        record.sequence_number,
        record.sub_sequence_number,
        datetime.fromtimestamp(record.arrival_ms / 1000, tz=UTC),
    )
