"""The rows ``format("keo")`` reads, batch and streaming alike (pure: no pyspark): one per
user record as a KCL consumer sees it, its schema, and KCL's hash-range filter (an aggregate
is delivered whole or not at all: :func:`kinesis_store.shards.kcl_view`); what a read does at
a malformed aggregate (:func:`malformed_aggregate_policy`).

The same rows come as tuples (:func:`rows_of`) or as Arrow record batches
(:func:`arrow_batches_of`, the schema Spark expects of a Python data source's batches:
:func:`arrow_read_schema`). Spark converts tuples to Arrow in the Python worker; a batch built
column by column here goes to the JVM as it is. The saving is small for these columns (about
0.03 s of a 25,000-record shard's read, docs/performance.md). pyarrow is imported where a
batch is built: executors have it, the CLI need not.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from functools import partial
from typing import TYPE_CHECKING, Any, Final

from kinesis_store.kpl import MalformedAggregate, UserRecord
from kinesis_store.reader import stop_on_malformed
from kinesis_store.shards import Shard, kcl_view
from producer import metrics

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "ARROW_BATCH_ROWS",
    "READ_SCHEMA",
    "UNFILTERED_READ_SCHEMA",
    "arrow_batches_of",
    "arrow_read_schema",
    "malformed_aggregate_policy",
    "read_schema",
    "rows_of",
]

READ_SCHEMA: Final = (
    "key string, data binary, shard_id string, sequence_number string, "
    "sub_sequence_number long, approximate_arrival_timestamp timestamp"
)
UNFILTERED_READ_SCHEMA: Final = f"{READ_SCHEMA}, visible_to_kcl boolean"
# Spark's own default for a Python data source's batches (spark.sql.execution.arrow.maxRecordsPerBatch)
ARROW_BATCH_ROWS: Final = 10_000


def read_schema(kcl_filter: bool) -> str:
    """The read's columns: with ``kcl_filter=false``, a ``visible_to_kcl`` column too."""
    return READ_SCHEMA if kcl_filter else UNFILTERED_READ_SCHEMA


def rows_of(
    records: Iterable[UserRecord], shard: Shard, *, kcl_filter: bool
) -> Iterator[tuple[Any, ...]]:
    """One row per user record of ``shard``; with ``kcl_filter``, only those KCL delivers
    (every member of an aggregate with a member outside the shard's range is dropped)."""
    for record, visible in kcl_view(records, shard):
        if kcl_filter:
            if visible:
                yield _row(record)
        else:
            yield (*_row(record), visible)


def malformed_aggregate_policy(fail: bool, stream: str) -> Callable[[MalformedAggregate], None]:
    """A reader's ``on_malformed`` for ``format("keo")`` (``fail_on_malformed_aggregate``):
    count the malformed aggregate and go on as the KCL does, or count it and stop the read
    (:class:`kinesis_store.errors.AggregationFormatError`). Picklable."""
    return partial(_on_malformed, fail, stream)


def _on_malformed(fail: bool, stream: str, fault: MalformedAggregate) -> None:
    metrics.count_malformed(stream)(fault)
    if fail:
        stop_on_malformed(fault)


def _row(record: UserRecord) -> tuple[Any, ...]:
    return (
        record.partition_key,
        record.data,
        record.shard_id,
        record.sequence_number,
        record.sub_sequence_number,
        datetime.fromtimestamp(record.arrival_ms / 1000, tz=UTC),
    )


def arrow_read_schema(kcl_filter: bool) -> pa.Schema:
    """:func:`read_schema` in Arrow, as Spark converts it for a Python data source (times in
    UTC, microseconds); Spark refuses a batch whose schema differs."""
    import pyarrow as pa

    fields = [
        pa.field("key", pa.string()),
        pa.field("data", pa.binary()),
        pa.field("shard_id", pa.string()),
        pa.field("sequence_number", pa.string()),
        pa.field("sub_sequence_number", pa.int64()),
        pa.field("approximate_arrival_timestamp", pa.timestamp("us", tz="UTC")),
    ]
    if not kcl_filter:
        fields.append(pa.field("visible_to_kcl", pa.bool_()))
    return pa.schema(fields)


def arrow_batches_of(
    records: Iterable[UserRecord],
    shard: Shard,
    *,
    kcl_filter: bool,
    rows_per_batch: int = ARROW_BATCH_ROWS,
) -> Iterator[pa.RecordBatch]:
    """:func:`rows_of` as Arrow record batches of up to ``rows_per_batch`` rows (none when
    there is no row), in the same order, built column by column."""
    import pyarrow as pa

    if rows_per_batch < 1:
        raise ValueError(f"rows_per_batch must be at least 1, got {rows_per_batch}")
    schema = arrow_read_schema(kcl_filter)
    columns: list[list[Any]] = [[] for _ in schema]
    keys, data, shard_ids, sequence_numbers, sub_sequence_numbers, arrivals_us = columns[:6]
    visibles = columns[6] if not kcl_filter else []

    def batch() -> pa.RecordBatch:
        built = pa.RecordBatch.from_arrays(
            [
                pa.array(column, type=field.type)
                for column, field in zip(columns, schema, strict=True)
            ],
            schema=schema,
        )
        for column in columns:
            column.clear()
        return built

    for record, visible in kcl_view(records, shard):
        if kcl_filter and not visible:
            continue
        keys.append(record.partition_key)
        data.append(record.data)
        shard_ids.append(record.shard_id)
        sequence_numbers.append(record.sequence_number)
        sub_sequence_numbers.append(record.sub_sequence_number)
        arrivals_us.append(record.arrival_ms * 1000)
        if not kcl_filter:
            visibles.append(visible)
        if len(keys) >= rows_per_batch:
            yield batch()
    if keys:
        yield batch()
