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
import sys
from collections.abc import Sequence
from typing import Any

from spark_jobs.job_runner import add_job_arguments, run_query_job, trigger_options
from spark_jobs.sink import ExactlyOnceSink
from spark_jobs.writer import settings_from_env

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
    parser.add_argument("--max-files-per-trigger", type=int, help="files per micro-batch")
    add_job_arguments(parser, what="process")
    return parser.parse_args(argv)


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
    sink = ExactlyOnceSink(
        settings_from_env(stream=args.stream, table=args.table),
        routing_key_column="routing_key",
        dead_letter_path=args.dead_letter,
    )
    return run_query_job(args, "keo-produce-stream", lambda spark: start_query(spark, args, sink))


if __name__ == "__main__":
    sys.exit(main())
