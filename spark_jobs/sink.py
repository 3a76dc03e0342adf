"""``ExactlyOnceSink``: a ``foreachBatch`` sink that delivers every row of a micro-batch into
Kinesis exactly once per key, through :class:`producer.producer.ExactlyOnceProducer`.

::

    sink(df, batch_id)                                       on the driver
      ├─ ledger: batch (stream, query_id, batch_id) COMPLETE? ── skip all per-key work
      ├─ rdd.mapPartitionsWithIndex(PartitionWriter)          on the executors
      │     └─ producer.send(rows) ── one PartitionReport per partition, back to the driver
      ├─ dead letters (REJECTED, CONFLICT) ── <dead_letter>/batch=<id>/part-*.json
      ├─ any key unresolved (IN_FLIGHT, FAILED, TAKEN_OVER, UNVERIFIABLE)
      │     └─ raise UnresolvedKeysError: Spark retries the batch, the per-key claims decide
      └─ mark the batch COMPLETE

Replays are safe at every step: a batch replayed after a crash re-runs the per-key protocol
(already delivered keys come back DUPLICATE, nothing is sent again), and only a batch that
settled every row is marked COMPLETE. Speculative or retried tasks race on the per-key claim.

Executors rebuild :class:`producer.settings.ProducerSettings` from a plain dict of ``KEO_*``
values (picklable), and keep one client set per Python worker process, reused across batches.
"""

from __future__ import annotations

import base64
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from dedupe_store.settings import ENV_PREFIX, env_var
from producer.errors import UnresolvedKeysError
from producer.hooks import NO_HOOKS, Hooks, Step
from producer.outcomes import Outcome, OutcomeStatus
from producer.producer import default_owner
from producer.protocol import Message, chunked
from producer.settings import ProducerSettings
from producer.wiring import Stack, build_stack

log = logging.getLogger(__name__)

# Seams for tests, not settings: they never travel to the executors as KEO_* values.
_NOT_SETTINGS: Final = frozenset({"KEO_FAILPOINTS"})
DEFAULT_ROWS_PER_SEND: Final = 1000

# Everything that is not settled: retrying the batch may still settle it.
UNRESOLVED_STATUSES: Final = frozenset(
    {
        OutcomeStatus.IN_FLIGHT,
        OutcomeStatus.FAILED,
        OutcomeStatus.TAKEN_OVER,
        OutcomeStatus.UNVERIFIABLE,
    }
)
DEAD_LETTER_STATUSES: Final = frozenset({OutcomeStatus.REJECTED, OutcomeStatus.CONFLICT})
_COUNTED: Final = {
    OutcomeStatus.SENT: "sent",
    OutcomeStatus.DUPLICATE: "duplicates",
    OutcomeStatus.CONFLICT: "conflicts",
    OutcomeStatus.REJECTED: "rejected",
}
COUNT_NAMES: Final = ("sent", "duplicates", "conflicts", "rejected", "unresolved")


# --- settings ---------------------------------------------------------------------------------


def settings_from_env(
    environ: Mapping[str, str] | None = None, **overrides: str | None
) -> dict[str, str]:
    """The ``KEO_*`` values of ``environ`` (default: the process's), with ``overrides``
    (``stream="orders"`` sets ``KEO_STREAM``); ``None`` overrides are left out."""
    values = {
        name: value
        for name, value in (os.environ if environ is None else environ).items()
        if name.startswith(ENV_PREFIX) and name not in _NOT_SETTINGS
    }
    for name, value in overrides.items():
        if value is not None:
            values[env_var(name)] = value
    return values


def producer_settings(values: Mapping[str, str]) -> ProducerSettings:
    """Validate a dict of ``KEO_*`` values; it wins over the process environment."""
    kwargs: dict[str, Any] = {
        name[len(ENV_PREFIX) :].lower(): value
        for name, value in values.items()
        if name.startswith(ENV_PREFIX)
    }
    return ProducerSettings(**kwargs)


# One client set per Python worker process, keyed by the settings; rebuilt after a fork
# (boto3 clients must not cross one).
_STACKS: dict[tuple[int, tuple[tuple[str, str], ...]], Stack] = {}
_STACKS_LOCK = threading.Lock()


def stack_for(values: Mapping[str, str]) -> Stack:
    cache_key = (os.getpid(), tuple(sorted(values.items())))
    with _STACKS_LOCK:
        stack = _STACKS.get(cache_key)
        if stack is None:
            stack = build_stack(producer_settings(values))
            _STACKS[cache_key] = stack
            log.info(
                "sink clients built pid=%d stream=%s table=%s",
                os.getpid(),
                stack.settings.stream,
                stack.settings.table,
            )
        return stack


