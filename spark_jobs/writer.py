"""The writer the ``foreachBatch`` sink and the ``keo`` data source share.

::

    executors                                     driver
    TaskWriter.write(partition, attempt, rows)    settle_batch(report, ...)
      └─ sender.send_each(chunks of rows)           ├─ hooks: batch_after_puts
         ── PartitionReport: counts,                ├─ dead letters: DeadLetterWriter
            dead letters, unresolved keys           ├─ any key unresolved: UnresolvedKeysError
                                                    ├─ hooks: batch_before_complete
                                                    └─ record the batch COMPLETE (if it has a query)

Rows are ``(key, data, routing_key)`` tuples, whatever the input's columns were: each caller
selects them its own way (the sink with a Spark ``select``, the data source from Arrow record
batches or Spark rows); each writes its dead letters with :mod:`spark_jobs.dead_letters`'s
one writer, through the file system its driver reaches. Nothing here imports pyspark.

Executors get :class:`producer.settings.ProducerSettings` parsed once on the driver (pickled
with the plan), and keep one client set per Python worker process, reused across batches.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

from dedupe_store.settings import ENV_PREFIX, env_var
from kinesis_store.shards import ListedShards, StreamInfo
from producer import metrics
from producer.errors import UnresolvedKeysError
from producer.guarantees import NOTHING_READ, Completer, DriverReads, Party, guarantee_of
from producer.hooks import NO_HOOKS, Hooks, Step
from producer.key.producer import default_owner
from producer.metrics import SampleKey
from producer.outcomes import Outcome, OutcomeStatus
from producer.protocol import Message, chunked
from producer.settings import ProducerSettings
from producer.wiring import Stack, build_stack
from spark_jobs.dead_letters import (
    DEAD_LETTER_STATUSES,
    DeadLetter,
    DeadLetterWriter,
    dead_letter_of,
)

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
    """Validate a dict of ``KEO_*`` values; it wins over the process environment. A ``KEO_*``
    variable that is no setting (``KEO_QUOTAS``, ``KEO_STATE_DIR``: the tools') is not read, as
    the environment's are not."""
    fields = ProducerSettings.model_fields
    kwargs: dict[str, Any] = {
        name[len(ENV_PREFIX) :].lower(): value
        for name, value in values.items()
        if name.startswith(ENV_PREFIX) and name[len(ENV_PREFIX) :].lower() in fields
    }
    return ProducerSettings(**kwargs)


# What a Python worker process builds once per settings (a client set, a client), rebuilt
# after a fork: boto3 clients must not cross one.
_T = TypeVar("_T")
_PER_WORKER: dict[tuple[str, int, str], Any] = {}
_PER_WORKER_LOCK = threading.Lock()


def per_worker(kind: str, settings: ProducerSettings, build: Callable[[], _T]) -> _T:
    """``build()``'s result, once per ``kind``, settings and Python worker process."""
    cache_key = (kind, os.getpid(), settings.model_dump_json())
    with _PER_WORKER_LOCK:
        built: _T | None = _PER_WORKER.get(cache_key)
        if built is None:
            built = _PER_WORKER[cache_key] = build()
        return built


def stack_for(settings: ProducerSettings, *, checked: StreamInfo | None = None) -> Stack:
    """One client set per Python worker process and settings; ``checked``: what the driver
    found when it checked the stream and the table (:func:`producer.wiring.build_stack`), so
    that an executor asks neither again."""

    def build() -> Stack:
        stack = build_stack(settings, checked=checked)
        log.info(
            "spark clients built pid=%d stream=%s table=%s",
            os.getpid(),
            stack.settings.stream,
            stack.settings.table,
        )
        return stack

    return per_worker("stack", settings, build)


def offer_shard_map(stack: Stack, listed: ListedShards | None) -> None:
    """On an executor: the driver's listing, kept by this worker's writer when it is newer than
    its own."""
    shards = stack.writer.shards
    if listed is not None and shards is not None:
        shards.offer(listed)


# --- what comes back from a partition ---------------------------------------------------------


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
    seconds: float = 0.0
    # what the task's producer did: its counters' growth (producer.metrics.counts_since)
    producer_counts: dict[SampleKey, float] = field(default_factory=dict)
    skipped: bool = False  # replay mode: the run was COMPLETE, nothing was sent


@dataclass(slots=True)
class BatchReport:
    """A batch's totals on the driver. ``query_id`` and ``batch_id`` are None for a batch
    write that no streaming query names."""

    query_id: str | None
    batch_id: int | None
    skipped: bool = False
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNT_NAMES, 0))
    dead_letters: list[DeadLetter] = field(default_factory=list)
    unresolved: list[Unresolved] = field(default_factory=list)
    task_seconds: float = 0.0  # summed over the partitions: their wall time, not the batch's
    producer_counts: dict[SampleKey, float] = field(default_factory=dict)

    def add(self, part: PartitionReport) -> None:
        for name, count in part.counts.items():
            self.counts[name] = self.counts.get(name, 0) + count
        for key, grown in part.producer_counts.items():
            self.producer_counts[key] = self.producer_counts.get(key, 0.0) + grown
        self.task_seconds += part.seconds
        self.dead_letters.extend(part.dead_letters)
        self.unresolved.extend(part.unresolved)

    def dead_letter_rows(self) -> list[tuple[Any, ...]]:
        return [d.as_row(self.query_id, self.batch_id) for d in self.dead_letters]


