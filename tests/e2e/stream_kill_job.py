"""Run by test_spark_stream_kill.py as a ``local[3]`` driver in a process of its own, which the
test kills with SIGKILL in the middle of a micro-batch, then runs again from the same
checkpoints.

    python stream_kill_job.py '{"work_dir": ..., "settings": {KEO_*}, "source": "A",
                                "target": "B", "query": ..., "max_records_per_trigger": 40,
                                "stop": true | false}'

Two streaming queries read stream A with ``readStream.format("keo")`` at once, each with
``Trigger.AvailableNow`` and its own checkpoint under ``work_dir``:

- **files**: A's rows into parquet files (``work_dir/files``), Spark's file sink;
- **relay**: A into stream B with ``writeStream.format("keo")`` in replay mode
  (:func:`spark_jobs.relay.start_relay`).

With ``stop``, three tasks of micro-batch 1 freeze themselves (SIGSTOP), once each, a thread
of ``local[3]`` each: the files query's partition 0 as its first row is converted (an
identity UDF on the key), before its part file holds a row; the relay's partition 0 right
after its PutRecords and its partition 1 right before its own (failpoints ``after_put=stop``
and ``before_put=stop`` in those tasks only, :class:`cluster_job.OnTasks`). Batch 0 of both
queries is committed by then. The test waits for the three frozen processes, then kills.

Without ``stop``, once both queries end, the rows of the file sink's output (read back
through its log, as any Spark reader does) are printed as one JSON line:
``{"step": "files", "rows": [[shard_id, sequence_number, sub_sequence_number], ...],
"files_on_disk": n, "files_in_log": m}``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import cluster_job
from cluster_job import OnTasks, TaskFailpoint, report
from pyspark import TaskContext, cloudpickle
from pyspark.sql.functions import col, udf

import spark_jobs
from producer.hooks import NO_HOOKS, Step
from spark_jobs.options import setting_options
from spark_jobs.relay import start_relay
from spark_jobs.session import SHORT_LIVED_JVM, local_session

# OnTasks travels to the Python workers by value: they cannot import this folder's modules
cloudpickle.register_pickle_by_value(cluster_job)

FROZEN_BATCH, FROZEN_PARTITION = 1, 0
FROZEN_TASKS = 3  # the files query's partition 0, the relay's partitions 0 and 1


def freezing_key(marks: str) -> Any:
    """The identity on the key column, except that the first row of partition 0 of batch 1
    stops its Python worker (once: the mark it leaves says so)."""

    def key(value: str) -> str:
        context = TaskContext.get()
        if (
            context is not None
            and context.getLocalProperty("streaming.sql.batchId") == str(FROZEN_BATCH)
            and context.partitionId() == FROZEN_PARTITION
            and not any(Path(marks).glob("files-*"))
        ):
            Path(marks, f"files-b{FROZEN_BATCH}-p{FROZEN_PARTITION}-pid{os.getpid()}").touch()
            os.kill(os.getpid(), signal.SIGSTOP)
        return value

    return udf(key, "string")


def start_files(spark: Any, job: dict[str, Any], marks: str | None) -> Any:
    work_dir = Path(job["work_dir"])
    frame = (
        spark.readStream.format("keo")
        .options(**{**setting_options(job["settings"]), "stream": job["source"]})
        .option("max_records_per_trigger", str(job["max_records_per_trigger"]))
        .load()
    )
    if marks is not None:
        frame = frame.withColumn("key", freezing_key(marks)(col("key")))
    return (
        frame.writeStream.format("parquet")
        .option("path", str(work_dir / "files"))
        .option("checkpointLocation", str(work_dir / "files-checkpoint"))
        .trigger(availableNow=True)
        .start()
    )


def start_relay_query(spark: Any, job: dict[str, Any]) -> Any:
    return start_relay(
        spark,
        settings=job["settings"],
        source=job["source"],
        target=job["target"],
        checkpoint=str(Path(job["work_dir"]) / "relay-checkpoint"),
        query_name=job["query"],
        max_records_per_trigger=job["max_records_per_trigger"],
    )


def main() -> None:
    job = json.loads(sys.argv[1])
    work_dir = Path(job["work_dir"])
    marks = logs = None
    if job["stop"]:
        marks, logs = work_dir / "marks", work_dir / "logs"
        for folder in (marks, logs):
            folder.mkdir(parents=True, exist_ok=True)
    spark = local_session(
        "keo-stream-kill-test", threads=FROZEN_TASKS, java_options=SHORT_LIVED_JVM
    )
    try:
        if marks is not None and logs is not None:
            failpoints = (
                TaskFailpoint(FROZEN_BATCH, 0, attempt=0, step=Step.AFTER_PUT.value, action="stop"),
                TaskFailpoint(
                    FROZEN_BATCH, 1, attempt=0, step=Step.BEFORE_PUT.value, action="stop"
                ),
            )
            hooks = OnTasks(failpoints, str(marks), str(logs), NO_HOOKS)
            spark_jobs.register(spark, hooks=hooks)
        else:
            spark_jobs.register(spark)
        report("session", pid=os.getpid())
        queries = [
            start_files(spark, job, None if marks is None else str(marks)),
            start_relay_query(spark, job),
        ]
        for query in queries:
            query.awaitTermination()
            if query.exception() is not None:
                raise RuntimeError(f"query {query.name or query.id} failed: {query.exception()}")
        output = spark.read.parquet(str(work_dir / "files"))
        rows = output.select("shard_id", "sequence_number", "sub_sequence_number").collect()
        report(
            "files",
            rows=[list(row) for row in rows],
            files_on_disk=len(list((work_dir / "files").glob("*.parquet"))),
            files_in_log=len(output.inputFiles()),
        )
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
