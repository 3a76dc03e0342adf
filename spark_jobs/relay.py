"""A runnable Structured Streaming job: Kinesis stream A -> Spark -> Kinesis stream B, exactly
once end to end, with no DynamoDB write per record.

Example::

    python -m spark_jobs.relay --source orders-raw --target orders --table orders-ledger \\
        --checkpoint s3://bucket/checkpoints/orders-relay --query-name orders-relay

``spark.readStream.format("keo")`` reads A with its offsets in the query's checkpoint (a
replayed batch reads exactly the same records); ``writeStream.format("keo")`` writes B in
replay mode (``dedupe=replay``, the default here): a batch replayed after a crash sends only
what its first run did not deliver, and a batch already committed sends nothing. So every
record of A is in B once, as a multiset of key and data, however often the driver dies.
``--dedupe key`` delivers each key of A to B at most once instead (one ledger write per
record).

Both streams are reached with the ``KEO_*`` settings (endpoints, region, lease, timeouts), as
for ``keo send``. The master is ``local[*]`` unless one is set (``--master`` or
``spark-submit``). From code, :func:`start_relay` takes a ``transform`` of the DataFrame read
(its ``key`` and ``data`` columns are written, whatever else it has).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import spark_jobs
from producer.settings import Dedupe
from spark_jobs.job_runner import add_job_arguments, run_query_job, trigger_options
from spark_jobs.options import setting_options
from spark_jobs.writer import settings_from_env

Transform = Callable[[Any], Any]


def start_relay(
    spark: Any,
    *,
    settings: Mapping[str, str],
    source: str,
    target: str,
    checkpoint: str,
    query_name: str,
    dedupe: Dedupe = Dedupe.REPLAY,
    transform: Transform | None = None,
    trigger: str = "available-now",
    starting_position: str = "trim_horizon",
    max_records_per_trigger: int | None = None,
) -> Any:
    """Start the relay query: ``source`` read, ``transform``-ed, written to ``target``. The
    ``keo`` format must be registered on ``spark`` (:func:`spark_jobs.register`)."""
    options = setting_options(settings)
    read = {**options, "stream": source, "starting_position": starting_position}
    if max_records_per_trigger is not None:
        read["max_records_per_trigger"] = str(max_records_per_trigger)
    frame = spark.readStream.format("keo").options(**read).load()
    if transform is not None:
        frame = transform(frame)
    write = {**options, "stream": target, "dedupe": dedupe.value, "query_name": query_name}
    return (
        frame.select("key", "data")
        .writeStream.format("keo")
        .options(**write)
        .option("checkpointLocation", checkpoint)
        .queryName(query_name)
        .trigger(**trigger_options(trigger))
        .start()
    )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m spark_jobs.relay",
        description="Relay one Kinesis stream into another, exactly once end to end.",
    )
    parser.add_argument("--source", required=True, help="the Kinesis stream read (A)")
    parser.add_argument("--target", required=True, help="the Kinesis stream written (B)")
    parser.add_argument("--table", help="DynamoDB ledger table (default: KEO_TABLE)")
    parser.add_argument("--checkpoint", required=True, help="the query's checkpoint directory")
    parser.add_argument(
        "--query-name",
        required=True,
        help="the query's stable name: its batches are runs '<name>/<batch id>' in the "
        "ledger; a new checkpoint needs a new name",
    )
    parser.add_argument(
        "--dedupe",
        choices=[d.value for d in Dedupe],
        default=Dedupe.REPLAY.value,
        help="replay (default): each record of A in B once; key: each key once, ever",
    )
    add_job_arguments(parser, what="relay")
    parser.add_argument(
        "--starting-position",
        default="trim_horizon",
        help="where a new query starts reading A: trim_horizon, latest, or a time",
    )
    parser.add_argument("--max-records-per-trigger", type=int, help="records per micro-batch")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)

    def start(spark: Any) -> Any:
        spark_jobs.register(spark)
        return start_relay(
            spark,
            settings=settings_from_env(table=args.table),
            source=args.source,
            target=args.target,
            checkpoint=args.checkpoint,
            query_name=args.query_name,
            dedupe=Dedupe(args.dedupe),
            trigger=args.trigger,
            starting_position=args.starting_position,
            max_records_per_trigger=args.max_records_per_trigger,
        )

    return run_query_job(args, "keo-relay", start)


if __name__ == "__main__":
    sys.exit(main())
