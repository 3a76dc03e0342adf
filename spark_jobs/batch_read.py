"""A stream's user records as a DataFrame, on every Spark this package supports (3.5 and 4.x,
classic or Spark Connect): :func:`read_records`, what ``spark.read.format("keo")`` reads (which
needs Spark 4's Python data sources), built with ``mapInArrow`` over the stream's shards.

::

    driver                                     executors (one task per shard)
    read_records(spark, stream=..., ...)
      ├─ ReadOptions.parse: checked once         read_shard(options, shard)
      ├─ the shards, listed once ────────────>     ├─ the shard from its trim horizon (or the
      └─ spark.range(shards).mapInArrow(...)       │  starting_timestamp .. ending_timestamp window)
                                                   └─ Arrow record batches: each user record
                                                      as a KCL consumer sees it (read_rows)

``format("keo")``'s reader runs :func:`read_shard` too, so both read the same rows in the same
order. Nothing here imports pyspark.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from functools import partial
from typing import TYPE_CHECKING, Any

from kinesis_store.kpl import UserRecord
from kinesis_store.read_pacing import process_read_pacer
from kinesis_store.reader import KinesisReader
from kinesis_store.shards import Shard
from producer.clients import kinesis_client, kinesis_read_client
from spark_jobs.options import ReadOptions
from spark_jobs.read_rows import arrow_batches_of, malformed_aggregate_policy, read_schema

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["read_records", "read_shard", "shards_of"]


def read_records(spark: Any, options: Mapping[str, Any] | None = None, **more: Any) -> Any:
    """Every user record of a stream, one row per record as a KCL consumer reads it, as a
    DataFrame of ``spark.read.format("keo")``'s columns (``read_schema``); one task per shard.

    ``options`` and ``more`` are ``format("keo")``'s read options: ``stream`` and every other
    ``KEO_*`` setting in lower case (``kinesis_endpoint_url``, ``region``), ``starting_timestamp``
    and ``ending_timestamp`` (ISO 8601 or a ``datetime``), ``kcl_filter`` (default true: only
    what KCL delivers; false keeps the rest, with a ``visible_to_kcl`` column) and
    ``fail_on_malformed_aggregate``. Checked here, on the driver
    (:class:`spark_jobs.errors.OptionsError`), before any task runs.

    Example::

        frame = read_records(spark, stream="orders", starting_timestamp="2026-11-27T00:00:00Z")
    """
    raw = {**(options or {}), **more}
    # an option given as None is left unset
    texts = {name: _option_text(value) for name, value in raw.items() if value is not None}
    checked = ReadOptions.parse(texts)
    shards = shards_of(checked)
    # one task per shard: the shard's index is the task's only input row
    tasks = max(len(shards), 1)
    indices = spark.range(0, len(shards), 1, tasks)
    return indices.mapInArrow(
        partial(_read_shards, checked, tuple(shards)), read_schema(checked.kcl_filter)
    )


def shards_of(options: ReadOptions) -> list[Shard]:
    """Every shard the stream still has, open and closed (listed once, on the driver)."""
    settings = options.settings
    return KinesisReader(kinesis_client(settings, for_put=False), settings.stream).shards()


def read_shard(options: ReadOptions, shard: Shard) -> Iterator[pa.RecordBatch]:
    """On an executor: ``shard``'s rows as Arrow record batches (Spark would convert tuples
    value by value)."""
    settings = options.settings
    reader = KinesisReader(
        kinesis_read_client(settings),
        settings.stream,
        pacer=process_read_pacer(),
        on_malformed=malformed_aggregate_policy(
            options.fail_on_malformed_aggregate, settings.stream
        ),
    )
    records = _records(options, reader, shard.shard_id)
    yield from arrow_batches_of(records, shard, kcl_filter=options.kcl_filter)


def _records(options: ReadOptions, reader: KinesisReader, shard_id: str) -> Iterator[UserRecord]:
    starting, ending = options.starting_ms, options.ending_ms
    if starting is None and ending is None:
        return reader.read_all(shard_id)
    end_ms = ending if ending is not None else options.planned_ms

    def window_closed() -> int:
        return end_ms + 1  # a read of what has arrived: never wait for late arrivals

    return reader.read_window(shard_id, starting or 0, end_ms, now_ms=window_closed)


def _read_shards(
    options: ReadOptions, shards: Sequence[Shard], indices: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    for batch in indices:
        for index in batch.column(0).to_pylist():
            yield from read_shard(options, shards[index])


def _option_text(value: Any) -> str:
    """An option as Spark would hand it over: text (``True`` -> ``"true"``, a datetime in ISO
    8601)."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)
