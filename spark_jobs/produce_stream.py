"""A runnable Structured Streaming job: JSON event files -> Kinesis, exactly once per key.

Example::

    python -m spark_jobs.produce_stream --source data/in --checkpoint data/ckpt \\
        --stream orders --table orders-ledger --dead-letter data/dlq

Events are JSON lines ``{"key": ..., "data": ..., "routing_key": ...}`` (``routing_key`` may
be null or absent). Every other setting comes from ``KEO_*`` variables, as for ``keo send``
(endpoints, lease, timeouts). The master is ``local[*]`` unless one is set (``--master`` or
``spark-submit``). The query's id lives in the checkpoint, so a restart with the same
checkpoint replays an unfinished batch under the same id, and the sink's batch ledger and the
per-key claims keep the replay from adding anything.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import Any

from spark_jobs.session import job_session
from spark_jobs.sink import ExactlyOnceSink
from spark_jobs.writer import settings_from_env

log = logging.getLogger(__name__)

EVENT_SCHEMA = "key string, data string, routing_key string"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m spark_jobs.produce_stream",
        description="Stream JSON event files into Kinesis exactly once per key.",
    )
    parser.add_argument("--source", required=True, help="directory of JSON event files")
    parser.add_argument("--checkpoint", required=True, help="the query's checkpoint directory")
    parser.add_argument("--stream", help="Kinesis stream (default: KEO_STREAM)")
    parser.add_argument("--table", help="DynamoDB ledger table (default: KEO_TABLE)")
    parser.add_argument("--dead-letter", help="directory for rejected and conflicting rows")
    parser.add_argument(
        "--trigger",
        default="available-now",
        help="'available-now' (process what is there, then stop) or 'processing-time=10s'",
    )
    parser.add_argument("--max-files-per-trigger", type=int, help="files per micro-batch")
    parser.add_argument("--master", help="Spark master (default: spark-submit's, else local[*])")
    parser.add_argument("--log-level", default="INFO", help="Python log level of the job")
    return parser.parse_args(argv)


def trigger_options(trigger: str) -> dict[str, Any]:
    if trigger == "available-now":
        return {"availableNow": True}
    name, _, interval = trigger.partition("=")
    if name == "processing-time" and interval:
        return {"processingTime": interval}
    raise ValueError(
        f"--trigger must be 'available-now' or 'processing-time=<interval>': {trigger}"
    )


def start_query(spark: Any, args: argparse.Namespace, sink: ExactlyOnceSink) -> Any:
    reader = spark.readStream.schema(EVENT_SCHEMA)
    if args.max_files_per_trigger is not None:
        reader = reader.option("maxFilesPerTrigger", args.max_files_per_trigger)
    return (
        reader.json(args.source)
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", args.checkpoint)
        .trigger(**trigger_options(args.trigger))
        .start()
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    trigger_options(args.trigger)  # reject a bad trigger before starting Spark
    sink = ExactlyOnceSink(
        settings_from_env(stream=args.stream, table=args.table),
        routing_key_column="routing_key",
        dead_letter_path=args.dead_letter,
    )
    spark = job_session(args.master, "keo-produce-stream")
    spark.sparkContext.setLogLevel("WARN")
    try:
        query = start_query(spark, args, sink)
        log.info("query started id=%s stream=%s", query.id, sink.stream)
        query.awaitTermination()
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