# --- what comes back from a partition ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A row that can never be delivered as it is: rejected input or a key conflict."""

    key: str | None
    status: str
    reason: str
    data: str | None  # text data as it was
    data_base64: str | None  # binary data
    routing_key: str | None

    def as_row(self, query_id: str, batch_id: int) -> tuple[Any, ...]:
        return (
            query_id,
            batch_id,
            self.key,
            self.status,
            self.reason,
            self.data,
            self.data_base64,
            self.routing_key,
        )


DEAD_LETTER_SCHEMA: Final = (
    "query_id string, batch_id long, key string, status string, reason string, "
    "data string, data_base64 string, routing_key string"
)


@dataclass(frozen=True, slots=True)
class Unresolved:
    key: str | None
    status: str
    reason: str | None


@dataclass(slots=True)
class PartitionReport:
    partition: int
    counts: dict[str, int] = field(default_factory=dict)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    unresolved: list[Unresolved] = field(default_factory=list)


@dataclass(slots=True)
class BatchReport:
    """A batch's totals on the driver."""

    query_id: str
    batch_id: int
    skipped: bool = False
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNT_NAMES, 0))
    dead_letters: list[DeadLetter] = field(default_factory=list)
    unresolved: list[Unresolved] = field(default_factory=list)

    def add(self, part: PartitionReport) -> None:
        for name, count in part.counts.items():
            self.counts[name] = self.counts.get(name, 0) + count
        self.dead_letters.extend(part.dead_letters)
        self.unresolved.extend(part.unresolved)


# --- the executor side ------------------------------------------------------------------------


@dataclass(frozen=True)
class PartitionWriter:
    """Sends one partition's rows ``(key, data, routing_key)``; picklable, runs on executors.

    Each call has its own producer identity (the clients are shared per process), so two tasks
    writing the same partition at once, even in one process, race on the per-key claim.
    """

    settings: dict[str, str]
    query_id: str
    batch_id: int
    data_is_binary: bool
    rows_per_send: int = DEFAULT_ROWS_PER_SEND
    hooks: Hooks = NO_HOOKS

    def __call__(self, partition: int, rows: Iterable[Any]) -> Iterator[PartitionReport]:
        stack = stack_for(self.settings)
        owner = f"{default_owner()}:q{self.query_id[:8]}:b{self.batch_id}:p{partition}"
        report = PartitionReport(partition)
        counts: Counter[str] = Counter()
        started = time.perf_counter()
        with stack.producer(owner=owner, hooks=self.hooks) as producer:
            for chunk in chunked(rows, self.rows_per_send):
                messages = [_message(row) for row in chunk]
                for row, outcome in zip(chunk, producer.send(messages), strict=True):
                    self._tally(row, outcome, counts, report)
        report.counts = {name: counts[name] for name in COUNT_NAMES}
        log.info(
            "partition written query=%s batch=%d partition=%d sent=%d duplicates=%d "
            "conflicts=%d rejected=%d unresolved=%d seconds=%.3f",
            self.query_id,
            self.batch_id,
            partition,
            counts["sent"],
            counts["duplicates"],
            counts["conflicts"],
            counts["rejected"],
            counts["unresolved"],
            time.perf_counter() - started,
        )
        yield report

    def _tally(
        self, row: Any, outcome: Outcome, counts: Counter[str], report: PartitionReport
    ) -> None:
        if outcome.status in UNRESOLVED_STATUSES:
            counts["unresolved"] += 1
            report.unresolved.append(Unresolved(outcome.key, outcome.status.value, outcome.reason))
            return
        counts[_COUNTED[outcome.status]] += 1
        if outcome.status in DEAD_LETTER_STATUSES:
            report.dead_letters.append(_dead_letter(row, outcome, binary=self.data_is_binary))


def _data_bytes(value: Any) -> Any:
    """UTF-8 for text, bytes for binary; anything else is left for validation to reject."""
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    return value


def _message(row: Any) -> Message:
    # Null keys or data reach the producer's validation, which rejects them with a reason.
    return Message(row[0], _data_bytes(row[1]), row[2])


def _dead_letter(row: Any, outcome: Outcome, *, binary: bool) -> DeadLetter:
    data = row[1]
    text: str | None = None
    encoded: str | None = None
    if binary and data is not None:
        encoded = base64.b64encode(bytes(data)).decode("ascii")
    elif isinstance(data, str):
        text = data
    return DeadLetter(
        key=row[0] if isinstance(row[0], str) else None,
        status=outcome.status.value,
        reason=outcome.reason or outcome.status.value,
        data=text,
        data_base64=encoded,
        routing_key=row[2],
    )


# --- the driver side --------------------------------------------------------------------------


