"""The scale harness (issue 39): replay mode's executor-side writer for T task attempts in W
worker processes, the driver's side in this process, against a stream of S shards under the
quota mode of the local stack. No Spark: a 2-core machine cannot run 2,000 tasks of it.

::

    this process: the driver                     W worker processes: Spark's Python workers
    WritePlan.of: checks the stream and the       forked clean by a fork server (as pyspark's
      table, once for the write                   daemon forks its workers), one client set
    tasks queued (partition, task attempt id);    each (spark_jobs.writer.stack_for), tasks
      a failed task queued again with the next    one after another: TaskContext set as
      id, up to Spark's 4 failures                pyspark's worker sets it, then
    KeoArrowWriter.commit(messages)               KeoArrowWriter.write(Arrow record batches)
                                                  -> KeoCommitMessage, or the task's error

    the quota proxies (devstack.quota_proxy, devstack.dynamodb_quota_proxy) count every call,
    by operation, by shard and by ledger item; the audit reads the emulator behind them

Scenarios, each on a stream of S shards and a ledger table of its own:

    clean        one execution of the write, every task once
    killed       an execution whose worker processes are killed (SIGKILL) once the proxy has
                 counted half the rows written (nothing committed), then a new execution of
                 the same run (``run_id``), as Spark replays a batch after its driver restarted
    killed-later the same, the new execution started once the killed one's leases ended (a
                 driver restarted later than a lease). In both, the new execution's driver
                 reads the recovery once for its tasks, in ``killed`` once it has superseded
                 the killed execution and waited for its lease
                 (producer.replay.recovery.plan_reads_once_over)
    retry-wave   every fourth task's first attempt fails right after its first PutRecords (the
                 failpoint ``after_put=raise``: at these sizes a task's rows fit one request,
                 so it fails having put them all) and is attempted again

Figures, per query (one execution: its plan to its commit):

    control plane        calls by operation (Kinesis' DescribeStreamSummary, ListShards, ...
                         and DynamoDB's DescribeTable, ...), summed over the driver and the tasks
    reads per shard      GetShardIterator and GetRecords calls on each of the stream's shards
                         (refused ones too): the most on one shard and the mean over all S
    throttles            calls (or records of a PutRecords) the quotas refused, by operation
    first put, commit    seconds from the query's start to the first record the proxy counted
                         written, and to the end of the commit
    recover              killed: the replay's start to its commit; retry-wave: the first
                         failed attempt's end to the last retry's end

and per scenario: the most writes one ledger item took in one second (and which item), and
the audit: the stream read back as a KCL consumer reads it (:func:`producer.audit.audit_rows`),
every row expected once.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import multiprocessing
import os
import queue
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeVar, cast

from devstack import emulators
from devstack.bench_stack import (
    Background,
    as_env,
    fresh_streams,
    on_stream,
    proxy_counters,
    quota_stack,
    write,
)
from devstack.quotas import CONTROL_PLANE
from producer.audit.rows import ExpectedRow, RowAnomaly
from producer.audit.stream import audit_rows
from producer.clients import kinesis_read_client
from spark_jobs.writer import producer_settings

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess

    from pyspark.sql.datasource import WriterCommitMessage

    from spark_jobs.datasource import KeoArrowWriter, KeoCommitMessage, WritePlan

__all__ = [
    "SCENARIOS",
    "Bench",
    "QueryFigures",
    "ScenarioFigures",
    "Shape",
    "measure",
    "render",
]


_T = TypeVar("_T")

SCENARIOS: Final = ("clean", "killed", "killed-later", "retry-wave")
_MOST_WRITTEN_REPORTED: Final = 5
TASK_MAX_FAILURES: Final = 4  # spark.task.maxFailures: a task failing this often fails the job
RETRY_WAVE_EVERY: Final = 4  # every fourth task's first attempt fails
RETRY_WAVE_FAILPOINT: Final = "after_put=raise"
DYNAMODB_CONTROL_PLANE: Final = frozenset(
    {
        "CreateTable",
        "DeleteTable",
        "DescribeTable",
        "UpdateTable",
        "ListTables",
        "DescribeTimeToLive",
        "UpdateTimeToLive",
        "DescribeContinuousBackups",
    }
)
READ_OPERATIONS: Final = ("GetShardIterator", "GetRecords")
# the timing of the harness's writers: one host's clocks (skew 0.5 s), the signature fence off,
# so that a lease (the wait for a killed attempt) is seconds, not the fence's 6 minutes
TIMING: Final = {"clock_skew_s": "0.5", "put_fence": "off", "lease_s": "10"}
_WATCH_EVERY_S: Final = 0.05
_END_POLL_S: Final = 0.2
_WORKER_STOP_S: Final = 10.0


@dataclass(frozen=True)
class Shape:
    """How big a measure is: T tasks in W worker processes on S shards."""

    tasks: int
    workers: int
    shards: int
    rows_per_task: int = 0  # 0: 50 a task up to 80 tasks, 4,000 rows in all above (at least 5)

    @property
    def task_rows(self) -> int:
        if self.rows_per_task > 0:
            return self.rows_per_task
        return max(5, min(50, 4000 // max(self.tasks, 1)))


# --- the rows --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rows:
    """A write's rows: ``per_task`` rows a partition, made where they are needed (a worker makes
    its partition's, as an executor computes it; the audit makes them all)."""

    label: str
    tasks: int
    per_task: int

    def of(self, partition: int) -> list[tuple[str, str]]:
        return [
            (f"{self.label}-p{partition:05d}-r{row:04d}", f"row {row} of partition {partition}")
            for row in range(self.per_task)
        ]

    def expected(self) -> Iterator[ExpectedRow]:
        for partition in range(self.tasks):
            for key, data in self.of(partition):
                yield ExpectedRow(key, data.encode())

    @property
    def count(self) -> int:
        return self.tasks * self.per_task


