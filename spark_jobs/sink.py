"""``ExactlyOnceSink``: a ``foreachBatch`` sink that delivers every row of a micro-batch into
Kinesis exactly once: per key (``dedupe="key"``, the default, through
:class:`producer.key.producer.ExactlyOnceProducer`), or per replay of the batch
(``dedupe="replay"``, through :class:`producer.replay.producer.ReplayProducer`).

::

    sink(df, batch_id)                                       on the driver
      ├─ key mode: batch (stream, query_id, batch_id) COMPLETE? ── skip all per-key work
      ├─ replay mode, a replayed batch: its recovery read here, once (Guarantee.plan_recovery;
      │     an earlier execution that may still put is superseded and waited for first), and
      │     shipped to the tasks, which read nothing
      ├─ rdd.mapPartitionsWithIndex(TaskWriter)               on the executors
      │     ├─ key: producer.send(rows) ── one PartitionReport per partition, to the driver
      │     └─ replay: one attempt at run <query_id>/<batch_id> (a COMPLETE run sends nothing);
      │        a row unresolved fails the task: Spark retries it, the retry finds what was put
      ├─ settle_batch                                         spark_jobs.writer
      │     ├─ dead letters (REJECTED, CONFLICT) ── <dead_letter>/batch=<id>/part-00000.json,
      │     │     through the session's Hadoop file system (spark_jobs.dead_letters)
      │     ├─ any key unresolved (IN_FLIGHT, FAILED, TAKEN_OVER, UNVERIFIABLE)
      │     │     └─ raise UnresolvedKeysError: Spark retries the batch, the per-key claims decide
      │     └─ mark the batch COMPLETE (key: the batch ledger; replay: the run item)
      └─ metrics_port: the batch's end counted, as format("keo")'s commit counts it

Replays are safe at every step: a batch replayed after a crash re-runs the per-key protocol
(already delivered keys come back DUPLICATE, nothing is sent again), or in replay mode reads
back what the batch's earlier attempts put and sends the rest; only a batch that settled every
row is marked COMPLETE. Speculative or retried tasks race on the per-key claim, or supersede the
attempts before them. The ``keo`` data source (:mod:`spark_jobs.datasource`) runs the same
writers. The sink runs on Spark 3.5 too (plain RDD tasks, no Python data source)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from typing import Any

from dedupe_store.settings import env_var
from producer.errors import UnresolvedKeysError
from producer.guarantees import NOTHING_READ, DriverReads, guarantee_of, read_on_driver
from producer.hooks import NO_HOOKS, Hooks
from producer.settings import Dedupe
from spark_jobs.dead_letters import DeadLetterWriter, HadoopFolders
from spark_jobs.driver_metrics import BatchEnd, BatchResult, FailureReason, MetricsEndpoint
from spark_jobs.writer import (
    DEFAULT_ROWS_PER_SEND,
    BatchReport,
    TaskWriter,
    data_is_binary,
    producer_settings,
    settle_batch,
    stack_for,
)


class ExactlyOnceSink:
    """``df.writeStream.foreachBatch(ExactlyOnceSink(settings, ...))``.

    ``settings`` holds ``KEO_*`` values (see :func:`settings_from_env`); they are validated
    here, on the driver, and travel to the executors as they are. ``query_id`` defaults to the
    streaming query's id, which is stable across restarts from the same checkpoint; give it
    when calling the sink outside a streaming query. With ``metrics_port``, the driver serves
    each batch's end and its rows by outcome on ``metrics_host:metrics_port``, as
    ``format("keo")``'s ``metrics_port`` does.
    """

    def __init__(
        self,
        settings: Mapping[str, str],
        *,
        key_column: str = "key",
        data_column: str = "data",
        routing_key_column: str | None = None,
        dead_letter_path: str | None = None,
        query_id: str | None = None,
        rows_per_send: int = DEFAULT_ROWS_PER_SEND,
        hooks: Hooks = NO_HOOKS,
        dedupe: Dedupe | str | None = None,
        metrics_port: int | None = None,
        metrics_host: str = "127.0.0.1",
    ) -> None:
        self.settings = dict(settings)
        if dedupe is not None:
            self.settings[env_var("dedupe")] = Dedupe(dedupe).value
        self.hooks = hooks
        # parsed once, here: a bad setting fails now, and the tasks get them typed
        self.parsed = producer_settings(self.settings)
        self.stream = self.parsed.stream
        self.dedupe = self.parsed.dedupe
        self.guarantee = guarantee_of(self.parsed)
        self.key_column = key_column
        self.data_column = data_column
        self.routing_key_column = routing_key_column
        self.dead_letter_path = dead_letter_path.rstrip("/") if dead_letter_path else None
        self.query_id = query_id
        if rows_per_send < 1:
            raise ValueError("rows_per_send must be at least 1")
        self.rows_per_send = rows_per_send
        if metrics_port is not None and not 0 < metrics_port < 65536:
            raise ValueError(f"metrics_port must be a TCP port (1 to 65535), got {metrics_port}")
        self.metrics_port = metrics_port
        self.metrics_host = metrics_host

    def __call__(self, df: Any, batch_id: int) -> None:
        self.write_batch(df, batch_id)

    def write_batch(self, df: Any, batch_id: int) -> BatchReport:
        query_id = self.query_id or _streaming_query_id(df)
        stack = stack_for(self.parsed)
        count = self._counter()
        report = BatchReport(query_id, batch_id)
        if self.guarantee.done_before(stack, query_id, batch_id):
            report.skipped = True
            count(report, BatchResult.SKIPPED)
            return report

        try:
            parts = (
                self._rows(df)
                .rdd.mapPartitionsWithIndex(
                    self.partition_writer(
                        df,
                        query_id,
                        batch_id,
                        driver=read_on_driver(stack, [f"{query_id}/{batch_id}"]),
                    )
                )
                .collect()
            )
        except Exception:
            count(report, BatchResult.FAILED, FailureReason.ABORTED)  # a task failed for good
            raise
        for part in parts:
            report.add(part)
        if parts and all(part.skipped for part in parts):
            report.skipped = True
            count(report, BatchResult.SKIPPED)
            return report
        run = f"{query_id}/{batch_id}"
        try:
            settle_batch(
                report,
                stack=stack,
                hooks=self.hooks,
                dead_letters=DeadLetterWriter(
                    self.dead_letter_path, self.stream, HadoopFolders(df.sparkSession)
                ),
                complete=self.guarantee.completer(stack, query=query_id, run=run),
            )
        except Exception as exc:
            unresolved = isinstance(exc, UnresolvedKeysError)
            count(
                report,
                BatchResult.FAILED,
                FailureReason.UNRESOLVED_KEYS if unresolved else FailureReason.ERROR,
            )
            raise
        count(report, BatchResult.COMMITTED)
        return report

    def _counter(self) -> Callable[..., None]:
        """Counts a batch's end on ``metrics_port`` (nothing without one), under the names
        ``format("keo")``'s driver metrics use (:mod:`spark_jobs.driver_metrics`)."""
        if self.metrics_port is None:
            return lambda *_: None
        from pyspark import SparkFiles

        # the driver's files directory: Spark deletes it when the driver stops, and the
        # exporter leaves with it (and with this process)
        metrics = MetricsEndpoint(
            self.metrics_port,
            self.metrics_host,
            local_dir=SparkFiles.getRootDirectory(),
            in_driver=True,
        )

        def count(
            report: BatchReport, result: BatchResult, reason: FailureReason | None = None
        ) -> None:
            metrics.record(
                BatchEnd(
                    query=report.query_id or "unnamed",
                    stream=self.stream,
                    result=result,
                    counts={} if report.skipped else report.counts,
                    reason=reason,
                    producer_counts=report.producer_counts,
                )
            )

        return count

    def partition_writer(
        self,
        df: Any,
        query_id: str,
        batch_id: int,
        *,
        driver: DriverReads = NOTHING_READ,
    ) -> TaskWriter:
        """The executor function of one batch of ``df`` (public for tests of racing tasks);
        ``driver``: what the driver read once for the batch's tasks
        (:func:`producer.guarantees.read_on_driver`: its check of the stream and the table,
        a replay's planned reads, the shard map), which they then need not read. A key-mode
        task keeps its unresolved rows for the driver's commit, which fails the batch; a
        replay-mode task fails, for Spark to retry it alone."""
        return TaskWriter(
            settings=self.parsed,
            query_id=query_id,
            batch_id=batch_id,
            run=f"{query_id}/{batch_id}",
            # each call of the sink is an execution of the batch: Spark calls it once per
            # batch per query run, so a second call for one batch id is a replay
            execution_id=uuid.uuid4().hex,
            data_is_binary=data_is_binary(df.schema, self.data_column),
            fail_on_unresolved=self.guarantee.retries_unresolved_tasks,
            rows_per_send=self.rows_per_send,
            hooks=self.hooks,
            driver=driver,
        )

    def _rows(self, df: Any) -> Any:
        """``(key, data, routing_key)`` in that order, whatever the input's columns."""
        from pyspark.sql import functions as f

        routing = (
            f.col(self.routing_key_column)
            if self.routing_key_column is not None
            else f.lit(None).cast("string")
        )
        return df.select(
            f.col(self.key_column).cast("string").alias("key"),
            f.col(self.data_column).alias("data"),
            routing.cast("string").alias("routing_key"),
        )


def _streaming_query_id(df: Any) -> str:
    """The running query's id: Spark sets it as a local property around foreachBatch."""
    query_id = df.sparkSession.sparkContext.getLocalProperty("sql.streaming.queryId")
    if not query_id:
        # outside a streaming query there is no id to key the batch ledger by
        raise ValueError("not inside a streaming query: pass query_id= to ExactlyOnceSink")
    return str(query_id)
