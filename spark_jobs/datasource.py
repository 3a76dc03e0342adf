"""The ``keo`` Python data source: ``df.write.format("keo")`` and ``df.writeStream.format("keo")``.

::

    driver (a Python worker of the driver)     executors (one task per partition)
    KeoDataSource.writer/streamWriter            write(rows or Arrow record batches)
      ├─ options checked (WriteOptions)            ├─ streaming, query_name, batch COMPLETE?
      ├─ columns checked against the schema        │     └─ skip: nothing sent, nothing read
      ├─ stream and table exist (stack_for)        ├─ TaskWriter.write          spark_jobs.writer
      └─ replay mode: what a batch write's run_id  ├─ a key unresolved: raise UnresolvedKeysError
         needs read back, read once, shipped       │     (the task fails; Spark retries it, the
                                                   │      claims keep the retry from resending)
                                                   └─ KeoCommitMessage(report)
    commit(messages[, batch_id])
      ├─ settle_batch
      │    ├─ dead letters -> JSON lines            spark_jobs.dead_letters
      │    └─ batch COMPLETE (streaming, with query_name)
      └─ metrics (metrics_port): committed, skipped or failed, rows by outcome
    abort(messages[, batch_id])                    spark_jobs.driver_metrics
      └─ metrics: failed (aborted)

With ``dedupe=replay`` a task is one attempt at the batch's run (``<query_name>/<batch id>``,
or a batch write's ``run_id``, else one per driver execution: :class:`WritePlan` carries the
execution id chosen on the driver), ordered among its task's attempts by ``TaskContext``'s
task attempt id
(:class:`spark_jobs.writer.TaskWriter`, as every task); the commit marks the run COMPLETE, and a
replayed batch whose run is COMPLETE sends nothing (reported skipped).

The executors raise for unresolved keys, not the commit: a failed task is retried on its own,
where a failed commit fails the whole batch. Dead letters come back in the commit messages and
are written by the driver's commit, once per batch, after every task succeeded, by the writer
the sink uses too (:mod:`spark_jobs.dead_letters`:
``<dead_letter_path>/batch=<id>/part-00000.json``, or ``write=<time>-<id>/`` for a batch write;
a replayed batch replaces its own file). The commit runs in a Python process of the driver
without a Spark session, so it writes with plain file calls: a local or mounted folder.

``spark.read.format("keo")`` reads a stream as a KCL consumer would: one input partition per
shard (open and closed), aggregated records split into their user records as the KCL splits
them, and every user record of an aggregate with one outside its shard's range dropped
(``kcl_filter=false`` keeps them, with a ``visible_to_kcl`` column); a malformed aggregate is
read as the KCL reads it, logged and counted (``fail_on_malformed_aggregate=true`` stops the
read at it instead); ``starting_timestamp`` / ``ending_timestamp`` bound the read by
arrival time (it starts at the first record at or after the start, and stops at the first one
after the end, the end of a closed shard, or the tip).

Spark hands the executors a pickled writer; its classes live here, so the executors import this
module (and pyspark) and nothing else of Spark's driver side.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, ClassVar

from pyspark import TaskContext
from pyspark.errors import PySparkNotImplementedError
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    InputPartition,
    SimpleDataSourceStreamReader,
    WriterCommitMessage,
)
from pyspark.sql.types import StringType, StructType

from kinesis_store.shards import Shard
from producer.errors import UnresolvedKeysError
from producer.guarantees import NOTHING_READ, DriverReads, guarantee_of, read_on_driver
from producer.hooks import NO_HOOKS, Hooks
from spark_jobs.batch_read import read_shard, shards_of
from spark_jobs.dead_letters import DeadLetterWriter, LocalFolders
from spark_jobs.driver_metrics import BATCH_WRITE_QUERY, BatchEnd, BatchResult, FailureReason
from spark_jobs.errors import OptionsError
from spark_jobs.options import (
    FORMAT,
    ReadOptions,
    StreamReadOptions,
    WriteOptions,
    flag,
)
from spark_jobs.read_rows import read_schema
from spark_jobs.stream_reader import KeoSimpleStreamReader, KeoStreamReader
from spark_jobs.writer import (
    BatchReport,
    PartitionReport,
    TaskWriter,
    data_is_binary,
    settle_batch,
    stack_for,
    task_attempt_of,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Row

log = logging.getLogger(__name__)

# Spark sets these local properties on a streaming query's tasks.
_BATCH_ID_PROPERTY = "streaming.sql.batchId"
_QUERY_ID_PROPERTY = "sql.streaming.queryId"


# --- what a write knows before it starts -------------------------------------------------------


@dataclass(frozen=True)
class WritePlan:
    """A checked write: options, where the columns are, and the hooks. Picklable."""

    options: WriteOptions
    key_index: int
    data_index: int
    routing_index: int | None
    binary: bool
    hooks: Hooks = NO_HOOKS
    # replay mode: this driver run of the write (a restarted query is another execution)
    execution_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    # what the driver read once for the tasks (producer.guarantees.read_on_driver): its check
    # of the stream and the table, what the runs the write replays would read back, the
    # stream's open shards
    driver: DriverReads = NOTHING_READ

    @classmethod
    def of(cls, raw: Any, schema: StructType, *, overwrite: bool, streaming: bool) -> WritePlan:
        options = WriteOptions.parse(dict(raw), streaming=streaming)
        if overwrite:
            raise OptionsError(
                "format('keo') only appends: a stream cannot be overwritten "
                "(use mode('append'), or outputMode('append') for a streaming write)",
                options=[],
            )
        names = schema.fieldNames()
        key_index = _column(names, options.key_column, "key_column")
        data_index = _column(names, options.data_column, "data_column")
        routing_index = (
            _column(names, options.routing_key_column, "routing_key_column")
            if options.routing_key_column is not None
            else None
        )
        for index, option in ((key_index, "key_column"), (routing_index, "routing_key_column")):
            if index is not None and not isinstance(schema.fields[index].dataType, StringType):
                field = schema.fields[index]
                raise OptionsError(
                    f"format('keo'): {option} {field.name!r} must be a string column, got "
                    f"{field.dataType.simpleString()} (cast it first)",
                    options=[option],
                )
        try:
            binary = data_is_binary(schema, names[data_index])
        except TypeError as exc:
            raise OptionsError(
                f"format('keo'): data_column: {exc}", options=["data_column"]
            ) from exc
        # the stream and the table exist, or the write fails now, once for all its tasks; a
        # batch write's run (run_id): what its tasks would read back, read once here (a
        # streaming query's batch ids are its tasks' to learn; a worker's tasks share theirs)
        driver = read_on_driver(
            stack_for(options.settings),
            runs=[options.run_id] if options.run_id is not None else [],
        )
        return cls(options, key_index, data_index, routing_index, binary, driver=driver)

    def with_hooks(self, hooks: Hooks) -> WritePlan:
        return replace(self, hooks=hooks)

    @property
    def stream(self) -> str:
        return self.options.settings.stream

    def run_of(self, batch_id: int | None) -> str:
        """Replay mode: the run a batch is (``<query_name>/<batch id>``), or a batch write's
        (``run_id``, else one per execution: Spark's task retries are covered, not a re-run)."""
        options = self.options
        if batch_id is not None and options.query_name is not None:
            return f"{options.query_name}/{batch_id}"
        return options.run_id or f"write/{self.execution_id}"


def _column(names: Sequence[str], wanted: str, option: str) -> int:
    """The index of ``wanted`` (exact, else case-insensitive, as Spark resolves names)."""
    if wanted in names:
        return names.index(wanted)
    folded = [i for i, name in enumerate(names) if name.lower() == wanted.lower()]
    if len(folded) == 1:
        return folded[0]
    raise OptionsError(
        f"format('keo'): {option} {wanted!r} is not a column of the data frame; its columns: "
        f"{', '.join(map(repr, names))}",
        options=[option],
    )


# --- the commit message ----------------------------------------------------------------------


@dataclass
class KeoCommitMessage(WriterCommitMessage):
    """One partition's outcome counts and dead letters; ``skipped`` when the batch ledger said
    the batch was complete and nothing was done. ``query_id`` names the query as the task saw
    it (``query_name``, else Spark's query id): the driver's commit has no task to ask."""

    report: PartitionReport
    skipped: bool = False
    query_id: str | None = None


# --- the executor side -----------------------------------------------------------------------


def _rows_of(plan: WritePlan, rows: Iterable[Row]) -> Iterator[tuple[Any, Any, Any]]:
    key, data, routing = plan.key_index, plan.data_index, plan.routing_index
    for row in rows:
        yield row[key], row[data], (row[routing] if routing is not None else None)


def _rows_of_arrow(
    plan: WritePlan, batches: Iterable[pa.RecordBatch]
) -> Iterator[tuple[Any, Any, Any]]:
    for batch in batches:
        keys = batch.column(plan.key_index).to_pylist()
        data = batch.column(plan.data_index).to_pylist()
        routing = (
            batch.column(plan.routing_index).to_pylist()
            if plan.routing_index is not None
            else [None] * batch.num_rows
        )
        yield from zip(keys, data, routing, strict=True)


def _write_partition(plan: WritePlan, rows: Iterator[tuple[Any, Any, Any]]) -> KeoCommitMessage:
    context = TaskContext.get()
    partition = context.partitionId() if context is not None else 0
    batch_property = context.getLocalProperty(_BATCH_ID_PROPERTY) if context else None
    batch_id = int(batch_property) if batch_property is not None else None
    options = plan.options
    stack = stack_for(options.settings, checked=plan.driver.checked)
    query = options.query_name or (
        context.getLocalProperty(_QUERY_ID_PROPERTY) if context else None
    )
    if guarantee_of(stack.settings).done_before(stack, options.query_name, batch_id):
        return KeoCommitMessage(PartitionReport(partition), skipped=True, query_id=query)
    report = TaskWriter(
        settings=options.settings,
        query_id=query or "write",
        batch_id=batch_id,
        run=plan.run_of(batch_id),
        execution_id=plan.execution_id,
        data_is_binary=plan.binary,
        hooks=plan.hooks,
        driver=plan.driver,
    ).write(partition, task_attempt_of(context), rows)
    return KeoCommitMessage(report, skipped=report.skipped, query_id=query)


# --- the driver side -------------------------------------------------------------------------


def _commit(
    plan: WritePlan, messages: Sequence[WriterCommitMessage | None], batch_id: int | None
) -> BatchReport:
    options = plan.options
    stack = stack_for(options.settings, checked=plan.driver.checked)
    parts = [m for m in messages if isinstance(m, KeoCommitMessage)]
    report = BatchReport(options.query_name, batch_id)
    if parts and all(m.skipped for m in parts):
        report.skipped = True
        _count(plan, parts, report, BatchResult.SKIPPED)
        return report
    for message in parts:
        report.add(message.report)
    try:
        settle_batch(
            report,
            stack=stack,
            hooks=plan.hooks,
            # the commit's Python worker has no Spark session: plain file calls
            dead_letters=DeadLetterWriter(options.dead_letter_path, plan.stream, LocalFolders()),
            complete=guarantee_of(stack.settings).completer(
                stack, query=options.query_name, run=plan.run_of(batch_id)
            ),
        )
    except Exception as exc:
        unresolved = isinstance(exc, UnresolvedKeysError)
        reason = FailureReason.UNRESOLVED_KEYS if unresolved else FailureReason.ERROR
        _count(plan, parts, report, BatchResult.FAILED, reason)
        raise
    _count(plan, parts, report, BatchResult.COMMITTED)
    return report


def _abort(
    plan: WritePlan, messages: Sequence[WriterCommitMessage | None], batch_id: int | None
) -> None:
    done = [m for m in messages if isinstance(m, KeoCommitMessage)]
    report = BatchReport(plan.options.query_name, batch_id)
    for message in done:
        report.add(message.report)
    # Spark aborts after a task failed (its message is None) and after the commit raised (every
    # message is there): the commit has counted that failure already
    if len(done) < len(messages):
        _count(plan, done, report, BatchResult.FAILED, FailureReason.ABORTED)
    log.warning(
        "write aborted stream=%s query=%s batch=%s partitions_done=%d sent=%d: a replay "
        "resolves the rest %s",
        plan.stream,
        plan.options.query_name,
        batch_id,
        len(done),
        report.counts["sent"],
        guarantee_of(plan.options.settings).settles_the_rest,
    )


def _count(
    plan: WritePlan,
    parts: Sequence[KeoCommitMessage],
    report: BatchReport,
    result: BatchResult,
    reason: FailureReason | None = None,
) -> None:
    """The batch's end in the driver's metrics, when the write has a ``metrics_port``."""
    metrics = plan.options.metrics
    if metrics is None:
        return
    carried = next((m.query_id for m in parts if m.query_id), None)
    streaming = "unnamed" if report.batch_id is not None else BATCH_WRITE_QUERY
    metrics.record(
        BatchEnd(
            query=plan.options.query_name or carried or streaming,
            stream=plan.stream,
            result=result,
            counts={} if report.skipped else report.counts,
            reason=reason,
            producer_counts=report.producer_counts,
        )
    )


class _Writes:
    """The commit and the abort the four writer classes share. One signature serves both
    kinds: Spark calls a batch writer's ``commit(messages)`` and a streaming writer's
    ``commit(messages, batch_id)``."""

    def __init__(self, plan: WritePlan) -> None:
        self.plan = plan

    def deliver(self, rows: Iterator[tuple[Any, Any, Any]]) -> WriterCommitMessage:
        """One partition's ``(key, data, routing_key)`` rows, however Spark handed them over."""
        return _write_partition(self.plan, rows)

    def commit(
        self,
        messages: list[WriterCommitMessage | None],
        batchId: int | None = None,  # noqa: N803 - Spark's name
    ) -> None:
        _commit(self.plan, messages, batchId)

    def abort(
        self,
        messages: list[WriterCommitMessage | None],
        batchId: int | None = None,  # noqa: N803 - Spark's name
    ) -> None:
        _abort(self.plan, messages, batchId)


class _RowWrites(_Writes):
    def write(self, iterator: Iterator[Row]) -> WriterCommitMessage:
        return self.deliver(_rows_of(self.plan, iterator))


class _ArrowWrites(_Writes):
    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return self.deliver(_rows_of_arrow(self.plan, iterator))


class KeoRowWriter(_RowWrites, DataSourceWriter):
    """``df.write`` with ``arrow=false``: Spark rows."""


class KeoArrowWriter(_ArrowWrites, DataSourceArrowWriter):
    """``df.write``: Arrow record batches."""


class KeoRowStreamWriter(_RowWrites, DataSourceStreamWriter):
    """``df.writeStream`` with ``arrow=false``: Spark rows."""


class KeoArrowStreamWriter(_ArrowWrites, DataSourceStreamArrowWriter):
    """``df.writeStream``: Arrow record batches."""


# --- reading ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ShardPartition(InputPartition):
    """One shard: the unit of a read."""

    shard: Shard


class KeoReader(DataSourceReader):
    def __init__(self, options: ReadOptions) -> None:
        self.options = options

    def partitions(self) -> list[ShardPartition]:
        """Every shard the stream still has, open and closed (listed on the driver)."""
        return [ShardPartition(shard) for shard in shards_of(self.options)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """The shard's rows as Arrow record batches (:func:`spark_jobs.batch_read.read_shard`,
        which :func:`spark_jobs.batch_read.read_records` runs too)."""
        if not isinstance(partition, ShardPartition):
            raise TypeError(f"not a partition of format('keo'): {partition!r}")
        return read_shard(self.options, partition.shard)


# --- the format ------------------------------------------------------------------------------


class KeoDataSource(DataSource):
    """``format("keo")``. ``hooks`` is the test seam; :func:`register_source` binds it."""

    hooks: ClassVar[Hooks] = NO_HOOKS
    # the writer classes, replaceable by a subclass (devstack.spark_bench counts rows instead)
    arrow_writer: ClassVar[type[KeoArrowWriter]] = KeoArrowWriter
    row_writer: ClassVar[type[KeoRowWriter]] = KeoRowWriter
    arrow_stream_writer: ClassVar[type[KeoArrowStreamWriter]] = KeoArrowStreamWriter
    row_stream_writer: ClassVar[type[KeoRowStreamWriter]] = KeoRowStreamWriter

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        return read_schema(flag("kcl_filter", self.options.get("kcl_filter", "true")))

    def reader(self, schema: StructType) -> DataSourceReader:  # noqa: ARG002 - fixed schema
        return KeoReader(ReadOptions.parse(dict(self.options)))

    def streamReader(  # noqa: N802 - Spark's name
        self,
        schema: StructType,  # noqa: ARG002 - fixed schema
    ) -> DataSourceStreamReader:
        options = StreamReadOptions.parse(dict(self.options))
        if options.simple_reader:
            # Spark asks simpleStreamReader when this one says it is not implemented
            raise PySparkNotImplementedError(
                errorClass="NOT_IMPLEMENTED",
                messageParameters={"feature": "streamReader with simple_reader=true"},
            )
        return KeoStreamReader(options)

    def simpleStreamReader(  # noqa: N802 - Spark's name
        self,
        schema: StructType,  # noqa: ARG002 - fixed schema
    ) -> SimpleDataSourceStreamReader:
        return KeoSimpleStreamReader(StreamReadOptions.parse(dict(self.options)))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        plan = WritePlan.of(self.options, schema, overwrite=overwrite, streaming=False)
        plan = plan.with_hooks(self.hooks)
        return self.arrow_writer(plan) if plan.options.arrow else self.row_writer(plan)

    def streamWriter(  # noqa: N802 - Spark's name
        self, schema: StructType, overwrite: bool
    ) -> DataSourceStreamWriter:
        plan = WritePlan.of(self.options, schema, overwrite=overwrite, streaming=True)
        plan = plan.with_hooks(self.hooks)
        if plan.options.arrow:
            return self.arrow_stream_writer(plan)
        return self.row_stream_writer(plan)


def register_source(spark: Any, *, hooks: Hooks = NO_HOOKS) -> None:
    """Register ``format("keo")``; with hooks, as a subclass that carries them (pickled by
    value with the class, so they reach the executors and the commits)."""
    source: type[KeoDataSource] = KeoDataSource
    if hooks is not NO_HOOKS:
        source = type("KeoDataSourceWithHooks", (KeoDataSource,), {"hooks": hooks})
    spark.dataSource.register(source)