# --- the executor side: a worker process -------------------------------------------------------


@dataclass(frozen=True)
class TaskAttempt:
    """One attempt at a partition; ``attempt_id`` is Spark's task attempt id (unique in the
    execution, growing), ``number`` the task's attempt (0 first); ``failpoints`` are armed in
    this attempt only."""

    partition: int
    attempt_id: int
    number: int = 0
    failpoints: str = ""


@dataclass(frozen=True)
class TaskEnd:
    """What a worker reports of an attempt: its commit message, or its error."""

    attempt: TaskAttempt
    message: KeoCommitMessage | None
    error: str | None
    seconds: float
    pid: int


def run_attempt(writer: KeoArrowWriter, rows: Rows, attempt: TaskAttempt) -> TaskEnd:
    """One task attempt as pyspark's worker runs it: its TaskContext set, then the writer's
    ``write`` over the partition's Arrow record batch."""
    import pyarrow as pa
    from pyspark import TaskContext

    from devstack.failpoints import Failpoints

    TaskContext._setTaskContext(None)
    TaskContext(
        partitionId=attempt.partition,
        taskAttemptId=attempt.attempt_id,
        attemptNumber=attempt.number,
        stageId=0,
        localProperties={},
    )
    if attempt.failpoints:
        writer = type(writer)(writer.plan.with_hooks(Failpoints(attempt.failpoints)))
    keys, data = zip(*rows.of(attempt.partition), strict=True)
    batch = pa.RecordBatch.from_pydict({"key": list(keys), "data": list(data)})
    started = time.perf_counter()
    try:
        message = cast("KeoCommitMessage", writer.write(iter([batch])))
    except Exception as exc:  # the task fails, as in Spark: the driver retries it
        error = f"{type(exc).__name__}: {exc}"
        return TaskEnd(attempt, None, error, time.perf_counter() - started, os.getpid())
    return TaskEnd(attempt, message, None, time.perf_counter() - started, os.getpid())


def _serve(writer: KeoArrowWriter, rows: Rows, tasks: Any, ends: Any) -> None:
    """A worker process: attempts from ``tasks`` one after another until None."""
    logging.basicConfig(
        level=logging.WARNING,
        format="%(asctime)s worker pid=%(process)d %(levelname)s %(name)s %(message)s",
    )
    while (attempt := tasks.get()) is not None:
        ends.put(run_attempt(writer, rows, attempt))