class ExactlyOnceSink:
    """``df.writeStream.foreachBatch(ExactlyOnceSink(settings, ...))``.

    ``settings`` holds ``KEO_*`` values (see :func:`settings_from_env`); they are validated
    here, on the driver, and travel to the executors as they are. ``query_id`` defaults to the
    streaming query's id, which is stable across restarts from the same checkpoint; give it
    when calling the sink outside a streaming query.
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
    ) -> None:
        self.settings = dict(settings)
        self.hooks = hooks
        self.stream = producer_settings(self.settings).stream  # fail fast on bad settings
        self.key_column = key_column
        self.data_column = data_column
        self.routing_key_column = routing_key_column
        self.dead_letter_path = dead_letter_path.rstrip("/") if dead_letter_path else None
        self.query_id = query_id
        if rows_per_send < 1:
            raise ValueError("rows_per_send must be at least 1")
        self.rows_per_send = rows_per_send

    def __call__(self, df: Any, batch_id: int) -> None:
        self.write_batch(df, batch_id)

    def write_batch(self, df: Any, batch_id: int) -> BatchReport:
        query_id = self.query_id or _streaming_query_id(df)
        stack = stack_for(self.settings)
        ledger = stack.ledger
        now_ms = stack.clock.now_ms()
        if ledger.completed_batch(self.stream, query_id, batch_id, now_ms=now_ms) is not None:
            log.info(
                "batch already complete, skipped stream=%s query=%s batch=%d",
                self.stream,
                query_id,
                batch_id,
            )
            return BatchReport(query_id, batch_id, skipped=True)

        started = time.perf_counter()
        report = BatchReport(query_id, batch_id)
        for part in (
            self._rows(df)
            .rdd.mapPartitionsWithIndex(self.partition_writer(df, query_id, batch_id))
            .collect()
        ):
            report.add(part)
        self.hooks.at(Step.BATCH_AFTER_PUTS)
        log.info(
            "batch written stream=%s query=%s batch=%d sent=%d duplicates=%d conflicts=%d "
            "rejected=%d unresolved=%d seconds=%.3f",
            self.stream,
            query_id,
            batch_id,
            report.counts["sent"],
            report.counts["duplicates"],
            report.counts["conflicts"],
            report.counts["rejected"],
            report.counts["unresolved"],
            time.perf_counter() - started,
        )
        self._write_dead_letters(df.sparkSession, report)
        if report.unresolved:
            by_status = Counter(u.status for u in report.unresolved)
            log.warning(
                "batch left keys unresolved, raising for a retry stream=%s query=%s batch=%d "
                "unresolved=%d statuses=%s",
                self.stream,
                query_id,
                batch_id,
                len(report.unresolved),
                dict(by_status),
            )
            raise UnresolvedKeysError(self.stream, [u.key or "" for u in report.unresolved])
        self.hooks.at(Step.BATCH_BEFORE_COMPLETE)
        ledger.mark_batch_complete(
            self.stream, query_id, batch_id, counts=report.counts, now_ms=stack.clock.now_ms()
        )
        return report

    def partition_writer(self, df: Any, query_id: str, batch_id: int) -> PartitionWriter:
        """The executor function of one batch of ``df`` (public for tests of racing tasks)."""
        return PartitionWriter(
            settings=self.settings,
            query_id=query_id,
            batch_id=batch_id,
            data_is_binary=self._data_is_binary(df),
            rows_per_send=self.rows_per_send,
            hooks=self.hooks,
        )

    def _data_is_binary(self, df: Any) -> bool:
        from pyspark.sql.types import BinaryType, StringType

        data_type = df.schema[self.data_column].dataType
        if isinstance(data_type, BinaryType):
            return True
        if isinstance(data_type, StringType):
            return False
        raise TypeError(
            f"column {self.data_column!r} must be string or binary, got {data_type.simpleString()}"
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

    def _write_dead_letters(self, spark: Any, report: BatchReport) -> None:
        if not report.dead_letters:
            return
        if self.dead_letter_path is None:
            log.warning(
                "no dead-letter path: rows dropped stream=%s query=%s batch=%d rejected=%d "
                "conflicts=%d",
                self.stream,
                report.query_id,
                report.batch_id,
                report.counts["rejected"],
                report.counts["conflicts"],
            )
            return
        path = f"{self.dead_letter_path}/batch={report.batch_id}"
        rows = [d.as_row(report.query_id, report.batch_id) for d in report.dead_letters]
        # overwrite: a replayed batch writes the same dead letters again, not twice
        (
            spark.createDataFrame(rows, DEAD_LETTER_SCHEMA)
            .coalesce(1)
            .write.mode("overwrite")
            .json(path)
        )
        log.info(
            "dead letters written stream=%s batch=%d rows=%d path=%s",
            self.stream,
            report.batch_id,
            len(rows),
            path,
        )


def _streaming_query_id(df: Any) -> str:
    """The running query's id: Spark sets it as a local property around foreachBatch."""
    query_id = df.sparkSession.sparkContext.getLocalProperty("sql.streaming.queryId")
    if not query_id:
        # outside a streaming query there is no id to key the batch ledger by
        raise ValueError("not inside a streaming query: pass query_id= to ExactlyOnceSink")
    return str(query_id)
