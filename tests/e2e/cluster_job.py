"""Run by test_spark_cluster.py and test_spark_cluster_replay.py as the driver of a
``local-cluster[2,1,1024]`` session (two executor JVMs, each with its own Python workers), in a
process of its own: a process has one SparkContext, and the tests kill this one with SIGKILL.

    python cluster_job.py '{"run": "first", "work_dir": ..., "options": {...}, "stream": {...},
                            "sink": "format" | "foreach_batch", "partitions": 2,
                            "batch_rows": [[key, data], ...] | null,
                            "read": "format" | "read_records" | null,
                            "stream_read": {"settings": {KEO_*...}, "checkpoint": ...} | null,
                            "task_failpoints": [{...}, ...],
                            "driver_failpoints": [{...}, ...],
                            "start_when": path | null}'

Once its session is up (and, with ``start_when``, that file exists: a test starts a driver's
cluster while another driver runs, and lets it go later), in order: the streaming query (JSON event files -> ``writeStream.format("keo")``, or with
``"sink": "foreach_batch"`` ``writeStream.foreachBatch(ExactlyOnceSink(...))``, which Spark
3.5 runs too; available now, one file per micro-batch, ``"partitions"`` tasks each (2 unless
the job says); with
``"relay_from": S, "per_trigger": N`` in ``"stream"``, ``readStream.format("keo")`` of Kinesis
stream S, N records a micro-batch, instead of the files: a relay), then the batch
write of ``batch_rows``, then a read of the stream (``spark.read.format("keo")``, or
``spark_jobs.read_records``), then ``spark.readStream.format("keo")`` of a
stream of its own across a split and a merge (:func:`run_stream_read`). ``KEO_FAILPOINTS``
arms the data source's hooks for all of them, in every batch (``batch_before_complete=stop``
freezes the driver's commit of the first batch, after the executors' puts and before the batch
is recorded); ``task_failpoints`` arm a step in one task attempt only, ``driver_failpoints`` a
driver step in one micro-batch only (:class:`OnTasks`). Each
executor-side put leaves a file ``<work_dir>/where/<run>-<step>/executor-<id>-pid-<pid>``, so
the test sees which executors did the work, and every Python process that reaches a hook logs
the product's INFO lines to ``<work_dir>/logs/<pid>.log`` (with ``"sink": "foreach_batch"``, the
driver's own from its start: the sink plans a replay's recovery there before any hook). Prints
one JSON line per finished step, at once, with the seconds since the start.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql.functions import expr
from stream_reads import WAVES, Batches, merge, put_resharded_wave, run_query, split

import spark_jobs
from devstack.failpoints import Failpoints, from_env
from producer.clients import kinesis_client
from producer.hooks import Hooks, Step
from spark_jobs.produce_stream import EVENT_SCHEMA
from spark_jobs.session import SHORT_LIVED_JVM, cluster_session
from spark_jobs.sink import ExactlyOnceSink
from spark_jobs.writer import producer_settings, settings_from_env

PARTITIONS = 2  # a micro-batch's and the batch write's, unless the job says
FIRST_SHARD = "shardId-000000000000"
# The working directory of the JVM that evaluates it, in the JVM (no Python worker of its own):
# an executor's is <SPARK_HOME>/work/<application id>/<executor id>
WORKING_DIRECTORY = "reflect('java.lang.System', 'getProperty', 'user.dir')"


@dataclass(frozen=True)
class WhereItRan:
    """Hooks that note the executor and Python worker of every put, then pass the step on.

    Defined in ``__main__``, so cloudpickle ships the class by value to the executors. A
    standalone executor's working directory, which its Python workers inherit, is
    ``<SPARK_HOME>/work/<application id>/<executor id>``.
    """

    folder: str
    then: Hooks

    def at(self, step: Step, *, batch_id: int | None = None) -> None:
        if step is Step.BEFORE_PUT:
            executor = Path.cwd()
            if executor.parent.name.startswith("app-"):
                name = f"executor-{executor.name}-pid-{os.getpid()}"
                Path(self.folder, name).touch()
        self.then.at(step, batch_id=batch_id)


# the product's loggers, whose INFO lines say what each attempt did (its recovery step, a wait,
# a put the fence refused, a lease lost)
LOGGED = ("producer", "spark_jobs", "kinesis_store", "dedupe_store")


@dataclass(frozen=True)
class TaskFailpoint:
    """``action`` (a failpoint action) the ``nth`` time one task attempt reaches ``step``: the
    task of ``partition`` in micro-batch ``batch``, Spark's attempt ``attempt`` of it; once in
    the scenario (the file it leaves says so), as a stage that Spark runs again numbers its
    task attempts from 0 again."""

    batch: int
    partition: int
    attempt: int
    step: str
    action: str
    nth: int = 1


@dataclass(frozen=True)
class DriverFailpoint:
    """``action`` (a failpoint action) when the driver reaches ``step`` (a driver step:
    ``batch_after_puts``, ``batch_before_complete``) for micro-batch ``batch`` only, once in
    the scenario; ``KEO_FAILPOINTS`` acts at its step in every batch."""

    batch: int
    step: str
    action: str


@dataclass(frozen=True)
class OnTasks:
    """Hooks that act in chosen task attempts only (:class:`TaskFailpoint`, matched from the
    task's ``TaskContext``) and in the driver's steps of chosen batches (:class:`DriverFailpoint`:
    no ``TaskContext`` there, the step says which batch), log the product's INFO lines of every
    Python process they run in to ``<logs>/<pid>.log``, then pass the step on. Defined in
    ``__main__``: shipped by value.

    A task attempt stopped here first leaves its executor's session (``setsid``): a process of
    a frozen machine outlives what the cluster does meanwhile, and resumes when the test sends
    SIGCONT. Without it, the death of its executor would orphan its process group, and the
    kernel would resume it at once (SIGHUP, then SIGCONT, to a stopped orphaned group). A
    driver's process stopped here (its commit of the batch) stays where it is: the test resumes
    or kills it.
    """

    failpoints: tuple[TaskFailpoint, ...]
    # a file per failpoint reached: <action>-b<batch>-p<partition>-a<attempt>-pid<pid>, or
    # <action>-b<batch>-driver-pid<pid>
    marks: str
    logs: str
    then: Hooks
    on_driver: tuple[DriverFailpoint, ...] = ()
    reached: Counter[tuple[int, str]] = field(default_factory=Counter, compare=False)

    def at(self, step: Step, *, batch_id: int | None = None) -> None:
        self._log_here()
        from pyspark import TaskContext

        context = TaskContext.get()
        if context is not None:
            batch = context.getLocalProperty("streaming.sql.batchId")
            self.reached[(context.taskAttemptId(), step.value)] += 1
            for failpoint in self.failpoints:
                if (
                    failpoint.step == step.value
                    and str(failpoint.batch) == batch
                    and failpoint.partition == context.partitionId()
                    and failpoint.attempt == context.attemptNumber()
                    and failpoint.nth == self.reached[(context.taskAttemptId(), step.value)]
                ):
                    name = f"b{failpoint.batch}-p{failpoint.partition}-a{failpoint.attempt}"
                    self._act(name, failpoint.step, failpoint.action, leave_session=True)
        else:
            for on_driver in self.on_driver:
                if on_driver.step == step.value and on_driver.batch == batch_id:
                    name = f"b{on_driver.batch}-driver"
                    self._act(name, on_driver.step, on_driver.action, leave_session=False)
        self.then.at(step, batch_id=batch_id)

    def _act(self, where: str, step: str, action: str, *, leave_session: bool) -> None:
        name = f"{action}-{where}"
        if any(Path(self.marks).glob(f"{name}-pid*")):
            return  # acted once already: a stage run again numbers its task attempts from 0
        Path(self.marks, f"{name}-pid{os.getpid()}").touch()
        if action == "stop" and leave_session:
            os.setsid()
        Failpoints(f"{step}={action}").at(Step(step))

    def _log_here(self) -> None:
        log_to(self.logs)


def log_to(logs: str) -> None:
    """The product's INFO lines of this process to ``<logs>/<pid>.log`` (once a process)."""
    path = str(Path(logs, f"{os.getpid()}.log"))
    logged = logging.getLogger(LOGGED[0]).handlers
    if any(getattr(handler, "baseFilename", None) == path for handler in logged):
        return
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(created).3f %(name)s %(levelname)s %(message)s"))
    for name in LOGGED:
        logger = logging.getLogger(name)
        logger.setLevel(logging.INFO)
        logger.addHandler(handler)


STARTED = time.monotonic()


def report(step: str, **facts: Any) -> None:
    elapsed_s = round(time.monotonic() - STARTED, 1)
    sys.stdout.write(json.dumps({"step": step, "elapsed_s": elapsed_s, **facts}) + "\n")
    sys.stdout.flush()


def hooks_of(job: dict[str, Any], step: str) -> Hooks:
    """The job's hooks for ``step``: where each put ran, its failpoints, the logs."""
    work_dir = Path(job["work_dir"])
    folders = [work_dir / "where" / f"{job['run']}-{step}", work_dir / "marks", work_dir / "logs"]
    for folder in folders:
        folder.mkdir(parents=True, exist_ok=True)
    failpoints = tuple(TaskFailpoint(**spec) for spec in job.get("task_failpoints", []))
    on_driver = tuple(DriverFailpoint(**spec) for spec in job.get("driver_failpoints", []))
    on_tasks = OnTasks(failpoints, str(folders[1]), str(folders[2]), from_env(), on_driver)
    return WhereItRan(str(folders[0]), on_tasks)


def register(spark: Any, job: dict[str, Any], step: str) -> None:
    spark_jobs.register(spark, hooks=hooks_of(job, step))


def _source(spark: Any, job: dict[str, Any]) -> Any:
    """The streaming query's rows: one event file a micro-batch, or with ``relay_from`` the
    records of that Kinesis stream, ``per_trigger`` a micro-batch (a relay); the job's
    partitions."""
    stream = job["stream"]
    if stream.get("relay_from"):
        read = {
            **job["options"],
            "stream": stream["relay_from"],
            "starting_position": "trim_horizon",
            "max_records_per_trigger": str(stream["per_trigger"]),
        }
        events = spark.readStream.format("keo").options(**read).load().select("key", "data")
    else:
        events = spark.readStream.schema(EVENT_SCHEMA).option("maxFilesPerTrigger", 1)
        events = events.json(stream["source"])
    return events.repartition(job.get("partitions", PARTITIONS))


def run_stream(spark: Any, job: dict[str, Any]) -> None:
    stream = job["stream"]
    if stream.get("relay_from") or job.get("sink") != "foreach_batch":
        # format("keo"), the relay's reader or the query's writer (Spark 4's: the sink runs
        # on Spark 3.5 too)
        register(spark, job, "stream")
    events = _source(spark, job)
    routing = {} if stream.get("relay_from") else {"routing_key_column": "routing_key"}
    if job.get("sink") == "foreach_batch":
        # the query's name keys its batches in the ledger, as format("keo")'s query_name does
        sink = ExactlyOnceSink(
            settings_from_env({}, **job["options"]),
            routing_key_column="routing_key",
            query_id=stream["query_name"],
            hooks=hooks_of(job, "stream"),
        )
        # the sink runs here, in the driver's process: its lines (a replay's recovery planned
        # before the tasks) logged from the start
        log_to(str(Path(job["work_dir"], "logs")))
        writing = events.writeStream.foreachBatch(sink)
    else:
        writing = (
            events.writeStream.format("keo")
            .options(**job["options"], **routing)
            .option("query_name", stream["query_name"])
        )
    query = (
        writing.option("checkpointLocation", stream["checkpoint"])
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    # Spark 3.5 gives each progress as a dict, Spark 4 as an object
    batches = [
        progress["batchId"] if isinstance(progress, dict) else progress.batchId
        for progress in query.recentProgress
    ]
    report("stream", batches=batches)


def run_batch(spark: Any, job: dict[str, Any]) -> None:
    register(spark, job, "batch")
    rows = [tuple(row) for row in job["batch_rows"]]
    frame = spark.createDataFrame(rows, "key string, data string")
    frame = frame.repartition(job.get("partitions", PARTITIONS))
    frame.write.format("keo").mode("append").options(**job["options"]).save()
    report("batch", rows=len(rows))


def run_read(spark: Any, job: dict[str, Any]) -> None:
    if job["read"] == "read_records":
        frame = spark_jobs.read_records(spark, job["options"])
    else:
        frame = spark.read.format("keo").options(**job["options"]).load()
    found = frame.select("key").collect()
    keys = Counter(row.key for row in found)
    report("read", keys=keys)


class ByExecutor(Batches):
    """:class:`Batches` of a read with a ``working_directory`` column: notes the executors
    whose tasks read the rows."""

    def __init__(self) -> None:
        super().__init__()
        self.executors: set[str] = set()

    def __call__(self, frame: Any, batch_id: int) -> None:
        rows = frame.collect()
        self.executors.update(Path(row.working_directory).name for row in rows)
        self.keep(batch_id, rows)


def run_stream_read(spark: Any, job: dict[str, Any]) -> None:
    """``spark.readStream.format("keo")`` of a stream of two shards, from one checkpoint, in
    three availableNow runs: a wave of records (``put_resharded_wave``), a run; shard 0 split,
    a wave, a run; its children merged, a wave, a run. Reports each run's batch ids, every
    batch's rows, the shards, and the executors that read rows."""
    spec = job["stream_read"]
    settings = producer_settings(spec["settings"])
    kinesis = kinesis_client(settings, for_put=False)
    sink, runs = ByExecutor(), []

    def read_a_wave(wave: str) -> None:
        put_resharded_wave(kinesis, settings.stream, wave)
        earlier = set(sink.rows)
        run_query(
            spark,
            spec["settings"],
            Path(spec["checkpoint"]),
            sink,
            through=lambda frame: frame.withColumn("working_directory", expr(WORKING_DIRECTORY)),
        )
        runs.append(sorted(set(sink.rows) - earlier))

    before, after_split, after_merge = WAVES
    read_a_wave(before)
    children = split(kinesis, settings.stream, FIRST_SHARD)
    read_a_wave(after_split)
    merged = merge(kinesis, settings.stream, children)
    read_a_wave(after_merge)
    report(
        "stream_read",
        runs=runs,
        batches=[
            [batch_id, [[*row[:4], bytes(row[4]).decode()] for row in rows]]
            for batch_id, rows in sorted(sink.rows.items())
        ],
        replayed=len(sink.replayed),
        shards={"parent": FIRST_SHARD, "children": children, "merged": merged},
        executors=sorted(sink.executors),
    )


def _wait_for_file(path: Path) -> None:
    """Until ``path`` exists: the test's go (it kills this driver if it never comes)."""
    while not path.exists():
        time.sleep(0.1)


def main() -> None:
    job = json.loads(sys.argv[1])
    # three JVMs a driver (its own, two executors'): a session 9 -> 6 s
    spark = cluster_session("keo-cluster-test", Path(job["work_dir"]), java_options=SHORT_LIVED_JVM)
    try:
        executors = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1
        report("session", pid=os.getpid(), executors=executors)
        if job.get("start_when"):
            _wait_for_file(Path(job["start_when"]))
        run_stream(spark, job)
        if job["batch_rows"]:
            run_batch(spark, job)
        if job["read"]:
            run_read(spark, job)
        if job["stream_read"]:
            run_stream_read(spark, job)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