class Workers:
    """W worker processes, fed attempts through a queue; ``with`` it: started, then stopped
    (or killed, :meth:`kill`)."""

    def __init__(self, count: int, writer: KeoArrowWriter, rows: Rows) -> None:
        context = forkserver_processes()
        self._tasks = context.Queue()
        self._ends = context.Queue()
        self._processes: list[BaseProcess] = [
            context.Process(
                target=_serve, args=(writer, rows, self._tasks, self._ends), daemon=True
            )
            for _ in range(count)
        ]
        self.killed = threading.Event()

    def __enter__(self) -> Workers:
        for process in self._processes:
            process.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        if not self.killed.is_set():
            for _ in self._processes:
                self._tasks.put(None)
        for process in self._processes:
            process.join(timeout=_WORKER_STOP_S)
            if process.is_alive():
                process.kill()
                process.join()
        for channel in (self._tasks, self._ends):
            channel.cancel_join_thread()
            channel.close()

    def submit(self, attempt: TaskAttempt) -> None:
        self._tasks.put(attempt)

    def next_end(self) -> TaskEnd | None:
        """The next attempt's end, or None when none came within a poll."""
        try:
            end: TaskEnd = self._ends.get(timeout=_END_POLL_S)
        except queue.Empty:
            return None
        return end

    def alive(self) -> bool:
        return any(process.is_alive() for process in self._processes)

    def kill(self) -> None:
        """SIGKILL every worker process: no cleanup, no lease ended, like a lost executor."""
        self.killed.set()
        for process in self._processes:
            if process.pid is not None and process.is_alive():
                os.kill(process.pid, signal.SIGKILL)


def forkserver_processes(preload: str = __name__) -> multiprocessing.context.ForkServerContext:
    """Processes forked clean by a fork server that imported ``preload`` (this module, and so
    the writer) once, as pyspark's daemon forks its Python workers: none inherits this
    process's threads."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([preload])
    return context


# --- the driver side ---------------------------------------------------------------------------


def plan_write(options: Mapping[str, str]) -> WritePlan:
    """What ``df.write.format("keo")`` does on the driver before any task runs."""
    from spark_jobs.datasource import WritePlan

    return WritePlan.of(options, _schema(), overwrite=False, streaming=False)


def commit_write(plan: WritePlan, messages: list[WriterCommitMessage | None]) -> None:
    """What Spark's driver does once every task succeeded."""
    from spark_jobs.datasource import KeoArrowWriter

    KeoArrowWriter(plan).commit(messages)


def on_the_driver(call: Callable[..., _T], *args: Any) -> _T:
    """``call(*args)`` in a Python process of its own, as Spark runs a Python data source's
    planning and its commit: a driver that restarts asks the stream and the table again
    (this process would have kept its clients, spark_jobs.writer.stack_for's cache)."""
    with ProcessPoolExecutor(1, mp_context=forkserver_processes()) as driver:
        return driver.submit(call, *args).result()


# which failpoints a partition's attempt number arms ("" none)
Arming = Callable[[int, int], str]


def nothing_armed(_partition: int, _number: int) -> str:
    return ""


def retry_wave(partition: int, number: int) -> str:
    """Every fourth task's first attempt fails right after its first put."""
    first = number == 0 and partition % RETRY_WAVE_EVERY == RETRY_WAVE_EVERY - 1
    return RETRY_WAVE_FAILPOINT if first else ""


@dataclass
class TaskRun:
    """What the attempts of one execution came to, as the driver received them."""

    tasks: int
    ends: list[tuple[float, TaskEnd]] = field(default_factory=list)  # (monotonic, end)
    done: dict[int, KeoCommitMessage] = field(default_factory=dict)  # partition -> message
    job_failed: bool = False

    @property
    def complete(self) -> bool:
        """Whether every partition succeeded: the write may be committed."""
        return len(self.done) == self.tasks

    def messages(self) -> list[WriterCommitMessage | None]:
        """By partition, as Spark hands them to the commit."""
        return [self.done[p] for p in sorted(self.done)]

    def failures(self) -> dict[str, int]:
        """Failed attempts by error type."""
        return dict(Counter(end.error.split(":", 1)[0] for _, end in self.ends if end.error))


def run_tasks(workers: Workers, tasks: int, arming: Arming) -> TaskRun:
    """Every partition's first attempt, then a failed one's next (Spark's task retries, the
    attempt id growing), until each partition succeeded, one failed ``TASK_MAX_FAILURES``
    times (the job fails), or the workers were killed."""
    attempt_ids = itertools.count()
    for partition in range(tasks):
        workers.submit(TaskAttempt(partition, next(attempt_ids), 0, arming(partition, 0)))
    run = TaskRun(tasks)
    failures: Counter[int] = Counter()
    while len(run.done) < tasks and not run.job_failed:
        end = workers.next_end()
        if end is None:
            if workers.killed.is_set() or not workers.alive():
                break
            continue
        run.ends.append((time.monotonic(), end))
        partition = end.attempt.partition
        if end.message is not None:
            run.done[partition] = end.message
            continue
        failures[partition] += 1
        run.job_failed = failures[partition] >= TASK_MAX_FAILURES
        number = end.attempt.number + 1
        workers.submit(TaskAttempt(partition, next(attempt_ids), number, arming(partition, number)))
    return run


