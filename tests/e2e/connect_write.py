"""Run by test_spark_connect.py in a process of its own (PySpark refuses a Spark Connect
session in a process that holds a classic one): on a local Spark Connect session, write rows
with format("keo") (key mode; then other rows twice in replay mode under one run id) and read
them back, in a batch read and in a streaming read (readStream.format("keo"), availableNow,
into a memory sink).

    python connect_write.py '{"options": {...}, "rows": [[key, data], ...], "checkpoint": ...}'

Prints one JSON line: what the session was, whether it had df.rdd, how many rows the read
found (format("keo") and read_records), and each row the streaming read gave (shard, sequence number, sub-sequence number, key).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import spark_jobs
from spark_jobs import audit as spark_audit
from spark_jobs.session import SHORT_LIVED_JVM, local_connect_session


def main() -> None:
    job = json.loads(sys.argv[1])
    spark = local_connect_session("keo-connect-test", java_options=SHORT_LIVED_JVM)
    try:
        spark_jobs.register(spark)
        frame = spark.createDataFrame([tuple(r) for r in job["rows"]], "key string, data string")
        try:
            has_rdd = frame.rdd is not None
        except Exception:
            has_rdd = False
        frame.write.format("keo").mode("append").options(**job["options"]).save()
        report = spark_audit.audit(spark, job["settings"], expected=None)
        # replay mode, the same write twice under one run_id: the second sends nothing
        replay = {**job["options"], "dedupe": "replay", "run_id": "connect-run"}
        replayed = spark.createDataFrame(
            [tuple(r) for r in job["replay_rows"]], "key string, data string"
        )
        for _ in range(2):
            replayed.write.format("keo").mode("append").options(**replay).save()
        read = spark.read.format("keo").options(**job["options"]).load().count()
        records = spark_jobs.read_records(spark, job["options"]).count()
        result = {
            "session": type(spark).__module__,
            "has_rdd": has_rdd,
            "read": read,
            "read_records": records,
            "audit": {"clean": report.clean, "user_records": report.user_records},
            "streamed": stream_read(spark, job),
        }
    finally:
        spark.stop()
    sys.stdout.write(json.dumps(result) + "\n")


def stream_read(spark: Any, job: dict[str, Any]) -> list[list[Any]]:
    """The stream read by a streaming query, in batches of 25 at most, until it stops."""
    query = (
        spark.readStream.format("keo")
        .options(**job["options"], max_records_per_trigger="25")
        .load()
        .writeStream.format("memory")
        .queryName("keo_connect_stream")
        .option("checkpointLocation", job["checkpoint"])
        .trigger(availableNow=True)
        .start()
    )
    if not query.awaitTermination(180):
        raise RuntimeError("the availableNow query did not stop")
    rows = spark.sql(
        "SELECT shard_id, sequence_number, sub_sequence_number, key FROM keo_connect_stream"
    ).collect()
    return [list(row) for row in rows]


if __name__ == "__main__":
    main()