# --- the executor side ------------------------------------------------------------------------


@dataclass(frozen=True)
class TaskWriter:
    """Sends one partition's rows ``(key, data, routing_key)`` as one party of a batch, in the
    batch's guarantee (:func:`producer.guarantees.guarantee_of`, read from the settings);
    picklable, runs on executors. Both of Spark's doors write through it: ``format("keo")``'s
    tasks and ``ExactlyOnceSink``'s.

    Key mode: each call has its own producer identity (the clients are shared per process),
    so two tasks writing the same partition at once, even in one process, race on the per-key
    claim. Replay mode: one attempt at ``run``; ``task_attempt`` orders the task's attempts
    (:func:`task_attempt_of`): a retry of the task recovers what the attempts before it put; a
    sibling task's rows are never compared with these. Within one execution a retried task
    holds the rows its first attempt held: Spark recomputes a partition deterministically, or
    fails the job when a result stage's input is indeterminate (it cannot roll a write back); a
    restarted query is a new execution, whose every attempt counts as earlier whatever its
    partitioning (SPARK-28650).

    ``fail_on_unresolved``: a row left unresolved fails the task
    (:class:`UnresolvedKeysError`), so Spark retries it alone; else the driver's commit fails
    the batch."""

    settings: ProducerSettings
    query_id: str
    batch_id: int | None
    run: str
    execution_id: str
    data_is_binary: bool
    fail_on_unresolved: bool = True
    rows_per_send: int = DEFAULT_ROWS_PER_SEND
    hooks: Hooks = NO_HOOKS
    # what the driver read once for the write's tasks (producer.guarantees.read_on_driver):
    # its check of the stream and the table, a replay's planned reads, the shard map
    driver: DriverReads = NOTHING_READ

    def write(self, partition: int, task_attempt: int, rows: Iterable[Any]) -> PartitionReport:
        stack = stack_for(self.settings, checked=self.driver.checked)
        offer_shard_map(stack, self.driver.shard_map)
        batch = "" if self.batch_id is None else str(self.batch_id)
        party = Party(
            self.run,
            self.execution_id,
            task=str(partition),
            task_attempt=task_attempt,
            owner=f"{default_owner()}:q{self.query_id[:8]}:b{batch or 0}:p{partition}",
        )
        tally = _Tally(partition, binary=self.data_is_binary)
        guarantee = guarantee_of(stack.settings)
        with guarantee.sender(stack, party, hooks=self.hooks, driver=self.driver) as sender:
            # one pipeline for the partition: a chunk's end does not leave the shards idle
            # while the next one's claims are made (key mode)
            chunks: deque[list[Any]] = deque()

            def batches() -> Iterator[list[Message]]:
                for chunk in chunked(rows, self.rows_per_send):
                    chunks.append(chunk)
                    yield [_message(row) for row in chunk]

            for outcomes in sender.send_each(batches()):
                tally.add(chunks.popleft(), outcomes)
            end = sender.finish()
        report = tally.done()
        report.skipped = end.skipped
        log.info(
            "partition written run=%s partition=%d attempt=%d query=%s batch=%s %s%s seconds=%.3f",
            self.run,
            partition,
            task_attempt,
            self.query_id,
            batch,
            "".join(f"{name}={value} " for name, value in end.notes.items()),
            tally.summary(),
            report.seconds,
        )
        if self.fail_on_unresolved:
            # the task fails, so Spark retries it: the per-key claims keep the retry from
            # resending; a replay attempt's retry finds what this attempt put
            raise_unresolved(stack.settings.stream, report)
        return report

    def __call__(self, partition: int, rows: Iterable[Any]) -> Iterator[PartitionReport]:
        """For ``rdd.mapPartitionsWithIndex``: the task's attempt number from its context."""
        from pyspark import TaskContext

        yield self.write(partition, task_attempt_of(TaskContext.get()), rows)