# --- the counters ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Counted:
    """Both quota proxies' counters at one moment."""

    kinesis: dict[str, Any]
    dynamodb: dict[str, Any]

    @classmethod
    def now(cls, stack: emulators.Endpoints) -> Counted:
        return cls(proxy_counters(stack.kinesis), proxy_counters(stack.dynamodb))


def _grown(before: Mapping[str, int], after: Mapping[str, int]) -> dict[str, int]:
    return {name: n - before.get(name, 0) for name, n in after.items() if n > before.get(name, 0)}


def calls_between(before: Counted, after: Counted) -> dict[str, int]:
    """Every call both proxies counted in between, by operation."""
    kinesis = _grown(before.kinesis["calls"], after.kinesis["calls"])
    dynamodb = _grown(before.dynamodb["calls"], after.dynamodb["calls"])
    return dict(sorted({**kinesis, **dynamodb}.items()))


def throttles_between(before: Counted, after: Counted) -> dict[str, int]:
    kinesis = _grown(before.kinesis["throttles"], after.kinesis["throttles"])
    dynamodb = _grown(before.dynamodb["throttles"], after.dynamodb["throttles"])
    return dict(sorted({**kinesis, **dynamodb}.items()))


def is_control_plane(operation: str) -> bool:
    return operation in CONTROL_PLANE or operation in DYNAMODB_CONTROL_PLANE


@dataclass(frozen=True)
class ShardSpread:
    """Calls on a stream's shards: the most on one, and the mean over all of them."""

    max: int
    mean: float


def reads_per_shard(
    before: Counted, after: Counted, stream: str, shards: int
) -> dict[str, ShardSpread]:
    """GetShardIterator and GetRecords calls on each of ``stream``'s shards in between."""
    spread: dict[str, ShardSpread] = {}
    for operation in READ_OPERATIONS:
        was = before.kinesis["calls_by_shard"].get(operation, {})
        now = after.kinesis["calls_by_shard"].get(operation, {})
        grown = _grown(
            was, {where: n for where, n in now.items() if where.startswith(f"{stream}/")}
        )
        total = sum(grown.values())
        spread[operation] = ShardSpread(max(grown.values(), default=0), round(total / shards, 2))
    return spread


def require_proxies(stack: emulators.Endpoints) -> None:
    """The harness measures through the quota mode's proxies, and sets up on what they front."""
    if stack.kinesis_emulator is None or stack.dynamodb_emulator_endpoint is None:
        raise ValueError("the scale harness runs on the quota mode's proxies")


def proxied_streams(
    stack: emulators.Endpoints, labels: Sequence[str], *, shards: int, prefix: str = "scale"
) -> dict[str, dict[str, str]]:
    """``format("keo")`` options per label: a new stream of ``shards`` shards and a new table
    each, created on the emulators (setting up counts nothing), named through the proxies."""
    direct = {
        "kinesis_endpoint_url": str(stack.kinesis_emulator),
        "dynamodb_endpoint_url": str(stack.dynamodb_emulator_endpoint),
        "region": emulators.REGION,
    }
    made = fresh_streams(direct, labels, shards=shards, prefix=prefix)
    return {
        label: {
            **options,
            "kinesis_endpoint_url": stack.kinesis,
            "dynamodb_endpoint_url": stack.dynamodb,
        }
        for label, options in made.items()
    }


