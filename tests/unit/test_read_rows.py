"""The rows ``format("keo")`` reads, as tuples and as Arrow record batches: the same rows in the
same order, and batches whose schema is the one Spark expects of the read schema (pyspark's
types and conversion imported, no Spark started)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

pytest.importorskip("pyspark.sql.pandas.types")

from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from kinesis_store.kpl import UserRecord
from kinesis_store.shards import Shard
from spark_jobs.read_rows import (
    READ_SCHEMA,
    arrow_batches_of,
    arrow_read_schema,
    rows_of,
)

HALF = 2**127
SHARD = Shard("shardId-000000000001", 0, HALF - 1, None, None, "1", None)


def record(index: int, *, aggregated: bool = False, hash_key: int | None = None) -> UserRecord:
    return UserRecord(
        SHARD.shard_id,
        f"key-{index}",
        f"data {index}".encode(),
        f"{1000 + index}",
        index if aggregated else None,
        None if hash_key is None else str(hash_key),
        1_714_566_615_250 + index,
    )


def records() -> list[UserRecord]:
    """Plain records, aggregated ones, and one aggregated outside the shard (KCL drops it)."""
    return [
        record(0),
        record(1, aggregated=True, hash_key=5),
        record(2, aggregated=True, hash_key=HALF + 5),
        record(3),
        record(4, aggregated=True, hash_key=7),
    ]


def spark_schema(kcl_filter: bool) -> StructType:
    """The read schema as Spark parses ``READ_SCHEMA`` (and the visible_to_kcl column)."""
    fields = [
        StructField("key", StringType()),
        StructField("data", BinaryType()),
        StructField("shard_id", StringType()),
        StructField("sequence_number", StringType()),
        StructField("sub_sequence_number", LongType()),
        StructField("approximate_arrival_timestamp", TimestampType()),
    ]
    if not kcl_filter:
        fields.append(StructField("visible_to_kcl", BooleanType()))
    return StructType(fields)


@pytest.mark.parametrize("kcl_filter", [True, False])
def test_batches_have_the_arrow_schema_spark_expects_of_the_read_schema(kcl_filter: bool) -> None:
    assert [field.name for field in spark_schema(True)] == [
        part.split()[0] for part in READ_SCHEMA.split(", ")
    ]
    expected = to_arrow_schema(spark_schema(kcl_filter), timezone="UTC")
    assert arrow_read_schema(kcl_filter).equals(expected)


@pytest.mark.parametrize("kcl_filter", [True, False])
def test_batches_hold_the_rows_tuples_hold_in_the_same_order(kcl_filter: bool) -> None:
    # GIVEN a shard's records, one of them outside its hash range
    read = records()
    # WHEN they are read as batches of two rows and as tuples
    batches = list(arrow_batches_of(read, SHARD, kcl_filter=kcl_filter, rows_per_batch=2))
    rows = list(rows_of(read, SHARD, kcl_filter=kcl_filter))
    # THEN the batches hold the same rows, at most two a batch
    assert [batch.num_rows for batch in batches] == ([2, 2] if kcl_filter else [2, 2, 1])
    as_rows = [tuple(row.values()) for batch in batches for row in batch.to_pylist()]
    assert as_rows == rows
    assert as_rows[0][5] == datetime(2024, 5, 1, 12, 30, 15, 250_000, tzinfo=UTC)


def test_no_record_makes_no_batch() -> None:
    assert list(arrow_batches_of([], SHARD, kcl_filter=True)) == []
    assert (
        list(arrow_batches_of([record(2, aggregated=True, hash_key=HALF)], SHARD, kcl_filter=True))
        == []
    )
