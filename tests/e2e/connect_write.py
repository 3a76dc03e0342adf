"""Run by test_spark_connect.py in a process of its own (PySpark refuses a Spark Connect
session in a process that holds a classic one): on a local Spark Connect session, write rows
with format("keo") (key mode; then other rows twice in replay mode under one run id) and read
them back.

    python connect_write.py '{"options": {...}, "rows": [[key, data], ...]}'

Prints one JSON line: what the session was, whether it had df.rdd, and how many rows the
read found.
"""

from __future__ import annotations

import json
import sys

import spark_jobs
from spark_jobs import audit as spark_audit
from spark_jobs.session import local_connect_session


def main() -> None:
    job = json.loads(sys.argv[1])
    spark = local_connect_session("keo-connect-test")
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
        result = {
            "session": type(spark).__module__,
            "has_rdd": has_rdd,
            "read": read,
            "audit": {"clean": report.clean, "user_records": report.user_records},
        }
    finally:
        spark.stop()
    sys.stdout.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