class PutWatch(Background):
    """Polls the records the Kinesis proxy counted written on a stream: when the first came,
    and ``then()`` once ``rows`` were (``then_at_rows``; 0: never)."""

    def __init__(
        self,
        kinesis_proxy: str,
        stream: str,
        *,
        then_at_rows: int = 0,
        then: Callable[[], None] = lambda: None,
    ) -> None:
        super().__init__()
        self._proxy, self._stream = kinesis_proxy, stream
        self._then_at_rows, self._then = then_at_rows, then
        self.first_put_at: float | None = None
        self.written = 0

    def _run(self) -> None:
        before = self._written()
        while not self._stop.wait(_WATCH_EVERY_S):
            self.written = self._written() - before
            if self.written and self.first_put_at is None:
                self.first_put_at = time.monotonic()
            if self._then_at_rows and self.written >= self._then_at_rows:
                self._then_at_rows = 0
                self._then()

    def _written(self) -> int:
        return on_stream(self._stream, proxy_counters(self._proxy)["records_written"])


# --- the figures -------------------------------------------------------------------------------


@dataclass
class QueryFigures:
    """One execution of the write, from its plan to its commit (none when it was killed)."""

    query: str
    attempts: int
    failed_attempts: dict[str, int]
    committed: bool
    control_plane: dict[str, int]
    calls: dict[str, int]
    reads_per_shard: dict[str, ShardSpread]
    throttles: dict[str, int]
    rows: dict[str, int]  # the commit messages' counts: sent, duplicates, ...
    first_put_s: float | None
    commit_s: float | None
    recover_s: float | None = None


@dataclass(frozen=True)
class AuditFigures:
    rows: int
    missing: int
    duplicated: int
    unexpected: int

    @property
    def exact(self) -> bool:
        return self.missing == self.duplicated == self.unexpected == 0

    def verdict(self) -> str:
        """As a table shows it."""
        if self.exact:
            return f"exact ({self.rows} rows once)"
        return (
            f"**{self.missing} missing, {self.duplicated} duplicated, "
            f"{self.unexpected} unexpected**"
        )


@dataclass(frozen=True)
class ScenarioFigures:
    scenario: str
    shape: Shape
    queries: list[QueryFigures]
    busiest_ledger_item: dict[str, Any]  # key, writes, peak_writes_per_s, ...
    audit: AuditFigures
    # the ledger items that took the most writes in all, the most first (up to 5)
    most_written_ledger_items: list[dict[str, Any]] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "rows": self.shape.task_rows * self.shape.tasks}


# --- the scenarios -----------------------------------------------------------------------------


