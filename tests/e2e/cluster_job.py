"""Run by test_spark_cluster.py as the driver of a ``local-cluster[2,1,1024]`` session (two
executor JVMs, each with its own Python workers), in a process of its own: a process has one
SparkContext, and the test kills this one with SIGKILL.

    python cluster_job.py '{"run": "first", "work_dir": ..., "options": {...}, "stream": {...},
                            "batch_rows": [[key, data], ...] | null, "read": true | false}'

In order: the streaming query (JSON event files -> ``writeStream.format("keo")``, available
now, one file per micro-batch, two partitions each), then the batch write of ``batch_rows``,
then ``spark.read.format("keo")`` of the stream. ``KEO_FAILPOINTS`` arms the data source's
hooks for all of them (``batch_before_complete=stop`` freezes the driver's commit of the first
batch, after the executors' puts and before the batch is recorded). Each executor-side put
leaves a file ``<work_dir>/where/<run>-<step>/executor-<id>-pid-<pid>``, so the test sees which
executors did the work. Prints one JSON line per finished step, at once, with the seconds since the start.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import spark_jobs
from devstack.failpoints import from_env
from producer.hooks import Hooks, Step
from spark_jobs.produce_stream import EVENT_SCHEMA
from spark_jobs.session import cluster_session

PARTITIONS = 2


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


STARTED = time.monotonic()


def report(step: str, **facts: Any) -> None:
    elapsed_s = round(time.monotonic() - STARTED, 1)
    sys.stdout.write(json.dumps({"step": step, "elapsed_s": elapsed_s, **facts}) + "\n")
    sys.stdout.flush()


def register(spark: Any, job: dict[str, Any], step: str) -> None:
    folder = Path(job["work_dir"], "where", f"{job['run']}-{step}")
    folder.mkdir(parents=True, exist_ok=True)
    spark_jobs.register(spark, hooks=WhereItRan(str(folder), from_env()))


def run_stream(spark: Any, job: dict[str, Any]) -> None:
    register(spark, job, "stream")
    stream = job["stream"]
    query = (
        spark.readStream.schema(EVENT_SCHEMA)
        .option("maxFilesPerTrigger", 1)
        .json(stream["source"])
        .repartition(PARTITIONS)
        .writeStream.format("keo")
        .options(**job["options"], routing_key_column="routing_key")
        .option("query_name", stream["query_name"])
        .option("checkpointLocation", stream["checkpoint"])
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    batches = [progress.batchId for progress in query.recentProgress]
    report("stream", batches=batches)


def run_batch(spark: Any, job: dict[str, Any]) -> None:
    register(spark, job, "batch")
    rows = [tuple(row) for row in job["batch_rows"]]
    frame = spark.createDataFrame(rows, "key string, data string").repartition(PARTITIONS)
    frame.write.format("keo").mode("append").options(**job["options"]).save()
    report("batch", rows=len(rows))


def run_read(spark: Any, job: dict[str, Any]) -> None:
    found = spark.read.format("keo").options(**job["options"]).load().select("key").collect()
    keys = Counter(row.key for row in found)
    report("read", keys=keys)


def main() -> None:
    job = json.loads(sys.argv[1])
    spark = cluster_session("keo-cluster-test", Path(job["work_dir"]))
    try:
        executors = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1
        report("session", pid=os.getpid(), executors=executors)
        run_stream(spark, job)
        if job["batch_rows"]:
            run_batch(spark, job)
        if job["read"]:
            run_read(spark, job)
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