def task_attempt_of(context: Any) -> int:
    """The attempt's ordinal among its task's attempts in this execution: Spark's task attempt
    id, unique and increasing per SparkContext. Not ``attemptNumber()``, which starts at 0
    again when a stage is retried: a stage retry's attempt must count as later than the first
    stage's, or it would put its partition's rows a second time."""
    return int(context.taskAttemptId()) if context is not None else 0


class _Tally:
    """A partition's outcomes, counted, with its dead letters and unresolved rows."""

    def __init__(self, partition: int, *, binary: bool) -> None:
        self._binary = binary
        self._counts: Counter[str] = Counter()
        self._report = PartitionReport(partition)
        self._started = time.perf_counter()
        self._before = metrics.producer_counts()

    def add(self, rows: list[Any], outcomes: list[Outcome]) -> None:
        for row, outcome in zip(rows, outcomes, strict=True):
            if outcome.status in UNRESOLVED_STATUSES:
                self._counts["unresolved"] += 1
                self._report.unresolved.append(
                    Unresolved(outcome.key, outcome.status.value, outcome.reason)
                )
                continue
            self._counts[_COUNTED[outcome.status]] += 1
            if outcome.status in DEAD_LETTER_STATUSES:
                self._report.dead_letters.append(dead_letter_of(row, outcome, binary=self._binary))

    def done(self) -> PartitionReport:
        report = self._report
        report.counts = {name: self._counts[name] for name in COUNT_NAMES}
        report.seconds = time.perf_counter() - self._started
        report.producer_counts = metrics.counts_since(self._before)
        return report

    def summary(self) -> str:
        return " ".join(f"{name}={self._counts[name]}" for name in COUNT_NAMES)


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


def data_is_binary(schema: Any, column: str) -> bool:
    """Whether ``column`` of a Spark schema holds binary data (else text); refuses other types."""
    from pyspark.sql.types import BinaryType, StringType

    data_type = schema[column].dataType
    if isinstance(data_type, BinaryType):
        return True
    if isinstance(data_type, StringType):
        return False
    raise TypeError(f"column {column!r} must be string or binary, got {data_type.simpleString()}")


# --- the driver side --------------------------------------------------------------------------


def settle_batch(
    report: BatchReport,
    *,
    stack: Stack,
    hooks: Hooks,
    dead_letters: DeadLetterWriter,
    complete: Completer | None,
) -> None:
    """What the driver does once every partition of a batch has reported.

    Dead letters are written first, so a batch that fails for its unresolved keys has still
    kept them (a replay writes the same ones again, in the same place). The batch is recorded
    (``complete``: the guarantee's :meth:`producer.guarantees.Guarantee.completer`, the batch's
    record in key mode, its run COMPLETE in replay mode; None records nothing) only when it
    settled every row: that record is what lets a replay of the batch skip all its work.
    """
    stream = stack.settings.stream
    hooks.at(Step.BATCH_AFTER_PUTS, batch_id=report.batch_id)
    log.info(
        "batch written stream=%s query=%s batch=%s sent=%d duplicates=%d conflicts=%d "
        "rejected=%d unresolved=%d task_seconds=%.3f",
        stream,
        report.query_id,
        report.batch_id,
        report.counts["sent"],
        report.counts["duplicates"],
        report.counts["conflicts"],
        report.counts["rejected"],
        report.counts["unresolved"],
        report.task_seconds,
    )
    if report.dead_letters:
        dead_letters.write(report)
    raise_unresolved(stream, report)
    hooks.at(Step.BATCH_BEFORE_COMPLETE, batch_id=report.batch_id)
    if complete is not None:
        complete(report.counts, report.batch_id)


def raise_unresolved(stream: str, report: BatchReport | PartitionReport) -> None:
    """:class:`UnresolvedKeysError` when any row is neither delivered nor dead-lettered."""
    if not report.unresolved:
        return
    by_status = Counter(u.status for u in report.unresolved)
    log.warning(
        "keys left unresolved, raising for a retry stream=%s unresolved=%d statuses=%s",
        stream,
        len(report.unresolved),
        dict(by_status),
    )
    raise UnresolvedKeysError(stream, [u.key or "" for u in report.unresolved])