class Bench:
    """The harness on a quota-mode stack: ``stack``'s ``kinesis`` and ``dynamodb`` are the
    proxies, its ``kinesis_emulator`` and ``dynamodb_emulator_endpoint`` what they front."""

    def __init__(
        self,
        stack: emulators.Endpoints,
        shape: Shape,
        *,
        timing: Mapping[str, str] = TIMING,
        say: Callable[[str], None] = lambda _: None,
    ) -> None:
        require_proxies(stack)
        self.stack = stack
        self.shape = shape
        self._timing = dict(timing)
        self._say = say

    def streams(self, scenarios: Sequence[str]) -> dict[str, dict[str, str]]:
        """``format("keo")`` options per scenario: a new stream and table each, through the
        proxies (created on the emulators: setting up counts nothing)."""
        made = proxied_streams(self.stack, scenarios, shards=self.shape.shards)
        return {
            scenario: {
                **options,
                **self._timing,
                "dedupe": "replay",
                "run_id": f"{options['stream']}-run",
            }
            for scenario, options in made.items()
        }

    def rows(self, scenario: str) -> Rows:
        return Rows(scenario, self.shape.tasks, self.shape.task_rows)

    def query(
        self,
        name: str,
        options: Mapping[str, str],
        rows: Rows,
        *,
        arming: Arming = nothing_armed,
        kill_at_rows: int = 0,
    ) -> tuple[QueryFigures, TaskRun]:
        """One execution of the write: planned and committed in driver processes, its tasks in
        the workers. With ``kill_at_rows``, the workers are killed once that many rows were
        written and nothing is committed; nor when a task failed too often."""
        from spark_jobs.datasource import KeoArrowWriter

        stack, shape = self.stack, self.shape
        self._say(f"scale: {name}: {shape.tasks} tasks in {shape.workers} workers")
        before = Counted.now(stack)
        started = time.monotonic()
        plan = on_the_driver(plan_write, options)
        writer = KeoArrowWriter(plan)
        commit_s = None
        with (
            Workers(shape.workers, writer, rows) as workers,
            PutWatch(
                stack.kinesis, options["stream"], then_at_rows=kill_at_rows, then=workers.kill
            ) as watch,
        ):
            run = run_tasks(workers, shape.tasks, arming)
        # an execution to be killed never commits, even when its tasks outran the kill: its
        # driver is gone with its workers
        if run.complete and not kill_at_rows:
            on_the_driver(commit_write, plan, run.messages())
            commit_s = time.monotonic() - started
        after = Counted.now(stack)
        calls = calls_between(before, after)
        figures = QueryFigures(
            query=name,
            attempts=len(run.ends),
            failed_attempts=run.failures(),
            committed=commit_s is not None,
            control_plane={op: n for op, n in calls.items() if is_control_plane(op)},
            calls=calls,
            reads_per_shard=reads_per_shard(before, after, options["stream"], shape.shards),
            throttles=throttles_between(before, after),
            rows=_rows_counted(run),
            first_put_s=_since(watch.first_put_at, started),
            commit_s=round(commit_s, 2) if commit_s is not None else None,
        )
        self._say(f"scale: {name}: {_said(figures)}")
        return figures, run

    def busiest_ledger_item(self, options: Mapping[str, str]) -> dict[str, Any]:
        busiest: dict[str, Any] = proxy_counters(self.stack.dynamodb)["busiest_write_keys"]
        return dict(busiest.get(options["table"], {}))

    def most_written_ledger_items(self, options: Mapping[str, str]) -> list[dict[str, Any]]:
        most: dict[str, Any] = proxy_counters(self.stack.dynamodb).get("most_written_keys", {})
        return list(most.get(options["table"], []))[:_MOST_WRITTEN_REPORTED]

    def audit(self, options: Mapping[str, str], rows: Rows) -> AuditFigures:
        """The stream read back from the emulator (no quota taken), row by row."""
        from kinesis_store.reader import KinesisReader

        direct = {**options, "kinesis_endpoint_url": str(self.stack.kinesis_emulator)}
        settings = producer_settings(as_env(direct))
        reader = KinesisReader(kinesis_read_client(settings), settings.stream)
        report = audit_rows(reader, rows.expected())
        audit = AuditFigures(
            rows=rows.count,
            missing=report.count(RowAnomaly.MISSING),
            duplicated=report.count(RowAnomaly.DUPLICATED),
            unexpected=report.count(RowAnomaly.UNEXPECTED),
        )
        self._say(f"scale: audit {options['stream']}: {'exact' if audit.exact else audit}")
        return audit

    def scenario(self, scenario: str, options: Mapping[str, str]) -> ScenarioFigures:
        rows = self.rows(scenario)
        if scenario == "clean":
            queries = [self.query("clean", options, rows)[0]]
        elif scenario in ("killed", "killed-later"):
            killed, _ = self.query("killed", options, rows, kill_at_rows=max(1, rows.count // 2))
            if scenario == "killed-later":  # the driver restarted once the killed leases ended
                time.sleep(float(self._timing["lease_s"]) + 2 * float(self._timing["clock_skew_s"]))
            replay, _ = self.query("replay", options, rows)
            replay.recover_s = replay.commit_s
            queries = [killed, replay]
        elif scenario == "retry-wave":
            wave, run = self.query("retry wave", options, rows, arming=retry_wave)
            wave.recover_s = _recovery_s(run)
            queries = [wave]
        else:
            raise ValueError(f"unknown scenario {scenario!r}: one of {', '.join(SCENARIOS)}")
        return ScenarioFigures(
            scenario=scenario,
            shape=self.shape,
            queries=queries,
            busiest_ledger_item=self.busiest_ledger_item(options),
            audit=self.audit(options, rows),
            most_written_ledger_items=self.most_written_ledger_items(options),
        )


def _schema() -> Any:
    from pyspark.sql.types import StringType, StructField, StructType

    return StructType([StructField("key", StringType()), StructField("data", StringType())])


def _since(moment: float | None, started: float) -> float | None:
    return round(moment - started, 2) if moment is not None else None


def _rows_counted(run: TaskRun) -> dict[str, int]:
    counted: Counter[str] = Counter()
    for message in run.done.values():
        counted.update(message.report.counts)
    return {name: n for name, n in counted.items() if n}


def _recovery_s(run: TaskRun) -> float | None:
    """From the first failed attempt's end to the last retry's end."""
    failed = [at for at, end in run.ends if end.error is not None]
    retried = [at for at, end in run.ends if end.attempt.number > 0]
    if not failed or not retried:
        return None
    return round(max(retried) - min(failed), 2)


def _said(figures: QueryFigures) -> str:
    return (
        f"attempts={figures.attempts} failed={figures.failed_attempts} "
        f"committed={figures.committed} control_plane={figures.control_plane} "
        f"throttles={figures.throttles} commit_s={figures.commit_s}"
    )


def measure(
    stack: emulators.Endpoints,
    shape: Shape,
    scenarios: Sequence[str] = SCENARIOS,
    *,
    timing: Mapping[str, str] = TIMING,
    say: Callable[[str], None] = lambda _: None,
) -> list[ScenarioFigures]:
    """Each scenario on ``stack`` (the quota mode's proxies), one after another."""
    bench = Bench(stack, shape, timing=timing, say=say)
    say(f"scale: creating {len(scenarios)} streams of {shape.shards} shards and their tables")
    streams = bench.streams(scenarios)
    return [bench.scenario(scenario, streams[scenario]) for scenario in scenarios]


# --- the table ---------------------------------------------------------------------------------


def _calls(counted: Mapping[str, int]) -> str:
    return ", ".join(f"{op} {n}" for op, n in counted.items()) or "none"


def _seconds(value: float | None) -> str:
    return f"{value:g}" if value is not None else "-"


def render(figures: Sequence[ScenarioFigures]) -> str:
    """The markdown table: one line per query."""
    lines = [
        "| scenario | query | T / W / S, rows | attempts (failed) | control plane per query "
        "| GetShardIterator / shard: max, mean | GetRecords / shard: max, mean | throttles "
        "| busiest ledger item: writes/s | first put s | commit s | recover s | audit |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for scenario in figures:
        shape, audit = scenario.shape, scenario.audit
        busiest = scenario.busiest_ledger_item.get("peak_writes_per_s", 0)
        verdict = audit.verdict()
        for query in scenario.queries:
            iterators = query.reads_per_shard["GetShardIterator"]
            records = query.reads_per_shard["GetRecords"]
            failed = sum(query.failed_attempts.values())
            lines.append(
                f"| {scenario.scenario} | {query.query} "
                f"| {shape.tasks} / {shape.workers} / {shape.shards}, {audit.rows} "
                f"| {query.attempts} ({failed}) | {_calls(query.control_plane)} "
                f"| {iterators.max}, {iterators.mean:g} | {records.max}, {records.mean:g} "
                f"| {_calls(query.throttles)} | {busiest} | {_seconds(query.first_put_s)} "
                f"| {_seconds(query.commit_s)} | {_seconds(query.recover_s)} | {verdict} |"
            )
    return "\n".join(lines)


# --- the command line --------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """``python -m devstack.scale_bench --tasks T --workers W --shards S``: on a quota-mode
    stack of its own, started in a temporary folder and stopped at the end."""
    parser = argparse.ArgumentParser(
        prog="python -m devstack.scale_bench", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--tasks", type=int, default=20, help="T: task attempts a query")
    parser.add_argument("--workers", type=int, default=8, help="W: worker processes")
    parser.add_argument("--shards", type=int, default=64, help="S: the stream's shards")
    parser.add_argument(
        "--rows-per-task", type=int, default=0, help="rows a task (0: 50, fewer past 80 tasks)"
    )
    parser.add_argument("--scenario", choices=(*SCENARIOS, "all"), default="all")
    parser.add_argument("--lease-s", type=float, default=float(TIMING["lease_s"]))
    parser.add_argument("--out", type=Path, help="JSON results (default: bench/results/...)")
    args = parser.parse_args(argv)
    shape = Shape(args.tasks, args.workers, args.shards, args.rows_per_task)
    scenarios = SCENARIOS if args.scenario == "all" else (args.scenario,)
    timing = {**TIMING, "lease_s": f"{args.lease_s:g}"}

    def say(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    with ExitStack() as cleanup:
        say("scale: starting the local stack in its quota mode")
        stack = quota_stack(cleanup, prefix="keo-scale-")
        figures = measure(stack, shape, scenarios, timing=timing, say=say)
    out = args.out or Path("bench/results") / (
        f"scale-{time.strftime('%Y-%m-%d')}-T{shape.tasks}-W{shape.workers}-S{shape.shards}.json"
    )
    write({"timing": timing, "scenarios": [f.as_json() for f in figures]}, out)
    print(render(figures))
    say(f"scale: figures written to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
