"""``spark.readStream.format("keo")``: a stream read as a KCL consumer would, its offsets in
Spark's checkpoint (nothing in DynamoDB), each batch's end fixed before it runs.

::

    driver (one Python process per query, for its life)   executors (one task per shard)
    initialOffset()     a new query: shards at starting_position      read(ShardRangePartition)
    latestOffset(start, limit)                                           ├─ AFTER start (checked:
      ├─ the checkpoint's offset is this stream's?                      │   past the trim horizon?)
      ├─ shards listed: new ones added, children after parents          ├─ up to the planned end,
      └─ each shard's end: its tail, or counted to the limit            │   or a closed shard's end
    partitions(start, end)  one range per shard that moved (pure)       └─ deaggregated, KCL filter
    prepareForTriggerAvailableNow()  each shard's end now is the last

The driver's decisions are :class:`spark_jobs.stream_planner.StreamPlanner`'s; the offsets'
format and the plan are :mod:`spark_jobs.stream_offsets`. Spark pickles this reader to the
executors with its ``read``: it holds options only, and builds its clients where it runs.

Every GetRecords of a process (the driver's planner, a Python worker's tasks) goes through
one :class:`kinesis_store.read_pacing.ReadPacer`: at most 4 calls and 1.8 MiB a second per
shard from it, room left for another consumer of the shard. A task gives Spark its rows as Arrow record batches
(:func:`spark_jobs.read_rows.arrow_batches_of`), not tuples Spark would convert one value at a
time. With ``metrics_port``, each task counts the range it read
(:meth:`spark_jobs.driver_metrics.MetricsEndpoint.record_read`): rows and bytes by shard, and
how far behind the shard's tip its read ended; and the driver, as it plans a batch, how far
behind its tail each shard's batch starts (:meth:`~spark_jobs.driver_metrics.MetricsEndpoint.record_lags`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import (
    DataSourceStreamReader,
    InputPartition,
    SimpleDataSourceStreamReader,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from dedupe_store.clock import SystemClock
from kinesis_store.kpl import UserRecord
from kinesis_store.read_pacing import process_read_pacer
from kinesis_store.reader import KinesisReader
from producer.clients import kinesis_read_client
from spark_jobs.driver_metrics import STREAM_READ_QUERY, PlannedLag, ShardRead
from spark_jobs.options import StreamReadOptions
from spark_jobs.read_rows import arrow_batches_of, malformed_aggregate_policy, rows_of
from spark_jobs.stream_offsets import ShardRange, StreamOffset
from spark_jobs.stream_planner import Budget, StreamPlanner, lost_records_policy

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["KeoSimpleStreamReader", "KeoStreamReader", "ShardRangePartition"]

# ReadMaxRows for "no bound in all": only max_records_per_shard_per_trigger was given
_NO_TOTAL = 2**63 - 1


@dataclass(frozen=True)
class ShardRangePartition(InputPartition):
    """One shard's records in one batch: the unit of a streaming read."""

    range: ShardRange


class KeoStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: StreamReadOptions) -> None:
        self.options = options
        self._planner: StreamPlanner | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_planner": None}  # clients are built where the reader runs

    def _kinesis(self) -> KinesisReader:
        settings = self.options.settings
        return KinesisReader(
            kinesis_read_client(settings),
            settings.stream,
            pacer=process_read_pacer(),
            on_malformed=malformed_aggregate_policy(
                self.options.fail_on_malformed_aggregate, settings.stream
            ),
        )

    @property
    def planner(self) -> StreamPlanner:
        if self._planner is None:
            settings = self.options.settings
            self._planner = StreamPlanner(
                self._kinesis(),
                SystemClock(),
                starting_position=self.options.starting_position,
                fail_on_data_loss=self.options.fail_on_data_loss,
                margin_ms=round(settings.clock_skew_s * 1000),
            )
        return self._planner

    # --- the driver --------------------------------------------------------------------------

    def initialOffset(self) -> dict[str, Any]:  # noqa: N802 - Spark's name
        return self.planner.initial().as_json()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:  # noqa: N802 - Spark's name
        planner = self.planner
        end = planner.latest(planner.parse(start), self._budget(limit))
        if self.options.metrics is not None:
            self.options.metrics.record_lags(
                PlannedLag(
                    query=self.options.query_name or STREAM_READ_QUERY,
                    stream=planner.stream,
                    millis_behind=planner.lags_ms,
                )
            )
        return end.as_json()

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802 - Spark's name
        total = self.options.max_records_per_trigger
        if total is not None:
            return ReadMaxRows(total)
        if self.options.max_records_per_shard_per_trigger is not None:
            return ReadMaxRows(_NO_TOTAL)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802 - Spark's name
        self.planner.freeze()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        planner = self.planner
        ranges = planner.ranges(planner.parse(start), planner.parse(end))
        return [ShardRangePartition(shard_range) for shard_range in ranges]

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: the offsets live in Spark's checkpoint, and Kinesis keeps records
        for the stream's retention whatever is read."""

    def default_budget(self) -> Budget | None:
        """The options' own limit on a batch (what Spark asks for without a trigger's)."""
        return self._budget(self.getDefaultReadLimit())

    def _budget(self, limit: ReadLimit) -> Budget | None:
        """Spark's limit for this batch: ReadAllAvailable (``Trigger.Once``, or no option)
        reads everything, whatever the options say."""
        per_shard = self.options.max_records_per_shard_per_trigger
        if isinstance(limit, ReadMaxRows):
            total = limit.max_rows if limit.max_rows < _NO_TOTAL else None
            if total is None and per_shard is None:
                return None
            return Budget(total, per_shard)
        return None

    # --- the executors -----------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        shard_range = _range_of(partition)
        if shard_range is None:
            return
        kinesis = self._kinesis()
        rows = data_bytes = 0
        for batch in arrow_batches_of(
            self._records(kinesis, shard_range),
            shard_range.shard,
            kcl_filter=self.options.kcl_filter,
        ):
            rows += batch.num_rows
            data_bytes += batch.column(1).total_values_length  # the data column's
            yield batch
        self._count(kinesis, shard_range, rows, data_bytes)

    def rows(self, shard_range: ShardRange) -> Iterator[tuple[Any, ...]]:
        """One range's rows as tuples, counted as :meth:`read` counts them."""
        kinesis = self._kinesis()
        rows = data_bytes = 0
        for row in rows_of(
            self._records(kinesis, shard_range),
            shard_range.shard,
            kcl_filter=self.options.kcl_filter,
        ):
            rows += 1
            data_bytes += len(row[1])
            yield row
        self._count(kinesis, shard_range, rows, data_bytes)

    def _records(self, kinesis: KinesisReader, shard_range: ShardRange) -> Iterator[UserRecord]:
        return kinesis.read_range(
            shard_range.shard.shard_id,
            shard_range.start,
            shard_range.through,
            on_lost=lost_records_policy(self.options.fail_on_data_loss),
        )

    def _count(
        self, kinesis: KinesisReader, shard_range: ShardRange, rows: int, data_bytes: int
    ) -> None:
        if self.options.metrics is None:
            return
        shard_id = shard_range.shard.shard_id
        self.options.metrics.record_read(
            ShardRead(
                query=self.options.query_name or STREAM_READ_QUERY,
                stream=kinesis.stream,
                shard_id=shard_id,
                records=rows,
                data_bytes=data_bytes,
                millis_behind_latest=kinesis.shard_reads(shard_id).millis_behind_latest,
                malformed_aggregates=kinesis.shard_reads(shard_id).malformed_aggregates,
            )
        )


def _range_of(partition: InputPartition) -> ShardRange | None:
    """The range a partition reads; None for Spark's placeholder of a batch that planned no
    range."""
    if isinstance(partition, ShardRangePartition):
        return partition.range
    if getattr(partition, "value", None) is None:
        return None
    raise TypeError(f"not a partition of format('keo'): {partition!r}")


class KeoSimpleStreamReader(SimpleDataSourceStreamReader):
    """``simple_reader=true``: the driver reads each batch itself, in its one Python process,
    with no task per shard: for a stream of a few shards and small batches, where scheduling a
    task per shard costs more than its read. Offsets, limits (the options', not a trigger's),
    resharding and the replay of a batch are the partitioned reader's: this one plans with it
    and reads its ranges one after another."""

    def __init__(self, options: StreamReadOptions) -> None:
        self._reader = KeoStreamReader(options)

    def initialOffset(self) -> dict[str, Any]:  # noqa: N802 - Spark's name
        return self._reader.initialOffset()

    def read(self, start: dict[str, Any]) -> tuple[Iterator[tuple[Any, ...]], dict[str, Any]]:
        planner = self._reader.planner
        first = planner.parse(start)
        end = planner.latest(first, self._reader.default_budget())
        return self._rows(first, end), end.as_json()

    def readBetweenOffsets(  # noqa: N802 - Spark's name
        self, start: dict[str, Any], end: dict[str, Any]
    ) -> Iterator[tuple[Any, ...]]:
        planner = self._reader.planner
        return self._rows(planner.parse(start), planner.parse(end))

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: the offsets live in Spark's checkpoint."""

    def _rows(self, start: StreamOffset, end: StreamOffset) -> Iterator[tuple[Any, ...]]:
        """Every range's rows, read now (Spark keeps a batch's rows for its replay in the same
        driver, and copies the iterator it is given)."""
        rows = [
            row
            for shard_range in self._reader.planner.ranges(start, end)
            for row in self._reader.rows(shard_range)
        ]
        return iter(rows)
